//! Crash consistency of the ingress WAL on the simulated disk.
//!
//! For each seed: several threads append (single records and batches, keyed,
//! keyless and empty-keyed) while another moves the checkpoint and compacts;
//! the power is cut at a random operation; the disk keeps only what was
//! synced (with and without torn writes); the WAL is reopened. Then:
//! * every append that returned `Ok` at or above the recovered checkpoint is
//!   there, at the same sequence number, with the same bytes;
//! * sequence numbers are dense (the reader checks) and the next sequence
//!   number is past every acked one;
//! * every record found was appended by someone (nothing invented);
//! * the recovered checkpoint never passes a value that was stored.
//!
//! Half of the seeds run with segment preparation (`WalOptions::prealloc`),
//! and half (crossed with those) with a zero runway after the frames
//! (`WalOptions::runway_bytes`).
//!
//! A third of the payloads are adversarial: they start and end with our own
//! formats' bytes (segment headers, CRC-valid WAL frames, preparation
//! trailers with a valid CRC, partition-log frames with a valid CRC, runs
//! of zeros). Most of those that end in a trailer name the offset where
//! they would land if their frame ended the file (predicted from the WAL's
//! size as the append is made), which is what a client who wanted recovery
//! to cut its record would send.
//!
//! `NARAD_SEEDS=N` runs N seeds instead of the default 1,000.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use narad_fs::{CrashMode, Fs, OpenMode, SimFs, SimRng};
use narad_wal::frame::{
    FrameSeed, SEGMENT_FLAG_PREPARED, begin_frame, parse_segment_file_name, seal_frame,
    segment_file_name, segment_header, segment_header_with_flags,
};
use narad_wal::limits::{FRAME_HEADER_BYTES, SEGMENT_HEADER_BYTES};
use narad_wal::{RecordRef, Wal, WalOptions, prep};

