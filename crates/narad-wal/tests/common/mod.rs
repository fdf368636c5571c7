//! Helpers shared by the WAL's integration tests.

use std::path::PathBuf;

use bytes::Bytes;
use narad_fs::{Fs, OpenMode, SimFs};
use narad_wal::frame::{parse_segment_file_name, segment_file_name};
use narad_wal::{RecordRef, Wal, WalOptions, WalReader};

/// Small segments, so tests roll and compact cheaply.
#[allow(dead_code)] // not every test binary uses small segments
pub fn small() -> WalOptions {
    WalOptions {
        segment_bytes: 16 << 10,
        max_record_bytes: 4 << 10,
        rotate_dispatched_active_bytes: 4 << 10,
        ..WalOptions::default()
    }
}

/// The WAL directory on the simulated disk.
pub fn dir() -> PathBuf {
    PathBuf::from("/data/ingress/produce")
}

/// A record of topic `orders` (incarnation 3, key `k`, partition 1).
#[allow(dead_code)] // not every test binary appends through it
pub fn rec(payload: &[u8]) -> RecordRef<'_> {
    RecordRef {
        topic: "orders",
        incarnation: Some(3),
        key: Some(b"k"),
        partition: 1,
        accepted_at_ms: 5,
        payload,
    }
}

/// Every record from `r`'s position to the durable frontier: (sequence
/// number, payload).
#[allow(dead_code)] // not every test binary reads records back
pub fn drain(r: &mut WalReader) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(e) = r.next_entry().unwrap() {
        let d = e.decode().unwrap();
        out.push((d.seq, d.payload.to_vec()));
    }
    out
}

/// Every record the WAL holds, from its oldest: (sequence number, payload).
#[allow(dead_code)] // not every test binary reads records back
pub fn payloads(wal: &Wal) -> Vec<(u64, Vec<u8>)> {
    drain(&mut wal.reader(wal.oldest_seq()))
}

/// Segment files by base, with their whole contents.
#[allow(dead_code)] // not every test binary looks at the files
pub fn segments(fs: &SimFs) -> Vec<(u64, Bytes)> {
    let mut out: Vec<(u64, Bytes)> = fs
        .list_dir(&dir())
        .unwrap()
        .into_iter()
        .filter_map(|e| parse_segment_file_name(&e.name))
        .map(|base| {
            let f = fs.open(&dir().join(segment_file_name(base)), OpenMode::Existing).unwrap();
            let mut buf = vec![0u8; f.len().unwrap() as usize];
            f.read_exact_at(&mut buf, 0).unwrap();
            (base, Bytes::from(buf))
        })
        .collect();
    out.sort();
    out
}
