//! In-memory state of the WAL's segment files: which bytes of each are
//! durable, which sequence numbers they hold, and a sparse index from
//! sequence number to byte offset for readers.
//!
//! Only the sync thread (and recovery, before it starts) publishes; readers
//! and compaction only read. A reader never looks past `durable_len`, so it
//! never sees bytes of a write that is still in flight.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use narad_fs::FileRef;

use crate::frame::FrameSeed;
use crate::limits::INDEX_STRIDE_BYTES;

/// One segment file.
#[derive(Debug)]
pub(crate) struct Segment {
    /// Sequence number of its first frame.
    pub base: u64,
    /// Its path, for error messages and removal.
    pub path: PathBuf,
    /// The open file.
    pub file: FileRef,
    /// What its frames' CRCs are seeded with (from its header's salt).
    pub seed: FrameSeed,
    /// Bytes from offset 0 that are durable and hold whole frames.
    durable_len: AtomicU64,
    /// First sequence number after the durable frames of this segment.
    end_seq: AtomicU64,
    /// (seq, offset) pairs, ascending, at least `INDEX_STRIDE_BYTES` apart.
    index: Mutex<Vec<(u64, u64)>>,
    /// The file is a prepared segment (zeros and a trailer past its frames,
    /// see [`crate::prep`]): sealing it must cut it to its data.
    prepared: AtomicBool,
    /// How far the sync thread has written the file: `durable_len`, plus
    /// the zero runway after it (see `extend_runway` in [`crate::wal`]).
    /// Not kept for a prepared segment, which is zeros to its trailer.
    allocated: AtomicU64,
}

impl Segment {
    pub(crate) fn new(
        base: u64,
        path: PathBuf,
        file: FileRef,
        header_len: u64,
        seed: FrameSeed,
    ) -> Segment {
        Segment {
            base,
            path,
            file,
            seed,
            durable_len: AtomicU64::new(header_len),
            end_seq: AtomicU64::new(base),
            index: Mutex::new(Vec::new()),
            prepared: AtomicBool::new(false),
            allocated: AtomicU64::new(header_len),
        }
    }

    /// How far the file has been written: its frames, then zeros.
    pub(crate) fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Acquire)
    }

    pub(crate) fn set_allocated(&self, len: u64) {
        self.allocated.store(len, Ordering::Release);
    }

    /// Whether the file still extends past its frames with zeros and a
    /// preparation trailer.
    pub(crate) fn is_prepared(&self) -> bool {
        self.prepared.load(Ordering::Acquire)
    }

    pub(crate) fn set_prepared(&self, prepared: bool) {
        self.prepared.store(prepared, Ordering::Release);
    }

    pub(crate) fn durable_len(&self) -> u64 {
        self.durable_len.load(Ordering::Acquire)
    }

    pub(crate) fn end_seq(&self) -> u64 {
        self.end_seq.load(Ordering::Acquire)
    }

    /// Records that frames `first_seq..end_seq` starting at byte `offset` are
    /// durable up to byte `len`.
    pub(crate) fn publish(&self, first_seq: u64, offset: u64, end_seq: u64, len: u64) {
        if end_seq > first_seq {
            self.note_index(first_seq, offset);
        }
        self.durable_len.store(len, Ordering::Release);
        self.end_seq.store(end_seq, Ordering::Release);
    }

    /// Adds an index entry if it is far enough from the previous one.
    pub(crate) fn note_index(&self, seq: u64, offset: u64) {
        let mut idx = self.index.lock().unwrap_or_else(|p| p.into_inner());
        match idx.last() {
            Some(&(_, last)) if offset < last + INDEX_STRIDE_BYTES => {}
            _ => idx.push((seq, offset)),
        }
    }

    /// The offset of the frame with the greatest indexed sequence number
    /// `<= seq`, and that number; `None` if the index has nothing at or
    /// before `seq`.
    pub(crate) fn index_floor(&self, seq: u64) -> Option<(u64, u64)> {
        let idx = self.index.lock().unwrap_or_else(|p| p.into_inner());
        let i = idx.partition_point(|&(s, _)| s <= seq);
        if i == 0 { None } else { Some(idx[i - 1]) }
    }
}

/// The segments of the WAL, by base sequence number.
pub(crate) type SegmentMap = RwLock<BTreeMap<u64, Arc<Segment>>>;