/// Half of the seeds run with segment preparation, so crashes also land
/// around renames of prepared segments, overwrites of their zeros and the
/// cut that seals them.
fn options(seed: u64) -> WalOptions {
    WalOptions {
        segment_bytes: 16 << 10,
        max_record_bytes: 4 << 10,
        rotate_dispatched_active_bytes: 4 << 10,
        prealloc: seed % 4 >= 2,
        // Odd seeds keep a zero runway after the frames (a prepared segment
        // has its zeros already); even seeds append, as before it.
        runway_bytes: if seed % 2 == 1 { 8 << 10 } else { 0 },
        ..WalOptions::default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Expect {
    key: Option<Vec<u8>>,
    partition: u32,
    payload: Vec<u8>,
}

#[derive(Default)]
struct Ledger {
    /// Every record anyone tried to append, by its unique payload.
    attempted: HashMap<Vec<u8>, Expect>,
    /// seq -> record, for appends that returned Ok.
    acked: HashMap<u64, Expect>,
    /// The largest checkpoint ever stored.
    max_checkpoint: u64,
}

fn make_record(rng: &mut SimRng, thread: u64, n: u64) -> Expect {
    let mut payload = format!("t{thread}-n{n}-").into_bytes();
    let cap = if rng.chance(1, 10) { 3000 } else { 200 };
    let extra = rng.below(cap) as usize;
    payload.extend((0..extra).map(|i| (i as u8).wrapping_mul(31)));
    let key = match rng.below(3) {
        0 => None,
        1 => Some(Vec::new()),
        _ => Some(format!("key-{}", rng.below(10)).into_bytes()),
    };
    Expect { key, partition: rng.below(8) as u32, payload }
}

/// Where the next frame would start in the active segment, from the WAL's
/// durable size less the sealed segments' files (a sealed segment is
/// exactly its frames). A guess: other appenders and compaction race it.
fn predict_frame_start(wal: &Wal, fs: &SimFs, dir: &std::path::Path) -> u64 {
    let (_, total) = wal.disk_usage();
    let Ok(entries) = fs.list_dir(dir) else { return SEGMENT_HEADER_BYTES };
    let mut bases: Vec<u64> =
        entries.iter().filter_map(|e| parse_segment_file_name(&e.name)).collect();
    bases.sort_unstable();
    bases.pop();
    let sealed: u64 = bases
        .iter()
        .filter_map(|b| fs.open(&dir.join(segment_file_name(*b)), OpenMode::Existing).ok())
        .filter_map(|f| f.len().ok())
        .sum();
    total.saturating_sub(sealed).max(SEGMENT_HEADER_BYTES)
}

/// A WAL frame holding a small record, built with the real encoder as a
/// client could: of any write, the first ever or (mostly) a later one than
/// the torn write it may end up in, which is what recovery looks for
/// behind damage (docs/DURABILITY.md, "payloads that look like ours").
fn wal_frame(rng: &mut SimRng) -> Vec<u8> {
    let payload = vec![rng.below(256) as u8; 1 + rng.below(40) as usize];
    let r = RecordRef {
        topic: "orders",
        incarnation: Some(7),
        key: None,
        partition: 0,
        accepted_at_ms: 1,
        payload: &payload,
    };
    let mut out = Vec::new();
    let (seq, write_index) = match rng.below(3) {
        0 => {
            let seq = rng.below(3);
            (seq, seq as u32)
        }
        _ => (rng.below(5_000), rng.below(2) as u32),
    };
    let at = begin_frame(&mut out, r.encoded_len().unwrap(), seq, write_index);
    r.encode_into(&mut out);
    // The segment's salt is secret: a client seals with no salt, or a guess.
    let guess = match rng.below(3) {
        0 => FrameSeed::UNSALTED,
        1 => FrameSeed::of_salt(0),
        _ => FrameSeed::of_salt(rng.below(u64::MAX)),
    };
    seal_frame(&mut out, at, guess);
    out
}

/// A partition-log frame (SPEC §5.2) whose header and CRC are valid.
fn log_frame(rng: &mut SimRng) -> Vec<u8> {
    let payload = vec![rng.below(256) as u8; 64];
    let mut h = vec![0xCA, 0xFE, 0];
    h.extend_from_slice(&1i32.to_be_bytes());
    h.extend_from_slice(&(rng.below(1_000) as i64).to_be_bytes());
    h.extend_from_slice(&(payload.len() as i32).to_be_bytes());
    h.extend_from_slice(&(payload.len() as i32).to_be_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[2..23]), &payload);
    h.extend_from_slice(&crc.to_be_bytes());
    h.extend_from_slice(&payload);
    h
}

/// One of our formats' byte patterns; `trailer_at` is the offset a
/// trailer at the end of the payload would land at, if known.
fn magic_block(rng: &mut SimRng, trailer_at: Option<u64>) -> Vec<u8> {
    match rng.below(6) {
        0 => segment_header(rng.below(5_000), rng.below(u64::MAX)).to_vec(),
        1 => segment_header_with_flags(rng.below(5_000), SEGMENT_FLAG_PREPARED, 0).to_vec(),
        2 => wal_frame(rng),
        3 => log_frame(rng),
        4 => vec![0u8; 1 + rng.below(600) as usize],
        _ => {
            let limit = trailer_at.unwrap_or(rng.below(16 << 10));
            prep::trailer(limit as u32).to_vec()
        }
    }
}

/// An adversarial record: unique, of a random size, starting with one of
/// our byte patterns and ending with another; half of them end in a
/// trailer naming where it lands if the frame starting at `frame_start`
/// (or at the start of a fresh segment, if it would not fit) ends the file.
fn make_adversarial(
    rng: &mut SimRng,
    thread: u64,
    n: u64,
    frame_start: u64,
    segment_bytes: u64,
) -> Expect {
    let mut e = make_record(rng, thread, n);
    let head = magic_block(rng, None);
    let len = (head.len() + e.payload.len() + 16 + rng.below(1500) as usize).min(3900);
    let mut payload = head;
    payload.extend_from_slice(&e.payload);
    payload.resize(len, 0x41);
    e.payload = payload;
    let enc = u64::from(as_ref(&e).encoded_len().unwrap());
    let frame = FRAME_HEADER_BYTES + enc;
    let start =
        if frame_start + frame > segment_bytes { SEGMENT_HEADER_BYTES } else { frame_start };
    let end = start + frame;
    let tail = if rng.chance(1, 2) {
        prep::trailer((end - prep::PREP_TRAILER_BYTES) as u32).to_vec()
    } else {
        magic_block(rng, Some(end - prep::PREP_TRAILER_BYTES))
    };
    let at = e.payload.len().saturating_sub(tail.len()).max(e.payload.len() / 2);
    let take = e.payload.len() - at;
    e.payload[at..].copy_from_slice(&tail[tail.len() - take..]);
    e
}

fn as_ref(e: &Expect) -> RecordRef<'_> {
    RecordRef {
        topic: "orders",
        incarnation: if e.partition.is_multiple_of(2) { Some(7) } else { None },
        key: e.key.as_deref(),
        partition: e.partition,
        accepted_at_ms: 1_700_000_000_000,
        payload: &e.payload,
    }
}

