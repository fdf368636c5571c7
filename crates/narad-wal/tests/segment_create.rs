//! A roll whose new segment cannot be created (the process is out of file
//! descriptors) fails that group commit without latching the WAL: nothing
//! was written, so the next append retries the roll. A failure once bytes
//! may have reached the new file still latches.

use narad_fs::{CrashMode, FaultKind, SimFs};
use narad_wal::{Wal, WalError, WalOptions};

mod common;

use common::{dir, payloads, rec, small};

fn open(fs: &SimFs) -> Wal {
    Wal::open_with(fs.shared(), dir(), WalOptions { runway_bytes: 0, ..small() }).unwrap()
}

/// Appends 3,000-byte records until the next one needs a new segment;
/// returns the acked records.
fn fill_first_segment(wal: &Wal) -> Vec<(u64, Vec<u8>)> {
    let mut acked = Vec::new();
    for i in 0..5u8 {
        let payload = vec![i; 3000];
        let seq = wal.append(&rec(&payload)).unwrap();
        acked.push((seq, payload));
    }
    acked
}

#[test]
fn a_segment_that_cannot_be_created_fails_the_append_without_latching() {
    let fs = SimFs::new(21);
    let wal = open(&fs);
    let mut acked = fill_first_segment(&wal);
    fs.inject(fs.op_count(), FaultKind::TooManyFiles);
    let err = wal.append(&rec(&[9u8; 3000])).unwrap_err();
    assert!(matches!(err, WalError::SegmentUnavailable { .. }), "{err}");
    assert!(err.is_retriable(), "{err}");
    assert!(!wal.is_latched(), "a create that wrote nothing latched the WAL: {err}");
    // The next append rolls again, into the same sequence number.
    let payload = vec![7u8; 3000];
    let seq = wal.append(&rec(&payload)).unwrap();
    assert_eq!(seq, acked.last().unwrap().0 + 1, "sequence numbers stay dense");
    acked.push((seq, payload));
    for i in 0..3u8 {
        let payload = vec![i; 100];
        acked.push((wal.append(&rec(&payload)).unwrap(), payload));
    }
    assert_eq!(payloads(&wal), acked);
    drop(wal);
    fs.crash(CrashMode::TornWithHoles);
    let wal = open(&fs);
    assert_eq!(payloads(&wal), acked);
}

#[test]
fn a_failed_write_to_a_new_segment_still_latches() {
    let fs = SimFs::new(22);
    let wal = open(&fs);
    let acked = fill_first_segment(&wal);
    fs.inject(fs.op_count(), FaultKind::WriteError);
    let err = wal.append(&rec(&[9u8; 3000])).unwrap_err();
    assert!(matches!(err, WalError::Latched { .. }), "{err}");
    assert!(!err.is_retriable());
    assert!(wal.is_latched());
    assert!(wal.append(&rec(b"x")).is_err());
    drop(wal);
    fs.crash(CrashMode::TornWithHoles);
    let wal = open(&fs);
    assert_eq!(payloads(&wal)[..acked.len()], acked[..]);
}
