//! The zero runway (`WalOptions::runway_bytes`): small group commits write
//! over zeros kept after the active segment's frames, a seal cuts them, an
//! open cuts them from the last segment, and a disk too full for them stops
//! the runway, never the WAL.

use bytes::Bytes;
use narad_fs::{CrashMode, Fs, OpenMode, SimFs};
use narad_wal::frame::segment_file_name;
use narad_wal::{RecordRef, Wal, WalOptions, recovery};

mod common;

use common::{dir, payloads, rec, segments};

const RUNWAY: u64 = 4 << 10;

fn options() -> WalOptions {
    WalOptions { runway_bytes: RUNWAY, ..common::small() }
}

/// A numbered payload of about 100 bytes: one record is a group well under
/// an eighth of the runway.
fn payload(n: usize) -> Vec<u8> {
    format!("record-{n}-").into_bytes().repeat(8)
}

/// The length of the frames at the start of `image`, and whether only
/// zeros follow them.
fn frames_then_zeros(image: &Bytes, base: u64) -> (u64, bool) {
    let frames = recovery::verdict(image, base, true).expect("a last segment opens");
    (frames, image[frames as usize..].iter().all(|&b| b == 0))
}

#[test]
fn small_groups_write_over_zeros_and_sealed_segments_are_exactly_their_frames() {
    let fs = SimFs::new(1);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    let mut written = Vec::new();
    let mut runway_seen = 0;
    while segments(&fs).len() < 4 {
        let p = payload(written.len());
        let seq = wal.append(&rec(&p)).unwrap();
        written.push((seq, p));
        // After every group, the active segment is its frames and then
        // zeros, durable with the group that wrote them.
        let (base, image) = segments(&fs).pop().unwrap();
        let (frames, zeros) = frames_then_zeros(&image, base);
        assert!(zeros, "segment {base}: something other than zeros after its frames");
        assert_eq!(fs.durable_len(&dir().join(segment_file_name(base))), Some(image.len() as u64));
        if image.len() as u64 > frames {
            runway_seen += 1;
            assert!(image.len() as u64 <= options().segment_bytes, "runway past the segment");
            assert!(image.len() as u64 - frames <= RUNWAY, "runway longer than asked");
        }
    }
    assert!(
        runway_seen > written.len() / 2,
        "{runway_seen} of {} appends had a runway",
        written.len()
    );
    assert_eq!(payloads(&wal), written);
    let segs = segments(&fs);
    let (_, sealed) = segs.split_last().unwrap();
    for (base, image) in sealed {
        assert_eq!(
            recovery::verdict(image, *base, false),
            Ok(image.len() as u64),
            "sealed segment {base} is not exactly its frames"
        );
    }
    wal.close().unwrap();
    drop(wal);

    // The runway is still there after a clean stop; opening cuts it, and
    // keeps every record.
    let (base, image) = segments(&fs).pop().unwrap();
    let (frames, _) = frames_then_zeros(&image, base);
    assert!((image.len() as u64) > frames, "the runway outlives a clean stop");
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    assert_eq!(segments(&fs).pop().unwrap().1.len() as u64, frames);
    assert_eq!(payloads(&wal), written);
    let p = b"after reopen".to_vec();
    let seq = wal.append(&rec(&p)).unwrap();
    written.push((seq, p));
    assert_eq!(payloads(&wal), written);
}

#[test]
fn a_group_larger_than_an_eighth_of_the_runway_appends() {
    let fs = SimFs::new(2);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    // Ten records of about 100 bytes: over 512 bytes in one group.
    let batch: Vec<Vec<u8>> = (0..10).map(payload).collect();
    let recs: Vec<RecordRef<'_>> = batch.iter().map(|p| rec(p)).collect();
    wal.append_many(&recs).unwrap();
    let (base, image) = segments(&fs).pop().unwrap();
    assert_eq!(frames_then_zeros(&image, base).0, image.len() as u64, "no zeros were written");
    // A small group then tops the runway up.
    wal.append(&rec(b"small")).unwrap();
    let (base, image) = segments(&fs).pop().unwrap();
    let (frames, zeros) = frames_then_zeros(&image, base);
    assert!(zeros && image.len() as u64 == frames + RUNWAY, "{} {frames}", image.len());
}

#[test]
fn every_acked_record_survives_a_power_cut_over_the_runway() {
    for seed in 0..60 {
        let fs = SimFs::new(100 + seed);
        let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
        let mut acked = Vec::new();
        for n in 0..(40 + seed as usize * 3) {
            let p = payload(n);
            acked.push((wal.append(&rec(&p)).unwrap(), p));
        }
        // One more group in flight: written, maybe over the runway, never
        // synced when the power goes.
        fs.power_cut_at(fs.op_count() + 1 + seed % 3);
        let p = payload(100_000);
        let _ = wal.append(&rec(&p));
        drop(wal);
        let mode =
            [CrashMode::DropUnsynced, CrashMode::Torn, CrashMode::TornWithHoles][seed as usize % 3];
        fs.crash(mode);
        let wal = Wal::open_with(fs.shared(), dir(), options())
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let found = payloads(&wal);
        assert!(found.len() >= acked.len(), "seed {seed}: {} of {}", found.len(), acked.len());
        assert_eq!(found[..acked.len()], acked[..], "seed {seed}");
        // The WAL goes on from there.
        let seq = wal.append(&rec(b"after")).unwrap();
        assert_eq!(seq, found.len() as u64, "seed {seed}");
    }
}

#[test]
fn a_disk_too_full_for_the_runway_stops_the_runway_not_the_wal() {
    let fs = SimFs::new(3);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    let mut written = Vec::new();
    let p = payload(0);
    written.push((wal.append(&rec(&p)).unwrap(), p));
    let used: u64 = fs
        .list_dir(&dir())
        .unwrap()
        .iter()
        .filter(|e| !e.is_dir)
        .map(|e| fs.open(&dir().join(&e.name), OpenMode::Existing).unwrap().len().unwrap())
        .sum();
    // Room for the frames of the runway already written and a little more,
    // not for the next top-up of the runway.
    fs.set_capacity(Some(used + 512));
    while wal.stats().runway_failures == 0 {
        let p = payload(written.len());
        written.push((wal.append(&rec(&p)).unwrap(), p));
        assert!(written.len() < 1_000, "the runway never ran out");
    }
    assert!(!wal.is_latched());
    // The segment is no longer topped up: appends go on until the disk
    // itself is full.
    for _ in 0..3 {
        let p = payload(written.len());
        written.push((wal.append(&rec(&p)).unwrap(), p));
    }
    assert_eq!(wal.stats().runway_failures, 1, "one failure per segment");
    assert_eq!(payloads(&wal), written);
    fs.set_capacity(None);
    wal.close().unwrap();
    drop(wal);
    let wal = Wal::open_with(fs.shared(), dir(), options()).unwrap();
    assert_eq!(payloads(&wal), written);
}

#[test]
fn a_runway_longer_than_one_write_of_zeros_is_whole() {
    let fs = SimFs::new(4);
    let runway = 200 << 10; // over the 64 KiB a single zero write covers
    let options = WalOptions { segment_bytes: 1 << 20, runway_bytes: runway, ..common::small() };
    let wal = Wal::open_with(fs.shared(), dir(), options).unwrap();
    wal.append(&rec(b"one")).unwrap();
    let (base, image) = segments(&fs).pop().unwrap();
    let (frames, zeros) = frames_then_zeros(&image, base);
    assert!(zeros);
    assert_eq!(image.len() as u64, frames + runway);
}
