//! Payloads a client chose to look like our own formats: recovery never
//! reads a client's bytes as a preparation trailer, a frame or a runway.
//!
//! A record's payload is its last field, so when a write group ends the
//! file (a group over an eighth of the zero runway on a fresh segment, or a
//! record longer than the runway), the file's last bytes are the client's.

use narad_fs::{CrashMode, SimFs};
use narad_wal::frame::FrameSeed;
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

/// A frame of our format holding record `rec(b"forged")` as sequence number
/// `seq`, the first of its write, sealed the way a client could seal it:
/// with the public encoder and a `guess` at the salt of the segment it will
/// land in.
fn forged_frame(seq: u64, guess: FrameSeed) -> Vec<u8> {
    let r = rec(b"forged");
    let mut out = Vec::new();
    let at = narad_wal::frame::begin_frame(&mut out, r.encoded_len().unwrap(), seq, 0);
    r.encode_into(&mut out);
    narad_wal::frame::seal_frame(&mut out, at, guess);
    out
}

/// Overwrites `len` bytes at `offset` of segment `base` with zeros: the
/// sectors of a torn write that never reached the disk.
fn zero(fs: &SimFs, base: u64, offset: u64, len: usize) {
    use narad_fs::{Fs, OpenMode};
    let path = dir().join(narad_wal::frame::segment_file_name(base));
    let f = fs.open(&path, OpenMode::Existing).unwrap();
    f.write_all_at(&vec![0u8; len], offset).unwrap();
    f.sync_data().unwrap();
}

/// Where the second frame of a segment starts, the first holding `first`.
fn second_frame_at(first: &[u8]) -> u64 {
    SEGMENT_HEADER_BYTES + FRAME_HEADER_BYTES + u64::from(rec(first).encoded_len().unwrap())
}

#[test]
fn a_torn_write_carrying_a_forged_frame_of_a_later_write_is_cut_at_the_tear() {
    let fs = SimFs::new(3);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    assert_eq!(wal.append(&rec(b"acked")).unwrap(), 0);
    // The next write's payload carries well-formed frames claiming a later
    // write (sequence 7), sealed with no salt and with a guessed one, then
    // more bytes.
    let mut p = vec![0x33u8; 300];
    p.extend_from_slice(&forged_frame(7, FrameSeed::UNSALTED));
    p.extend_from_slice(&forged_frame(7, FrameSeed::of_salt(0)));
    p.extend_from_slice(&[0x33u8; 300]);
    assert_eq!(wal.append(&rec(&p)).unwrap(), 1);
    drop(wal);
    // The crash tore that write: its last sectors never reached the disk,
    // the forged frame in its middle did. The write was never acked.
    let at = second_frame_at(b"acked");
    let end = at + FRAME_HEADER_BYTES + u64::from(rec(&p).encoded_len().unwrap());
    zero(&fs, 0, end - 200, 200);
    let wal = Wal::open_with(fs.shared(), dir(), options())
        .unwrap_or_else(|e| panic!("a torn, never-acked tail must be cut: {e}"));
    assert_eq!(held(&wal, &[(0, b"acked".to_vec())]), (vec![(0, 5)], true));
    assert_eq!(wal.append(&rec(b"after")).unwrap(), 1, "the tear's sequence number is reused");
}

#[test]
fn acked_data_damaged_with_a_valid_frame_of_a_later_write_behind_it_refuses_to_open() {
    let fs = SimFs::new(4);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    assert_eq!(wal.append(&rec(b"first, acked")).unwrap(), 0);
    assert_eq!(wal.append(&rec(b"second, acked")).unwrap(), 1);
    drop(wal);
    // Bit rot in the first record; the second write's frame proves the
    // first was synced (and acked).
    zero(&fs, 0, second_frame_at(b"first, acked") - 3, 3);
    let err = Wal::open_with(fs.shared(), dir(), options()).map(|_| ()).unwrap_err();
    assert!(
        matches!(err, narad_wal::WalError::Corrupt { offset, .. } if offset == SEGMENT_HEADER_BYTES),
        "{err}"
    );
}

/// Writes segment 0 as an older binary left it: a version 1 (unsalted)
/// header and unsalted frames of `payloads`, one write each.
fn write_version_1_segment(fs: &SimFs, payloads: &[&[u8]]) -> Vec<u8> {
    use narad_fs::{Fs, OpenMode};
    let mut image = narad_wal::frame::segment_header_unsalted(0, 0).to_vec();
    for (seq, p) in payloads.iter().enumerate() {
        let r = rec(p);
        let at = narad_wal::frame::begin_frame(&mut image, r.encoded_len().unwrap(), seq as u64, 0);
        r.encode_into(&mut image);
        narad_wal::frame::seal_frame(&mut image, at, FrameSeed::UNSALTED);
    }
    fs.create_dir_all(&dir()).unwrap();
    let f = fs.open(&dir().join(narad_wal::frame::segment_file_name(0)), OpenMode::CreateNew);
    let f = f.unwrap();
    f.write_all_at(&image, 0).unwrap();
    f.sync_data().unwrap();
    image
}

#[test]
fn a_version_1_segment_is_read_and_sealed_and_new_frames_go_to_a_salted_segment() {
    let fs = SimFs::new(5);
    let old = write_version_1_segment(&fs, &[b"old zero", b"old one"]);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    let want = vec![(0, b"old zero".to_vec()), (1, b"old one".to_vec())];
    assert_eq!(payloads(&wal), want);
    assert_eq!(wal.append(&rec(b"new")).unwrap(), 2);
    drop(wal);
    let segs = segments(&fs);
    assert_eq!(segs.iter().map(|(b, _)| *b).collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(&segs[0].1[..], &old[..], "the old segment is sealed as it was, no frame added");
    let header = narad_wal::frame::check_segment_header(&segs[1].1, 2).unwrap();
    assert_eq!((header.version, header.salt.is_some()), (narad_wal::frame::SEGMENT_VERSION, true));
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    let mut want = want;
    want.push((2, b"new".to_vec()));
    assert_eq!(payloads(&wal), want);
}

#[test]
fn a_version_1_segment_keeps_the_old_rule_for_a_forged_frame_behind_a_tear() {
    // No salt: a client's frame of a later write in a torn write's payload
    // cannot be told from a real one there, so the open refuses (an
    // operator looks; nothing is lost). Salted segments cut the tear.
    let fs = SimFs::new(6);
    let mut p = vec![0x33u8; 300];
    p.extend_from_slice(&forged_frame(7, FrameSeed::UNSALTED));
    p.extend_from_slice(&[0x33u8; 300]);
    let image = write_version_1_segment(&fs, &[b"acked", &p]);
    zero(&fs, 0, image.len() as u64 - 200, 200);
    let err = Wal::open_with(fs.shared(), dir(), options()).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("valid frames of a later write follow"), "{err}");
}
