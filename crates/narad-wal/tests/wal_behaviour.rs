//! Behaviour of the ingress WAL through its public API: appends, reads,
//! group commit, latch, recovery cases, checkpoint and compaction.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use narad_fs::{CrashMode, FaultKind, Fs, OpenMode, SimFs};
use narad_wal::frame::{
    FrameSeed, begin_frame, check_segment_header, seal_frame, segment_file_name, segment_header,
};
use narad_wal::{RecordRef, Wal, WalError, WalOptions};

mod common;

use common::{dir, small};

fn rec(payload: &[u8]) -> RecordRef<'_> {
    RecordRef {
        topic: "orders",
        incarnation: Some(3),
        key: None,
        partition: 1,
        accepted_at_ms: 1,
        payload,
    }
}

fn payloads(wal: &Wal, from: u64) -> Vec<(u64, Vec<u8>)> {
    let mut r = wal.reader(from);
    let mut out = Vec::new();
    while let Some(e) = r.next_entry().unwrap() {
        let d = e.decode().unwrap();
        out.push((d.seq, d.payload.to_vec()));
    }
    out
}

/// Without the zero runway: the recovery cases below write damage at the
/// end of a segment's file, which is where its frames end only without it
/// (`tests/runway.rs` covers the runway).
fn open(fs: &SimFs) -> Result<Wal, WalError> {
    Wal::open_with(fs.shared(), dir(), WalOptions { runway_bytes: 0, ..small() })
}

/// Appends `records` records of 3,000 bytes (several segments at the
/// tests' segment size), closes the WAL and returns its segment names.
fn write_segments(fs: &SimFs, records: usize) -> Vec<String> {
    let wal = open(fs).unwrap();
    let big = vec![1u8; 3000];
    for _ in 0..records {
        wal.append(&rec(&big)).unwrap();
    }
    drop(wal);
    fs.list_dir(&dir())
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n.ends_with(".wal"))
        .collect()
}

/// The seed the frames of the segment file at `path` are sealed with.
fn segment_seed(f: &dyn narad_fs::File, path: &Path) -> FrameSeed {
    let mut header = [0u8; 32];
    f.read_exact_at(&mut header, 0).unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    let base = narad_wal::frame::parse_segment_file_name(name).unwrap();
    check_segment_header(&header, base).unwrap().seed()
}

fn segment_path(base: u64) -> PathBuf {
    dir().join(segment_file_name(base))
}

/// Appends raw frames (one write) to a segment file, as a crash could have
/// left them: `frames` are (seq, write_index, payload).
fn append_raw_frames(fs: &SimFs, path: &Path, frames: &[(u64, u32, Vec<u8>)]) -> u64 {
    let f = fs.open(path, OpenMode::Existing).unwrap();
    let at = f.len().unwrap();
    let seed = segment_seed(&*f, path);
    let mut bytes = Vec::new();
    for (seq, widx, payload) in frames {
        let r = rec(payload);
        let start = begin_frame(&mut bytes, r.encoded_len().unwrap(), *seq, *widx);
        r.encode_into(&mut bytes);
        seal_frame(&mut bytes, start, seed);
    }
    f.write_all_at(&bytes, at).unwrap();
    f.sync_data().unwrap();
    at
}

#[test]
fn appends_are_readable_in_order_and_reopen_continues_the_sequence() {
    let fs = SimFs::new(1);
    let wal = open(&fs).unwrap();
    assert_eq!(wal.append(&rec(b"a")).unwrap(), 0);
    assert_eq!(wal.append_many(&[rec(b"b"), rec(b"c")]).unwrap(), 1..3);
    assert_eq!(wal.durable_next(), 3);
    wal.close().unwrap();
    drop(wal);
    let wal = open(&fs).unwrap();
    assert_eq!(wal.append(&rec(b"d")).unwrap(), 3);
    let got: Vec<Vec<u8>> = payloads(&wal, 0).into_iter().map(|(_, p)| p).collect();
    assert_eq!(got, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]);
    // Seeking into the middle works too.
    assert_eq!(payloads(&wal, 2)[0], (2, b"c".to_vec()));
}

