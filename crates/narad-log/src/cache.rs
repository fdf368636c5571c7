//! A small cache of decoded frames (SPEC §5.3: "decoded-frame LRU").
//!
//! Frames enter it when a commit cycle verifies them (consumers woken by the
//! commit read them next) and when a read decodes them. It is bounded by a
//! frame count and a byte budget; it starts empty and allocates nothing until
//! used, so an idle log costs nothing here. Only verified frames at or below
//! the high watermark are ever inserted, and their content never changes for
//! a given base offset (offsets above the high watermark are reused after a
//! failed commit, but those frames were never inserted).
//!
//! Besides each log's own budget, every cache in the process shares one
//! budget ([`set_process_cache_budget`], default 256 MiB), so thousands of
//! busy partitions cannot hold thousands of full caches: a log that would
//! push the shared total past it evicts its own frames first and, if it
//! holds none, does not cache.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Default of the budget shared by every frame cache of the process.
pub const DEFAULT_PROCESS_CACHE_BUDGET: u64 = 256 << 20;

static PROCESS_CACHE_BUDGET: AtomicU64 = AtomicU64::new(DEFAULT_PROCESS_CACHE_BUDGET);
static PROCESS_CACHE_USED: AtomicU64 = AtomicU64::new(0);

/// Sets the byte budget shared by every frame cache of the process.
pub fn set_process_cache_budget(bytes: u64) {
    PROCESS_CACHE_BUDGET.store(bytes, Ordering::Relaxed);
}

/// Bytes held by every frame cache of the process.
pub fn process_cache_bytes() -> u64 {
    PROCESS_CACHE_USED.load(Ordering::Relaxed)
}

fn process_over(extra: u64) -> bool {
    PROCESS_CACHE_USED.load(Ordering::Relaxed) + extra
        > PROCESS_CACHE_BUDGET.load(Ordering::Relaxed)
}

use bytes::Bytes;

/// One decoded record.
#[derive(Debug, Clone)]
pub(crate) struct DecodedRecord {
    pub key: Option<Bytes>,
    pub commit_time_ms: u64,
    pub payload: Bytes,
}

/// A decoded frame and where it lives.
#[derive(Debug)]
pub(crate) struct DecodedFrame {
    /// Offset of the first record.
    pub base: u64,
    /// The records, in offset order.
    pub records: Vec<DecodedRecord>,
    /// The base offset of the segment holding the frame.
    pub segment_base: u64,
    /// Byte position of the frame in its segment.
    pub pos: u64,
    /// Header plus stored payload, in bytes.
    pub frame_len: u64,
}

impl DecodedFrame {
    /// The offset after the frame's last record.
    pub fn end(&self) -> u64 {
        self.base + self.records.len() as u64
    }

    /// The memory the frame holds, roughly: its bytes plus per-record
    /// overhead.
    pub fn mem_bytes(&self) -> u64 {
        let per = std::mem::size_of::<DecodedRecord>() as u64;
        self.records
            .iter()
            .map(|r| per + r.payload.len() as u64 + r.key.as_ref().map_or(0, |k| k.len() as u64))
            .sum()
    }
}

#[derive(Debug)]
struct Entry {
    frame: Arc<DecodedFrame>,
    mem: u64,
    last_used: u64,
}

/// The cache: frames by base offset, evicting the least recently used.
#[derive(Debug)]
pub(crate) struct FrameCache {
    frames: BTreeMap<u64, Entry>,
    max_bytes: u64,
    max_frames: usize,
    bytes: u64,
    tick: u64,
}

impl FrameCache {
    pub fn new(max_bytes: u64, max_frames: usize) -> Self {
        FrameCache { frames: BTreeMap::new(), max_bytes, max_frames, bytes: 0, tick: 0 }
    }

    /// The cached frame holding `offset`, if any.
    pub fn get(&mut self, offset: u64) -> Option<Arc<DecodedFrame>> {
        self.tick += 1;
        let tick = self.tick;
        let (_, e) = self.frames.range_mut(..=offset).next_back()?;
        if offset >= e.frame.end() {
            return None;
        }
        e.last_used = tick;
        Some(e.frame.clone())
    }

    /// Inserts a frame, evicting the least recently used ones to make room.
    /// A frame larger than the whole budget is not cached.
    pub fn insert(&mut self, frame: Arc<DecodedFrame>) {
        let mem = frame.mem_bytes();
        if self.max_frames == 0 || mem > self.max_bytes {
            return;
        }
        self.tick += 1;
        if let Some(old) = self.frames.remove(&frame.base) {
            self.release(old.mem);
        }
        while !self.frames.is_empty()
            && (self.frames.len() >= self.max_frames
                || self.bytes + mem > self.max_bytes
                || process_over(mem))
        {
            let lru = *self.frames.iter().min_by_key(|(_, e)| e.last_used).expect("non-empty").0;
            let e = self.frames.remove(&lru).expect("present");
            self.release(e.mem);
        }
        if process_over(mem) {
            // Other logs hold the shared budget: serve this one from disk.
            return;
        }
        self.bytes += mem;
        PROCESS_CACHE_USED.fetch_add(mem, Ordering::Relaxed);
        self.frames.insert(frame.base, Entry { frame, mem, last_used: self.tick });
    }

    fn release(&mut self, mem: u64) {
        self.bytes -= mem;
        PROCESS_CACHE_USED.fetch_sub(mem, Ordering::Relaxed);
    }

    /// Drops every frame that starts below `offset` (retention removed it).
    pub fn evict_below(&mut self, offset: u64) {
        let keep = self.frames.split_off(&offset);
        for e in std::mem::replace(&mut self.frames, keep).into_values() {
            self.release(e.mem);
        }
    }

    /// Drops everything and frees the map.
    pub fn clear(&mut self) {
        self.frames = BTreeMap::new();
        PROCESS_CACHE_USED.fetch_sub(self.bytes, Ordering::Relaxed);
        self.bytes = 0;
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for FrameCache {
    fn drop(&mut self) {
        PROCESS_CACHE_USED.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(base: u64, n: usize, size: usize) -> Arc<DecodedFrame> {
        let rec =
            DecodedRecord { key: None, commit_time_ms: 0, payload: Bytes::from(vec![0u8; size]) };
        Arc::new(DecodedFrame {
            base,
            records: vec![rec; n],
            segment_base: 0,
            pos: 0,
            frame_len: 0,
        })
    }

    #[test]
    fn cache_finds_frames_by_any_offset_inside_them_and_evicts_lru() {
        let per = frame(0, 1, 100).mem_bytes();
        let mut c = FrameCache::new(per * 4, 3);
        c.insert(frame(0, 2, 100)); // offsets 0,1 (2 units)
        c.insert(frame(2, 1, 100)); // offset 2
        assert_eq!(c.get(1).unwrap().base, 0);
        assert!(c.get(3).is_none());
        c.insert(frame(3, 1, 100)); // 4 units: fits exactly
        assert!(c.get(2).is_some());
        // A fourth frame exceeds the frame count: the least recently used
        // (base 0, last read before 2 and inserted before 3) goes.
        c.insert(frame(4, 1, 100));
        assert!(c.get(0).is_none(), "least recently used frame was evicted");
        assert!(c.get(2).is_some() && c.get(3).is_some() && c.get(4).is_some());
        c.evict_below(3);
        assert!(c.get(2).is_none());
        assert!(c.get(3).is_some());
        // Larger than the budget: not cached.
        c.insert(frame(10, 1, 10_000));
        assert!(c.get(10).is_none());
        c.clear();
        assert_eq!(c.bytes(), 0);
    }
}
