//! Segment preparation (`WalOptions::prealloc`): prepared segments are
//! renamed in at the roll, sealed segments are cut back to their frames,
//! and recovery keeps a prepared last segment only when its tail is clean.

use std::time::{Duration, Instant};

use narad_fs::{Fs, OpenMode, SimFs};
use narad_wal::frame::{SEGMENT_FLAG_PREPARED, check_segment_header, segment_file_name};
use narad_wal::prep::{self, PREP_TRAILER_BYTES, prepared_limit};
use narad_wal::{RecordRef, Wal, WalOptions, recovery};

mod common;

use common::{dir, payloads, segments};

const SEGMENT: u64 = 16 << 10;

fn options() -> WalOptions {
    // No zero runway: the non-prepared segments of these tests append, as
    // they would with it on a disk too full for it.
    let options = WalOptions { prealloc: true, runway_bytes: 0, ..common::small() };
    assert_eq!(options.segment_bytes, SEGMENT);
    options
}

fn rec(payload: &[u8]) -> RecordRef<'_> {
    RecordRef {
        topic: "orders",
        incarnation: Some(3),
        key: Some(b"k"),
        partition: 2,
        accepted_at_ms: 5,
        payload,
    }
}

/// Appends the next numbered record and remembers it.
fn append_next(wal: &Wal, written: &mut Vec<(u64, Vec<u8>)>) {
    let payload = format!("record-{}-", written.len()).into_bytes().repeat(12);
    let seq = wal.append(&rec(&payload)).unwrap();
    written.push((seq, payload));
}

