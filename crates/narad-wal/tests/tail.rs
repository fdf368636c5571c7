//! The in-memory tail of the latest group commits: a reader at the durable
//! frontier takes its bytes from memory, and gets exactly the records a
//! reader of the files gets (after a restart, or below the checkpoint).

use narad_fs::SimFs;
use narad_wal::{RecordRef, Wal};

mod common;

use common::{dir, drain, payloads, rec, small};

/// Payload `n`: 40 to 1,000 bytes, so groups and segment rolls vary.
fn payload(n: usize) -> Vec<u8> {
    format!("{n:05}").into_bytes().repeat(8 + n * 37 % 192)
}

/// Appends 300 records in groups of 1 to 7 (rolling the small segments many
/// times) with a reader following the frontier; returns what it read.
fn append_and_follow(wal: &Wal) -> Vec<(u64, Vec<u8>)> {
    let mut reader = wal.reader(0);
    let mut read = Vec::new();
    let mut n = 0;
    while n < 300 {
        let group: Vec<Vec<u8>> = (n..(n + 1 + n % 7).min(300)).map(payload).collect();
        n += group.len();
        let recs: Vec<RecordRef<'_>> = group.iter().map(|p| rec(p)).collect();
        wal.append_many(&recs).unwrap();
        read.extend(drain(&mut reader));
    }
    read
}

#[test]
fn a_reader_following_the_frontier_reads_only_memory_and_gets_what_the_files_hold() {
    let fs = SimFs::new(11);
    let wal = Wal::open_with(fs.shared(), dir(), small()).unwrap();
    let followed = append_and_follow(&wal);
    assert_eq!(followed.len(), 300);
    assert!(wal.stats().segments_compacted == 0 && wal.oldest_seq() == 0);
    let stats = wal.stats();
    assert_eq!(stats.read_disk_bytes, 0, "nothing was read back from the files");
    assert!(stats.read_memory_bytes >= stats.bytes, "{stats:?}");

    // The files hold the same records: a restart starts with an empty tail.
    wal.close().unwrap();
    drop(wal);
    let wal = Wal::open_with(fs.shared(), dir(), small()).unwrap();
    assert_eq!(payloads(&wal), followed);
    assert_eq!(wal.stats().read_memory_bytes, 0);
    assert!(wal.stats().read_disk_bytes > 0);
}

#[test]
fn records_below_the_stored_checkpoint_leave_memory_and_are_read_from_the_files() {
    let fs = SimFs::new(12);
    let wal = Wal::open_with(fs.shared(), dir(), small()).unwrap();
    let followed = append_and_follow(&wal);
    // The first two groups (sequence numbers 0, 1 and 2) are below it; the
    // first segment holds records above it too, so it is not compacted.
    wal.store_checkpoint(3).unwrap();
    let before = wal.stats();
    assert_eq!(before.read_disk_bytes, 0);

    assert_eq!(drain(&mut wal.reader(0)), followed);
    let after = wal.stats();
    assert!(after.read_disk_bytes > 0, "the released groups came from the file");
    assert!(after.read_memory_bytes > before.read_memory_bytes, "the rest came from memory");
}