#[test]
fn records_roll_across_segments_and_no_frame_spans_two() {
    let fs = SimFs::new(2);
    let wal = open(&fs).unwrap();
    let big = vec![7u8; 3000];
    for _ in 0..20 {
        wal.append(&rec(&big)).unwrap();
    }
    // A batch that overflows the active segment rolls it mid-batch.
    let batch: Vec<RecordRef<'_>> = (0..10).map(|_| rec(&big)).collect();
    assert_eq!(wal.append_many(&batch).unwrap(), 20..30);
    let (segments, _) = wal.disk_usage();
    assert!(segments >= 6, "{segments} segments");
    for e in fs.list_dir(&dir()).unwrap() {
        if e.name.ends_with(".wal") {
            assert!(fs.durable_len(&dir().join(&e.name)).unwrap() <= small().segment_bytes);
        }
    }
    let all = payloads(&wal, 0);
    assert_eq!(all.len(), 30);
    assert!(all.iter().enumerate().all(|(i, (s, p))| *s == i as u64 && p == &big));
    drop(wal);
    let wal = open(&fs).unwrap();
    assert_eq!(payloads(&wal, 17).len(), 13);
}

#[test]
fn oversized_records_are_refused_before_staging_anything() {
    let fs = SimFs::new(3);
    let wal = open(&fs).unwrap();
    let huge = vec![0u8; 5000];
    assert!(matches!(wal.append(&rec(&huge)), Err(WalError::Record(_))));
    // One bad record refuses the whole batch.
    assert!(matches!(wal.append_many(&[rec(b"ok"), rec(&huge)]), Err(WalError::Record(_))));
    assert_eq!(wal.append(&rec(b"next")).unwrap(), 0);
}

#[test]
fn a_failing_fill_withdraws_the_batch_and_gives_sequence_numbers_back() {
    let fs = SimFs::new(4);
    let wal = open(&fs).unwrap();
    wal.append(&rec(b"first")).unwrap();
    let r = wal.append_many_with_async(5, |i| {
        if i == 3 { Err(WalError::Closed) } else { Ok(rec(b"withdrawn")) }
    });
    assert!(r.is_err());
    assert_eq!(wal.append(&rec(b"second")).unwrap(), 1);
    let got: Vec<Vec<u8>> = payloads(&wal, 0).into_iter().map(|(_, p)| p).collect();
    assert_eq!(got, vec![b"first".to_vec(), b"second".to_vec()]);
}

struct ThreadWaker(std::thread::Thread);
impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

#[test]
fn async_appends_resolve_once_durable_and_listeners_hear_the_frontier() {
    let fs = SimFs::new(5);
    let wal = open(&fs).unwrap();
    let heard = Arc::new(AtomicU64::new(0));
    let h = heard.clone();
    wal.on_durable(Arc::new(move |next| h.store(next, Ordering::SeqCst)));
    let pending = wal.append_async(&rec(b"x")).unwrap();
    assert_eq!(block_on(pending).unwrap(), 0);
    assert!(fs.durable_len(&segment_path(0)).unwrap() > 32);
    assert_eq!(heard.load(Ordering::SeqCst), 1);
    assert!(wal.wait_durable(0, Duration::from_secs(5)));
    assert!(!wal.wait_durable(1, Duration::from_millis(20)));
}

#[test]
fn a_dropped_pending_append_still_becomes_durable() {
    let fs = SimFs::new(6);
    let wal = open(&fs).unwrap();
    drop(wal.append_async(&rec(b"abandoned")).unwrap());
    assert!(wal.wait_durable(0, Duration::from_secs(5)));
    assert_eq!(payloads(&wal, 0), vec![(0, b"abandoned".to_vec())]);
}

#[test]
fn an_fsync_failure_latches_every_later_append_and_reopen_recovers_acked_records() {
    let fs = SimFs::new(7);
    let wal = open(&fs).unwrap();
    for i in 0..5u8 {
        wal.append(&rec(&[i])).unwrap();
    }
    fs.inject(fs.op_count(), FaultKind::SyncError);
    let err = wal.append(&rec(b"lost")).unwrap_err();
    assert!(matches!(err, WalError::Latched { op: "fdatasync", .. }), "{err}");
    assert!(wal.is_latched());
    // Every later append fails fast with the same error, even though the
    // disk works again.
    for _ in 0..3 {
        let again = wal.append(&rec(b"later")).unwrap_err();
        assert_eq!(again.to_string(), err.to_string());
    }
    assert!(wal.append_many(&[rec(b"a"), rec(b"b")]).is_err());
    drop(wal);
    fs.crash(CrashMode::TornWithHoles);
    let wal = open(&fs).unwrap();
    assert!(!wal.is_latched());
    let got = payloads(&wal, 0);
    assert_eq!(got[..5], (0..5u8).map(|i| (u64::from(i), vec![i])).collect::<Vec<_>>()[..]);
    wal.append(&rec(b"works")).unwrap();
}