/// Appends records of about 200 bytes until `rolls` prepared segments were
/// renamed in. After each append it gives the prep thread a moment (it is
/// asked once the active segment is half full and writes 16 KiB), so rolls
/// find a spare ready instead of racing it.
fn fill(wal: &Wal, rolls: u64, written: &mut Vec<(u64, Vec<u8>)>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while wal.stats().prepared_rolls < rolls {
        assert!(Instant::now() < deadline, "{:?} after 60 s", wal.stats());
        append_next(wal, written);
        let wait = Instant::now() + Duration::from_millis(3);
        while !wal.spare_ready() && Instant::now() < wait {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

#[test]
fn prepared_segments_are_renamed_in_and_sealed_ones_are_cut_to_their_frames() {
    let fs = SimFs::new(1);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    let mut written = Vec::new();
    fill(&wal, 3, &mut written);
    assert_eq!(payloads(&wal), written);
    wal.close().unwrap();
    drop(wal);

    let segs = segments(&fs);
    assert!(segs.len() >= 4, "{} segments", segs.len());
    let (last, sealed) = segs.split_last().unwrap();
    for (base, image) in sealed {
        assert_eq!(prepared_limit(image), None, "sealed segment {base} kept its trailer");
        assert_eq!(
            recovery::verdict(image, *base, false),
            Ok(image.len() as u64),
            "sealed segment {base} is not exactly its frames"
        );
    }
    assert_eq!(last.1.len() as u64, SEGMENT + PREP_TRAILER_BYTES, "active segment is prepared");
    assert_eq!(prepared_limit(&last.1), Some(SEGMENT));
    let flags = check_segment_header(&last.1, last.0).unwrap().flags;
    assert_eq!(flags, SEGMENT_FLAG_PREPARED, "its header says prepared");

    // A clean stop and a reopen keep every record and the preparation.
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    assert_eq!(payloads(&wal), written);
    let seq = wal.append(&rec(b"after reopen")).unwrap();
    written.push((seq, b"after reopen".to_vec()));
    assert_eq!(payloads(&wal), written);
    wal.close().unwrap();
    drop(wal);
    let segs = segments(&fs);
    assert_eq!(prepared_limit(&segs.last().unwrap().1), Some(SEGMENT));
    assert!(!fs.exists(&prep::prep_path(&dir())).unwrap() || segs.len() > 1);
}

/// Writes `image` as the last segment `base` (replacing it).
fn put_segment(fs: &SimFs, base: u64, image: &[u8]) {
    let f = fs.open(&dir().join(segment_file_name(base)), OpenMode::CreateOrTruncate).unwrap();
    f.write_all_at(image, 0).unwrap();
    f.sync_data().unwrap();
}

#[test]
fn a_prepared_segment_renamed_in_before_its_header_was_written_opens_empty() {
    let fs = SimFs::new(2);
    fs.create_dir_all(&dir()).unwrap();
    let mut image = vec![0u8; SEGMENT as usize];
    image.extend_from_slice(&prep::trailer(SEGMENT as u32));
    put_segment(&fs, 40, &image);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    assert_eq!(wal.durable_next(), 40);
    assert_eq!(wal.append(&rec(b"first")).unwrap(), 40);
    assert_eq!(payloads(&wal), vec![(40, b"first".to_vec())]);
    wal.close().unwrap();
    drop(wal);
    let segs = segments(&fs);
    assert_eq!(segs.len(), 1);
    assert_eq!(prepared_limit(&segs[0].1), Some(SEGMENT), "still prepared");
}

#[test]
fn a_dirty_tail_in_a_prepared_segment_is_cut_with_its_trailer() {
    let fs = SimFs::new(3);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    let mut written = Vec::new();
    fill(&wal, 1, &mut written);
    wal.close().unwrap();
    drop(wal);
    let (base, image) = segments(&fs).pop().unwrap();
    let mut image = image.to_vec();
    assert_eq!(prepared_limit(&image), Some(SEGMENT));
    let good =
        recovery::verdict(&bytes::Bytes::from(image[..SEGMENT as usize].to_vec()), base, true)
            .unwrap();
    // A torn write left a few bytes (not a frame) in the zeros after the
    // last good frame.
    image[good as usize + 100] = 0x5a;
    put_segment(&fs, base, &image);

    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    assert_eq!(payloads(&wal), written, "every acked record survives");
    wal.close().unwrap();
    drop(wal);
    let (_, image) = segments(&fs).pop().unwrap();
    assert_eq!(image.len() as u64, good, "cut at the last good frame, trailer gone");
    assert_eq!(prepared_limit(&image), None);
}

#[test]
fn a_leftover_prepared_file_is_removed_on_open() {
    let fs = SimFs::new(4);
    fs.create_dir_all(&dir()).unwrap();
    let f = fs.open(&prep::prep_path(&dir()), OpenMode::CreateOrTruncate).unwrap();
    f.write_all_at(&[0u8; 100], 0).unwrap();
    f.sync_data().unwrap();
    let wal =
        Wal::open_with(fs.shared(), dir(), WalOptions { prealloc: false, ..options() }).unwrap();
    assert!(!fs.exists(&prep::prep_path(&dir())).unwrap());
    drop(wal);
}

/// Bytes held by every file in the WAL directory.
fn used(fs: &SimFs) -> u64 {
    fs.list_dir(&dir())
        .unwrap()
        .iter()
        .filter(|e| !e.is_dir)
        .map(|e| fs.open(&dir().join(&e.name), OpenMode::Existing).unwrap().len().unwrap())
        .sum()
}

#[test]
fn a_failed_preparation_gives_its_space_back_and_the_roll_creates_an_empty_segment() {
    let fs = SimFs::new(5);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    // Room for the rest of this segment and a small next one, never for a
    // whole prepared segment next to them.
    fs.set_capacity(Some(used(&fs) + SEGMENT + (4 << 10)));
    let mut written = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while wal.stats().prep_failures == 0 {
        assert!(Instant::now() < deadline, "{:?}", wal.stats());
        append_next(&wal, &mut written);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!fs.exists(&prep::prep_path(&dir())).unwrap(), "the half-written file was removed");
    // The WAL is not latched, and the next roll creates an ordinary segment.
    let segments_before = segments(&fs).len();
    while segments(&fs).len() == segments_before {
        append_next(&wal, &mut written);
    }
    assert!(!wal.is_latched());
    assert_eq!(wal.stats().prepared_rolls, 0);
    assert_eq!(prepared_limit(&segments(&fs).last().unwrap().1), None);
    assert_eq!(payloads(&wal), written);
}
