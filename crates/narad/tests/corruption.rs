//! Damage on disk: corruption of acked data stops the start with a message
//! naming the file and the offset (never a silent truncation); a torn tail
//! is truncated and everything before it is served.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::Server;
use serde_json::json;

fn files_with_suffix(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    out.sort();
    out
}

fn flip(path: &Path, offset: u64) {
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0xA5;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
    f.sync_all().unwrap();
}

fn append(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

/// Starts narad on `data` and expects it to refuse; returns its stderr.
fn refuses_to_start(data: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["serve", "--dev", "--addr", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .output()
        .unwrap();
    assert!(!out.status.success(), "narad started on damaged data");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn damage_in_the_middle_of_the_wal_stops_the_start_naming_file_and_offset() {
    let mut s = Server::start("walrot");
    s.create_topic(r#"{"name":"w"}"#);
    for i in 0..10 {
        assert_eq!(s.produce("w", "", format!("message {i}").as_bytes()), 202);
    }
    s.kill9();
    let wal = s.data_dir.join("ingress/produce");
    let seg = files_with_suffix(&wal, ".wal").pop().unwrap();
    // Inside the first frame (header 32 bytes, frame header 24): acked data
    // with later writes behind it.
    flip(&seg, 32 + 24 + 3);
    let err = refuses_to_start(&s.data_dir);
    let name = seg.file_name().unwrap().to_string_lossy().into_owned();
    assert!(err.contains(&name) && err.contains("offset 32"), "{err}");
}

#[test]
fn damage_in_a_sealed_partition_segment_stops_the_start_naming_file_and_offset() {
    let mut s = Server::start("segrot");
    s.create_topic(r#"{"name":"big","partitions":3}"#);
    // 70 MiB into partition 0: the first 64 MiB segment is sealed.
    let payload = "x".repeat(14 << 10);
    for _ in 0..5 {
        let msgs: Vec<_> = (0..1000).map(|_| json!({"payload": payload, "partition": 0})).collect();
        let r = s.post("/v1/topics/big/produce/batch", json!({"messages": msgs}).to_string());
        assert_eq!(r.status(), 202);
    }
    let p0 = s.data_dir.join("topics/big/p00000");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while files_with_suffix(&p0, ".log").len() < 2 {
        assert!(std::time::Instant::now() < deadline, "the log never rolled");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    s.kill9();
    let sealed = files_with_suffix(&p0, ".log").remove(0);
    let middle = std::fs::metadata(&sealed).unwrap().len() / 2;
    flip(&sealed, middle);
    let err = refuses_to_start(&s.data_dir);
    let name = sealed.file_name().unwrap().to_string_lossy().into_owned();
    assert!(err.contains(&name), "{err}");
    assert!(err.contains("byte") || err.contains("offset"), "{err}");
}

#[test]
fn torn_tails_are_truncated_and_everything_before_them_is_served() {
    let mut s = Server::start("torn");
    s.create_topic(r#"{"name":"t"}"#);
    for i in 0..20 {
        assert_eq!(s.produce("t", "partition=1", format!("m{i}").as_bytes()), 202);
    }
    // Let the dispatcher commit them, then crash.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let d: serde_json::Value =
            serde_json::from_str(&s.get("/v1/topics/t?partition=1").text().unwrap()).unwrap();
        if d["partition_stats"][0]["high_watermark"] == 20 {
            break;
        }
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    s.kill9();
    // Half-written frames at the end of the WAL and of the partition log.
    let wal_seg = files_with_suffix(&s.data_dir.join("ingress/produce"), ".wal").pop().unwrap();
    append(&wal_seg, b"NWAL\x00\x00\x00\x40\x00\x00");
    let log_seg = files_with_suffix(&s.data_dir.join("topics/t/p00001"), ".log").pop().unwrap();
    append(&log_seg, &[0xCA, 0xFE, 0x00, 0x00, 0x00, 0x00, 0x01]);
    s.restart();
    let got = s.drain("t");
    assert!(got.len() >= 20, "{} served", got.len());
    for i in 0..20 {
        assert!(got.contains(&format!("m{i}").into_bytes()), "m{i} missing");
    }
    assert!(s.log().contains("trunc"), "the truncation is logged");
}

/// A payload whose last 16 bytes are a WAL preparation trailer naming the
/// offset where they land: its record is the first of a fresh segment and,
/// over an eighth of the zero runway, its group ends the file. Recovery
/// must not take those bytes for a trailer (issue 20): after a kill -9
/// (before or after dispatch, whichever came first) the node starts and
/// the message is delivered.
#[test]
fn a_payload_ending_in_a_forged_wal_trailer_survives_a_restart() {
    let mut s = Server::start("forged");
    s.create_topic(r#"{"name":"f","partitions":3}"#);
    let mut payload = vec![b'x'; 80 << 10];
    let rec = narad_wal::RecordRef {
        topic: "f",
        incarnation: Some(1),
        key: None,
        partition: 0,
        accepted_at_ms: 0,
        payload: &payload,
    };
    let frame_end = 32 + 24 + u64::from(rec.encoded_len().unwrap());
    let trailer = narad_wal::prep::trailer((frame_end - 16) as u32);
    let n = payload.len();
    payload[n - 16..].copy_from_slice(&trailer);
    assert_eq!(s.produce("f", "", &payload), 202);
    s.kill9();
    let wal = s.data_dir.join("ingress/produce");
    let seg = files_with_suffix(&wal, ".wal").pop().unwrap();
    let on_disk = std::fs::read(&seg).unwrap();
    assert_eq!(on_disk.len() as u64, frame_end, "the record's frame ends the file");
    assert!(on_disk.ends_with(&trailer));
    s.restart();
    let got = s.drain("f");
    assert_eq!(got.len(), 1, "the acked message is delivered once");
    assert!(got[0] == payload, "the payload comes back byte for byte");
}