#[test]
fn a_full_disk_latches_with_enospc() {
    let fs = SimFs::new(8);
    let wal = open(&fs).unwrap();
    wal.append(&rec(b"kept")).unwrap();
    fs.set_capacity(Some(200));
    let err = wal.append(&rec(&[1u8; 2000])).unwrap_err();
    assert!(err.is_no_space(), "{err}");
    assert!(wal.is_latched());
    fs.set_capacity(None);
    assert!(wal.append(&rec(b"x")).unwrap_err().is_no_space());
    drop(wal);
    let wal = open(&fs).unwrap();
    assert_eq!(payloads(&wal, 0)[0], (0, b"kept".to_vec()));
}

#[test]
fn torn_tail_of_last_segment_is_truncated() {
    let fs = SimFs::new(9);
    let wal = open(&fs).unwrap();
    wal.append_many(&[rec(b"a"), rec(b"b")]).unwrap();
    drop(wal);
    // Half a frame header at the end: a write cut short.
    let f = fs.open(&segment_path(0), OpenMode::Existing).unwrap();
    let len = f.len().unwrap();
    f.write_all_at(b"NWAL\0\0", len).unwrap();
    f.sync_data().unwrap();
    let wal = open(&fs).unwrap();
    assert_eq!(payloads(&wal, 0).len(), 2);
    assert_eq!(fs.durable_len(&segment_path(0)), Some(len));
    assert_eq!(wal.append(&rec(b"c")).unwrap(), 2);
}

#[test]
fn a_hole_in_a_write_with_valid_frames_of_the_same_write_behind_it_is_a_torn_tail() {
    let fs = SimFs::new(10);
    let wal = open(&fs).unwrap();
    wal.append(&rec(b"acked")).unwrap();
    drop(wal);
    // One write of three frames (write indexes 0, 1, 2) whose first frame
    // lost a sector: what a power cut during writeback can leave.
    let at = append_raw_frames(
        &fs,
        &segment_path(0),
        &[(1, 0, b"x".to_vec()), (2, 1, b"y".to_vec()), (3, 2, b"z".to_vec())],
    );
    fs.poke(&segment_path(0), at + 30, &[0; 8]).unwrap();
    let wal = open(&fs).unwrap();
    assert_eq!(payloads(&wal, 0), vec![(0, b"acked".to_vec())]);
    assert_eq!(fs.durable_len(&segment_path(0)), Some(at));
}

