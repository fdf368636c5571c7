//! 64 concurrent appenders on the real file system: every acked record is
//! recovered after reopen, at its sequence number, in each appender's order,
//! and group commit shares fsyncs between them.

use std::collections::HashMap;
use std::sync::Arc;

use narad_fs::RealFs;
use narad_wal::{RecordRef, Wal};

#[test]
fn sixty_four_concurrent_appenders_recover_every_acked_record_in_order() {
    let dir = std::env::temp_dir().join(format!("narad-wal-concurrent-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let wal = Arc::new(Wal::open(RealFs::shared(), &dir).unwrap());
    let per_thread = 40u32;
    let handles: Vec<_> = (0..64u32)
        .map(|t| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for n in 0..per_thread {
                    let payload = format!("{t}:{n}");
                    let key = t.to_string();
                    let rec = RecordRef {
                        topic: "load",
                        incarnation: Some(1),
                        key: Some(key.as_bytes()),
                        partition: t % 3,
                        accepted_at_ms: 0,
                        payload: payload.as_bytes(),
                    };
                    let seq = if n % 5 == 4 {
                        let batch = [rec, rec];
                        wal.append_many(&batch).unwrap().start
                    } else {
                        wal.append(&rec).unwrap()
                    };
                    acked.push((seq, payload));
                }
                acked
            })
        })
        .collect();
    let acked: Vec<(u64, String)> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let stats = wal.stats();
    wal.close().unwrap();
    drop(wal);
    assert!(
        stats.syncs < stats.records / 2,
        "group commit shared nothing: {} syncs for {} records",
        stats.syncs,
        stats.records
    );

    let wal = Wal::open(RealFs::shared(), &dir).unwrap();
    let mut found = HashMap::new();
    let mut reader = wal.reader(0);
    while let Some(e) = reader.next_entry().unwrap() {
        let r = e.decode().unwrap();
        found.insert(r.seq, String::from_utf8(r.payload.to_vec()).unwrap());
    }
    let expected_records = 64 * (per_thread as usize + (per_thread as usize / 5));
    assert_eq!(found.len(), expected_records);
    for (seq, payload) in &acked {
        assert_eq!(found.get(seq), Some(payload), "acked seq {seq} missing after reopen");
    }
    // Each appender's records appear in the order it appended them.
    let mut last: HashMap<&str, (u64, u32)> = HashMap::new();
    for (seq, payload) in &acked {
        let (t, n) = payload.split_once(':').unwrap();
        let n: u32 = n.parse().unwrap();
        if let Some((s, m)) = last.insert(t, (*seq, n)) {
            assert!(*seq > s && n > m);
        }
    }
    drop(wal);
    std::fs::remove_dir_all(&dir).unwrap();
}
