//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test file uses its own subset

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use narad_clock::ManualClock;
use narad_fs::{DirEntry, File, FileRef, Fs, FsRef, OpenMode, SimFs};
use narad_log::frame::{FrameHeader, FrameSeed};
use narad_log::limits::{FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use narad_log::segment::{self, SegmentFormat};
use narad_log::{CommitRecord, LogConfig, LogError, LogRecord, PartitionLog, SealedCheck};

/// The partition directory used by the tests.
pub const DIR: &str = "/data/topics/orders/p00000";

pub fn dir() -> PathBuf {
    PathBuf::from(DIR)
}

/// A start time for manual clocks (2023-11-14).
pub const T0: u64 = 1_700_000_000_000;

/// Small segments and frames, so a few commits roll segments and split
/// frames.
pub fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 1024,
        frame_target_bytes: 1024,
        index_stride_bytes: 1024,
        sealed_check: SealedCheck::Full,
        ..LogConfig::default()
    }
}

pub fn open(fs: FsRef, config: &LogConfig, clock: &ManualClock) -> Result<PartitionLog, LogError> {
    PartitionLog::open(fs, dir(), config.clone(), Arc::new(clock.clone()))
}

pub fn open_sim(
    fs: &SimFs,
    config: &LogConfig,
    clock: &ManualClock,
) -> Result<PartitionLog, LogError> {
    open(fs.shared(), config, clock)
}

/// A record with a recognisable payload.
pub fn rec(tag: &str, i: usize) -> CommitRecord {
    CommitRecord::keyed(format!("k{i}"), format!("{tag}-{i}-{}", "x".repeat(i % 50)))
}

/// `n` records.
pub fn recs(tag: &str, n: usize) -> Vec<CommitRecord> {
    (0..n).map(|i| rec(tag, i)).collect()
}

/// Reads everything from the oldest offset to the high watermark; panics
/// on corrupt ranges.
pub fn read_all(log: &PartitionLog) -> Vec<LogRecord> {
    let mut out = Vec::new();
    let mut offset = log.oldest_offset();
    let hwm = log.high_watermark();
    while offset < hwm {
        let b = log.read(offset, 1000, 1 << 20).expect("read");
        assert!(b.corrupt.is_empty(), "unexpected corrupt ranges {:?}", b.corrupt);
        assert!(b.next_offset > offset, "read made no progress at {offset}");
        out.extend(b.records);
        offset = b.next_offset;
    }
    out
}

pub fn payload_of(r: &CommitRecord) -> &Bytes {
    &r.payload
}

/// Lists the segment files of the test directory.
pub fn segment_paths(fs: &SimFs) -> Vec<PathBuf> {
    fs.list_dir(&dir())
        .unwrap()
        .into_iter()
        .filter(|e| e.name.ends_with(".log"))
        .map(|e| dir().join(e.name))
        .collect()
}

/// A file system wrapper whose `sync_data` can be slowed down or held at a
/// gate, to make commit cycles overlap (combining, close while queued).
#[derive(Debug, Clone)]
pub struct GateFs {
    inner: SimFs,
    gate: Arc<Gate>,
}

#[derive(Debug, Default)]
pub struct Gate {
    delay_us: AtomicU64,
    held: Mutex<bool>,
    cv: Condvar,
    /// Syncs that have started (entered `sync_data`).
    pub syncs_started: AtomicU64,
}

impl GateFs {
    pub fn new(inner: SimFs) -> Self {
        GateFs { inner, gate: Arc::new(Gate::default()) }
    }

    pub fn shared(&self) -> FsRef {
        Arc::new(self.clone())
    }

    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Every `sync_data` sleeps this long first.
    pub fn set_sync_delay(&self, d: Duration) {
        self.gate.delay_us.store(d.as_micros() as u64, Ordering::SeqCst);
    }

    /// While held, every `sync_data` waits.
    pub fn hold(&self, held: bool) {
        *self.gate.held.lock().unwrap() = held;
        self.gate.cv.notify_all();
    }

    /// Waits until `n` syncs have started.
    pub fn wait_syncs_started(&self, n: u64) {
        while self.gate.syncs_started.load(Ordering::SeqCst) < n {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[derive(Debug)]
struct GateFile {
    inner: FileRef,
    gate: Arc<Gate>,
}

impl Fs for GateFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileRef> {
        let inner = self.inner.open(path, mode)?;
        Ok(Arc::new(GateFile { inner, gate: self.gate.clone() }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        self.inner.list_dir(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.inner.exists(path)
    }
}

impl File for GateFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.gate.syncs_started.fetch_add(1, Ordering::SeqCst);
        let mut held = self.gate.held.lock().unwrap();
        while *held {
            held = self.gate.cv.wait(held).unwrap();
        }
        drop(held);
        let d = self.gate.delay_us.load(Ordering::SeqCst);
        if d > 0 {
            std::thread::sleep(Duration::from_micros(d));
        }
        self.inner.sync_data()
    }
}

/// The format of a segment file, from its first bytes.
pub fn segment_format(fs: &SimFs, path: &Path) -> SegmentFormat {
    let f = fs.open(path, OpenMode::Existing).unwrap();
    let mut head = vec![0u8; (f.len().unwrap() as usize).min(SEGMENT_HEADER_LEN)];
    f.read_exact_at(&mut head, 0).unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    let base = segment::parse_segment_file_name(name).unwrap();
    segment::parse_segment_format(&head, base).unwrap()
}

/// The seed a frame needs to pass its CRC in a segment file.
pub fn segment_seed(fs: &SimFs, path: &Path) -> FrameSeed {
    segment_format(fs, path).seed()
}

/// The byte positions of the frames of a segment file (up to the zero
/// runway after the last one, if any).
pub fn frame_positions(fs: &SimFs, path: &Path) -> Vec<u64> {
    let f = fs.open(path, OpenMode::Existing).unwrap();
    let len = f.len().unwrap();
    let mut out = Vec::new();
    let mut pos = segment_format(fs, path).frames_start();
    while pos < len {
        let mut raw = [0u8; FRAME_HEADER_LEN];
        f.read_exact_at(&mut raw, pos).unwrap();
        if raw.iter().all(|&b| b == 0) {
            break; // the zero runway after the last frame
        }
        out.push(pos);
        pos += FrameHeader::parse(&raw).unwrap().frame_len();
    }
    out
}