#[test]
fn damage_followed_by_a_later_write_fails_open_naming_file_and_offset() {
    let fs = SimFs::new(11);
    let wal = open(&fs).unwrap();
    wal.append(&rec(b"first write")).unwrap();
    wal.append(&rec(b"second write")).unwrap();
    drop(wal);
    let first_frame = 32;
    fs.poke(&segment_path(0), first_frame + 30, b"!").unwrap();
    let err = open(&fs).unwrap_err();
    match &err {
        WalError::Corrupt { path, offset, .. } => {
            assert_eq!(path, &segment_path(0));
            assert_eq!(*offset, first_frame);
        }
        other => panic!("expected corruption, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("00000000000000000000.wal") && msg.contains("offset 32"), "{msg}");
}

#[test]
fn damage_in_a_sealed_segment_fails_open() {
    let fs = SimFs::new(12);
    let wal = open(&fs).unwrap();
    let big = vec![1u8; 3000];
    for _ in 0..8 {
        wal.append(&rec(&big)).unwrap();
    }
    assert!(wal.disk_usage().0 >= 2);
    drop(wal);
    // The tail of the first (sealed) segment: damage there is never a tear.
    let len = fs.durable_len(&segment_path(0)).unwrap();
    fs.poke(&segment_path(0), len - 10, b"!!").unwrap();
    match open(&fs).unwrap_err() {
        WalError::Corrupt { path, .. } => assert_eq!(path, segment_path(0)),
        other => panic!("expected corruption, got {other}"),
    }
}

#[test]
fn a_valid_frame_with_the_wrong_sequence_number_fails_open() {
    let fs = SimFs::new(13);
    let wal = open(&fs).unwrap();
    wal.append(&rec(b"a")).unwrap();
    drop(wal);
    append_raw_frames(&fs, &segment_path(0), &[(5, 0, b"stray".to_vec())]);
    assert!(matches!(open(&fs), Err(WalError::Corrupt { .. })));
}

#[test]
fn a_torn_header_of_a_new_last_segment_is_rewritten() {
    let fs = SimFs::new(14);
    let wal = open(&fs).unwrap();
    wal.append(&rec(b"a")).unwrap();
    drop(wal);
    // The roll created the next segment, but its header never became durable.
    let f = fs.open(&segment_path(1), OpenMode::CreateNew).unwrap();
    f.write_all_at(&segment_header(1, 77)[..10], 0).unwrap();
    f.sync_data().unwrap();
    let wal = open(&fs).unwrap();
    assert_eq!(wal.append(&rec(b"b")).unwrap(), 1);
    drop(wal);
    let wal = open(&fs).unwrap();
    assert_eq!(payloads(&wal, 0).len(), 2);
}

#[test]
fn a_missing_middle_segment_fails_open() {
    let fs = SimFs::new(15);
    let names = write_segments(&fs, 16);
    assert!(names.len() >= 3);
    fs.remove_file(&dir().join(&names[1])).unwrap();
    assert!(matches!(open(&fs), Err(WalError::Corrupt { .. })));
}

#[test]
fn checkpoint_is_synced_lazily_and_survives_a_restart() {
    let fs = SimFs::new(16);
    let wal = open(&fs).unwrap();
    wal.append_many(&[rec(b"a"), rec(b"b"), rec(b"c")]).unwrap();
    assert!(matches!(
        wal.store_checkpoint(4),
        Err(WalError::CheckpointBeyondEnd { requested: 4, durable_next: 3 })
    ));
    wal.store_checkpoint(2).unwrap();
    assert_eq!(wal.checkpoint(), 2);
    assert_eq!(wal.dispatch_backlog(), 1);
    // Stored in place at once, durable within the flush delay.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while wal.synced_checkpoint() < 2 {
        assert!(std::time::Instant::now() < deadline, "checkpoint never synced");
        std::thread::sleep(Duration::from_millis(5));
    }
    wal.store_checkpoint(1).unwrap(); // lower values are ignored
    assert_eq!(wal.checkpoint(), 2);
    drop(wal);
    fs.crash(CrashMode::DropUnsynced);
    let wal = open(&fs).unwrap();
    assert_eq!(wal.checkpoint(), 2);
    assert_eq!(payloads(&wal, wal.checkpoint()), vec![(2, b"c".to_vec())]);
}

/// A checkpoint past the WAL's end means records that were dispatched are
/// gone from the WAL (damage, or a recovery that cut too much): the WAL
/// opens with the checkpoint lowered to its end, so the sequence numbers it
/// hands out again are dispatched, never skipped as "already dispatched".
#[test]
fn a_checkpoint_beyond_the_end_of_the_wal_is_lowered_to_the_end_and_the_wal_opens() {
    let fs = SimFs::new(17);
    let wal = open(&fs).unwrap();
    wal.append(&rec(b"a")).unwrap();
    drop(wal);
    narad_fs::write_file_atomic(
        &fs,
        &dir().join("checkpoint"),
        &narad_wal::checkpoint::encode_file(9),
    )
    .unwrap();
    let wal = open(&fs).unwrap_or_else(|e| panic!("refused to open: {e}"));
    assert_eq!((wal.checkpoint(), wal.durable_next()), (1, 1));
    assert_eq!(wal.append(&rec(b"b")).unwrap(), 1);
    assert_eq!(payloads(&wal, wal.checkpoint()), vec![(1, b"b".to_vec())]);
    drop(wal);
    // The lowered value is what the file holds now.
    let wal = open(&fs).unwrap();
    assert_eq!(wal.checkpoint(), 1);
}

#[test]
fn a_checkpoint_below_the_oldest_segment_starts_dispatch_at_that_segment() {
    let fs = SimFs::new(18);
    let names = write_segments(&fs, 12);
    // As if compaction's deletions survived a power cut that lost the
    // checkpoint's last write.
    fs.remove_file(&dir().join(&names[0])).unwrap();
    let second: u64 = names[1].trim_end_matches(".wal").parse().unwrap();
    let wal = open(&fs).unwrap();
    assert_eq!(wal.checkpoint(), second);
    assert_eq!(payloads(&wal, wal.checkpoint()).first().map(|p| p.0), Some(second));
}

#[test]
fn compaction_only_deletes_segments_behind_a_synced_checkpoint() {
    let fs = SimFs::new(19);
    let wal = open(&fs).unwrap();
    let big = vec![1u8; 3000];
    for _ in 0..20 {
        wal.append(&rec(&big)).unwrap();
    }
    let (before, _) = wal.disk_usage();
    wal.store_checkpoint(15).unwrap();
    wal.compact_now();
    if wal.synced_checkpoint() < 15 {
        // Stored but not synced yet: nothing may go.
        assert_eq!(wal.disk_usage().0, before);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while wal.oldest_seq() == 0 {
        assert!(std::time::Instant::now() < deadline, "compaction never ran");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(wal.oldest_seq() <= 15);
    assert!(wal.disk_usage().0 < before);
    assert!(matches!(wal.reader(0).next_entry(), Err(WalError::Compacted { .. })));
    assert_eq!(payloads(&wal, 15).len(), 5);
}

/// A segment unlinked whose directory sync then failed is gone from the
/// directory but maybe not from the disk: the next pass finds it missing,
/// syncs the directory and goes on; compaction never stops for good.
#[test]
fn compaction_resumes_after_a_failed_directory_sync_of_an_unlink() {
    let fs = SimFs::new(22);
    let wal = Wal::open_with(
        fs.shared(),
        dir(),
        WalOptions { runway_bytes: 0, compaction_interval: Duration::from_secs(3600), ..small() },
    )
    .unwrap();
    let big = vec![1u8; 3000];
    for _ in 0..20 {
        wal.append(&rec(&big)).unwrap();
    }
    let (before, _) = wal.disk_usage();
    assert!(before >= 4, "{before} segments");
    wal.store_checkpoint(20).unwrap();
    fs.inject(fs.op_count(), FaultKind::DirSyncError);
    let _ = wal.sync_checkpoint_now();
    let after_fault = wal.disk_usage().0;
    assert!(after_fault > 1, "the failed unlink stopped that pass");
    wal.compact_now();
    wal.compact_now();
    assert_eq!(wal.disk_usage().0, 1, "compaction resumed behind the checkpoint");
    assert_eq!(wal.oldest_seq(), 20);
    // Every unlink is durable: a crash brings no compacted segment back.
    drop(wal);
    fs.crash(CrashMode::DropUnsynced);
    let wal = open(&fs).unwrap();
    assert_eq!((wal.oldest_seq(), wal.checkpoint(), wal.disk_usage().0), (20, 20, 1));
}

#[test]
fn a_fully_dispatched_active_segment_is_rotated_and_reclaimed() {
    let fs = SimFs::new(20);
    let wal = open(&fs).unwrap();
    let big = vec![1u8; 3000];
    for _ in 0..3 {
        wal.append(&rec(&big)).unwrap();
    }
    wal.store_checkpoint(3).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while wal.oldest_seq() != 3 || wal.disk_usage().0 != 1 {
        assert!(std::time::Instant::now() < deadline, "active segment never reclaimed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (_, bytes) = wal.disk_usage();
    assert!(bytes <= 64, "{bytes} bytes left");
    assert_eq!(wal.append(&rec(b"next")).unwrap(), 3);
    drop(wal);
    let wal = open(&fs).unwrap();
    assert_eq!(payloads(&wal, 3), vec![(3, b"next".to_vec())]);
}

#[test]
fn appends_after_close_are_refused() {
    let fs = SimFs::new(21);
    let wal = open(&fs).unwrap();
    wal.close().unwrap();
    assert!(matches!(wal.append(&rec(b"late")), Err(WalError::Closed)));
}