/// Rolls onto a prepared segment over every seed: the preparation half of
/// the seeds must actually reach them.
static PREPARED_ROLLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn run_seed(seed: u64) {
    let mode = match seed % 3 {
        0 => CrashMode::DropUnsynced,
        1 => CrashMode::Torn,
        _ => CrashMode::TornWithHoles,
    };
    let mut rng = SimRng::new(seed);
    let fs = SimFs::new(seed);
    let dir = PathBuf::from("/data/ingress/produce");
    let ledger = Arc::new(Mutex::new(Ledger::default()));

    // Two lives before the crash that is checked, so recovery also runs on
    // a WAL that already recovered once.
    for life in 0..2 {
        let wal = Arc::new(
            Wal::open_with(fs.shared(), &dir, options(seed))
                .unwrap_or_else(|e| panic!("seed {seed} life {life}: reopen failed: {e}")),
        );
        if life > 0 {
            verify(seed, &wal, &ledger.lock().unwrap());
        }
        let cut = fs.op_count() + rng.below(400);
        fs.power_cut_at(cut);
        let mut handles = Vec::new();
        for t in 0..3u64 {
            let (wal, ledger, mut rng) = (wal.clone(), ledger.clone(), rng.fork());
            let (fs, dir) = (fs.clone(), dir.clone());
            let thread = life * 10 + t;
            handles.push(std::thread::spawn(move || {
                for n in 0..25 {
                    let batch = if rng.chance(1, 3) { 1 + rng.below(5) } else { 1 };
                    let mut at = predict_frame_start(&wal, &fs, &dir);
                    let segment_bytes = options(seed).segment_bytes;
                    let recs: Vec<Expect> = (0..batch)
                        .map(|i| {
                            let e = if rng.chance(1, 3) {
                                make_adversarial(&mut rng, thread, n * 10 + i, at, segment_bytes)
                            } else {
                                make_record(&mut rng, thread, n * 10 + i)
                            };
                            let frame =
                                FRAME_HEADER_BYTES + u64::from(as_ref(&e).encoded_len().unwrap());
                            at = if at + frame > segment_bytes { SEGMENT_HEADER_BYTES } else { at }
                                + frame;
                            e
                        })
                        .collect();
                    {
                        let mut l = ledger.lock().unwrap();
                        for r in &recs {
                            l.attempted.insert(r.payload.clone(), r.clone());
                        }
                    }
                    let refs: Vec<RecordRef<'_>> = recs.iter().map(as_ref).collect();
                    let result = if batch == 1 && rng.chance(1, 2) {
                        wal.append(&refs[0]).map(|s| s..s + 1)
                    } else {
                        wal.append_many(&refs)
                    };
                    match result {
                        Ok(seqs) => {
                            assert_eq!(seqs.end - seqs.start, batch);
                            let mut l = ledger.lock().unwrap();
                            for (seq, r) in seqs.zip(recs) {
                                assert!(l.acked.insert(seq, r).is_none(), "seq {seq} acked twice");
                            }
                        }
                        Err(_) => return,
                    }
                }
            }));
        }
        {
            let (wal, ledger, mut rng) = (wal.clone(), ledger.clone(), rng.fork());
            handles.push(std::thread::spawn(move || {
                for _ in 0..40 {
                    let durable = wal.durable_next();
                    let current = wal.checkpoint();
                    let target = current + rng.below(durable - current + 1);
                    // Record before storing: a stored value may survive even
                    // if the call reports an error.
                    {
                        let mut l = ledger.lock().unwrap();
                        l.max_checkpoint = l.max_checkpoint.max(target);
                    }
                    if wal.store_checkpoint(target).is_err() {
                        return;
                    }
                    if rng.chance(1, 4) {
                        wal.compact_now();
                    }
                    std::thread::yield_now();
                }
            }));
        }
        for h in handles {
            h.join().unwrap_or_else(|_| panic!("seed {seed}: workload thread panicked"));
        }
        PREPARED_ROLLS.fetch_add(wal.stats().prepared_rolls, std::sync::atomic::Ordering::Relaxed);
        let _ = wal.close();
        drop(wal);
        fs.crash(mode);
    }
    let wal = Wal::open_with(fs.shared(), &dir, options(seed))
        .unwrap_or_else(|e| panic!("seed {seed}: final reopen failed: {e}"));
    verify(seed, &wal, &ledger.lock().unwrap());
    // The WAL keeps working after recovery.
    let next = wal.durable_next();
    let e = Expect { key: None, partition: 1, payload: b"after".to_vec() };
    assert_eq!(wal.append(&as_ref(&e)).unwrap(), next, "seed {seed}");
}

