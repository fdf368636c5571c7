//! Payloads a client chose to look like our own formats: recovery never
//! reads a client's bytes as a preparation trailer, a frame or a runway.
//!
//! A record's payload is its last field, so when a write group ends the
//! file (a group over an eighth of the zero runway on a fresh segment, or a
//! record longer than the runway), the file's last bytes are the client's.

use narad_fs::{CrashMode, SimFs};
use narad_wal::limits::{FRAME_HEADER_BYTES, RUNWAY_BYTES, SEGMENT_HEADER_BYTES};
use narad_wal::{Wal, WalOptions, prep, runway_group_max};

mod common;

use common::{dir, payloads, rec, segments};

/// Production sizes (64 MiB segments, 512 KiB runway, no preparation), with
/// a 1 MiB record limit so the test stays fast.
fn options() -> WalOptions {
    WalOptions { max_record_bytes: 1 << 20, ..WalOptions::default() }
}

/// A payload of `len` bytes whose last 16 bytes are a valid preparation
/// trailer naming the offset where they land when its record's frame is the
/// first of a fresh segment and ends the file.
fn forged(len: usize) -> Vec<u8> {
    let mut p = vec![0x5au8; len];
    let enc = u64::from(rec(&p).encoded_len().unwrap());
    let file_len = SEGMENT_HEADER_BYTES + FRAME_HEADER_BYTES + enc;
    let limit = file_len - prep::PREP_TRAILER_BYTES;
    let trailer = prep::trailer(u32::try_from(limit).unwrap());
    p[len - trailer.len()..].copy_from_slice(&trailer);
    p
}

/// (sequence number, length) of every record the WAL holds, and whether
/// their bytes are `want`'s.
fn held(wal: &Wal, want: &[(u64, Vec<u8>)]) -> (Vec<(u64, usize)>, bool) {
    let got = payloads(wal);
    (got.iter().map(|(s, p)| (*s, p.len())).collect(), got == want)
}

fn reopen_after(fs: &SimFs, wal: Wal, mode: CrashMode) -> Wal {
    drop(wal);
    fs.crash(mode);
    Wal::open_with(fs.shared(), dir(), options()).unwrap_or_else(|e| panic!("reopen: {e}"))
}

#[test]
fn a_forged_trailer_ending_a_fresh_segment_does_not_cut_its_acked_record() {
    let fs = SimFs::new(1);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    // One record, one group, over the size that tops up the runway.
    let p = forged(runway_group_max(RUNWAY_BYTES) as usize + 4096);
    assert_eq!(wal.append(&rec(&p)).unwrap(), 0);
    let (_, image) = segments(&fs).pop().unwrap();
    assert!(image.ends_with(&p[p.len() - 16..]), "the client's bytes end the file");
    assert!(prep::prepared_limit(&image).is_some(), "the forged trailer is well formed");
    // kill -9 before the record was dispatched: it must still be there.
    let wal = reopen_after(&fs, wal, CrashMode::DropUnsynced);
    assert_eq!(held(&wal, &[(0, p.clone())]), (vec![(0, p.len())], true));
    // Dispatched, then a restart: the checkpoint is within the WAL.
    wal.store_checkpoint(1).unwrap();
    wal.sync_checkpoint_now().unwrap();
    let wal = reopen_after(&fs, wal, CrashMode::DropUnsynced);
    assert_eq!(wal.checkpoint(), 1);
    assert_eq!(wal.durable_next(), 1);
    assert_eq!(wal.append(&rec(b"next")).unwrap(), 1);
}

#[test]
fn a_forged_trailer_ending_a_record_longer_than_the_runway_after_a_rotation_survives() {
    let fs = SimFs::new(2);
    let opts = WalOptions { rotate_dispatched_active_bytes: 4 << 10, ..options() };
    let wal = Wal::open_with(fs.shared(), dir(), opts).unwrap();
    // Dispatch a first segment over the rotation size: it is rotated, and
    // the new segment starts with a full runway of zeros.
    let filler = vec![1u8; 8 << 10];
    wal.append(&rec(&filler)).unwrap();
    wal.store_checkpoint(1).unwrap();
    wal.sync_checkpoint_now().unwrap();
    let (base, image) = segments(&fs).pop().unwrap();
    assert_eq!(base, 1, "the dispatched segment was rotated");
    assert_eq!(image.len() as u64, SEGMENT_HEADER_BYTES + RUNWAY_BYTES, "runway after rotation");
    // A record longer than the runway: its frame ends the file.
    let p = forged(RUNWAY_BYTES as usize + 4096);
    assert_eq!(wal.append(&rec(&p)).unwrap(), 1);
    let (_, image) = segments(&fs).pop().unwrap();
    assert!(prep::prepared_limit(&image).is_some(), "the forged trailer ends the file");
    let wal = reopen_after(&fs, wal, CrashMode::TornWithHoles);
    assert_eq!(held(&wal, &[(1, p.clone())]), (vec![(1, p.len())], true));
}