fn verify(seed: u64, wal: &Wal, ledger: &Ledger) {
    let start = wal.checkpoint();
    assert!(
        start <= ledger.max_checkpoint.max(wal.oldest_seq()),
        "seed {seed}: recovered checkpoint {start} passes every stored value ({})",
        ledger.max_checkpoint
    );
    let end = wal.durable_next();
    if let Some(max_acked) = ledger.acked.keys().max() {
        assert!(end > *max_acked, "seed {seed}: next seq {end} not past acked {max_acked}");
    }
    let mut reader = wal.reader(start);
    let mut found = HashMap::new();
    while let Some(entry) = reader.next_entry().unwrap_or_else(|e| panic!("seed {seed}: read: {e}"))
    {
        let rec = entry.decode().unwrap_or_else(|e| panic!("seed {seed}: decode: {e}"));
        let got = Expect {
            key: rec.key.as_ref().map(|k| k.to_vec()),
            partition: rec.partition,
            payload: rec.payload.to_vec(),
        };
        let attempted = ledger.attempted.get(&got.payload);
        assert_eq!(attempted, Some(&got), "seed {seed}: seq {} was never appended", rec.seq);
        assert_eq!(rec.topic(), "orders");
        assert_eq!(rec.incarnation, if got.partition.is_multiple_of(2) { Some(7) } else { None });
        found.insert(rec.seq, got);
    }
    assert_eq!(reader.position(), end, "seed {seed}: reader stopped early");
    for (seq, want) in &ledger.acked {
        if *seq >= start {
            assert_eq!(found.get(seq), Some(want), "seed {seed}: acked seq {seq} lost");
        }
    }
}

#[test]
fn every_acked_append_survives_a_power_cut_and_nothing_is_invented() {
    let seeds: u64 = std::env::var("NARAD_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    for seed in 0..seeds {
        run_seed(seed);
    }
    let prepared = PREPARED_ROLLS.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{seeds} seeds, {prepared} rolls onto a prepared segment");
    if seeds >= 100 {
        assert!(prepared > 0, "no seed rolled onto a prepared segment");
    }
}
