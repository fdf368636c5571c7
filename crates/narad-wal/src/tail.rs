//! The durable tail, kept in memory: the bytes of the latest group commits,
//! so that a reader at the durable frontier (the dispatcher, normally a
//! group or two behind) takes them from here instead of reading back from
//! the file what the sync thread has just written.
//!
//! # What an entry is
//! One entry per written chunk: `(segment base, byte offset, bytes, end
//! sequence number)`, the exact bytes the chunk's `pwrite` put at that
//! offset of that segment file (a new segment's chunk starts with its
//! header, at offset 0).
//!
//! # Invariants
//! * An entry is added only after the chunk's write and fdatasync both
//!   returned `Ok`, and before the durable frontier that covers it is
//!   published: a reader woken by that frontier finds it, and nothing in
//!   here was ever not durable.
//! * Memory and disk agree for as long as the segment exists: the WAL never
//!   rewrites a frame once written. Runway zeros lie past the frames, a
//!   seal cuts only past them, and recovery (which cuts damaged tails)
//!   runs at open, before anything is added.
//! * Entries are in write order, hence sorted by `(segment, offset)`; they
//!   hold at most [`TAIL_BYTES`] in all, oldest dropped first, and a chunk
//!   larger than that is not kept. Entries wholly below the dispatch
//!   checkpoint are dropped when it is stored.
//! * The bound counts each entry's buffer (a staging buffer handed over
//!   after its flush), not only its bytes.
//! * A miss is never an error: the reader reads the file. It checks the
//!   CRC of every frame it reads from the file; a frame found here is the
//!   buffer its CRC was computed over, and is not checked again.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;

use crate::limits::TAIL_BYTES;

#[derive(Debug)]
struct Entry {
    segment: u64,
    offset: u64,
    bytes: Bytes,
    /// The memory `bytes` holds (its buffer's capacity), which the bound
    /// counts.
    held: usize,
    end_seq: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: VecDeque<Entry>,
    bytes: usize,
}

/// The recent durable chunks (see the module header).
#[derive(Debug, Default)]
pub(crate) struct Tail {
    inner: Mutex<Inner>,
}

impl Tail {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps a durable chunk: `bytes` sit at `offset` of segment `segment`
    /// and end before sequence number `end_seq`; `held` is the memory they
    /// hold (the capacity of the staging buffer they were written from,
    /// which the tail now owns instead of copying it).
    pub(crate) fn push(&self, segment: u64, offset: u64, bytes: Bytes, held: usize, end_seq: u64) {
        let held = held.max(bytes.len());
        if bytes.is_empty() || held > TAIL_BYTES {
            return;
        }
        let mut t = self.lock();
        while t.bytes + held > TAIL_BYTES {
            let Some(old) = t.entries.pop_front() else { break };
            t.bytes -= old.held;
        }
        t.bytes += held;
        t.entries.push_back(Entry { segment, offset, bytes, held, end_seq });
    }

    /// The entry holding `[offset, offset + len)` of `segment`, as its start
    /// offset and all its bytes.
    pub(crate) fn find(&self, segment: u64, offset: u64, len: u64) -> Option<(u64, Bytes)> {
        let t = self.lock();
        // The first entry past (segment, offset); the one before it is the
        // only one that can hold `offset`.
        let i = t.entries.partition_point(|e| (e.segment, e.offset) <= (segment, offset));
        let e = t.entries.get(i.checked_sub(1)?)?;
        let end = e.offset + e.bytes.len() as u64;
        (e.segment == segment && offset + len <= end).then(|| (e.offset, e.bytes.clone()))
    }

    /// Drops the entries whose records all come before `checkpoint`.
    pub(crate) fn release_below(&self, checkpoint: u64) {
        let mut t = self.lock();
        while t.entries.front().is_some_and(|e| e.end_seq <= checkpoint) {
            let old = t.entries.pop_front().expect("front exists");
            t.bytes -= old.held;
        }
    }

    /// Bytes held.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_inside_a_kept_chunk_is_found_and_one_crossing_its_end_is_not() {
        let t = Tail::default();
        t.push(0, 32, Bytes::from(vec![1u8; 100]), 100, 5);
        t.push(0, 132, Bytes::from(vec![2u8; 50]), 50, 7);
        t.push(7, 0, Bytes::from(vec![3u8; 40]), 40, 9);
        assert_eq!(t.find(0, 32, 100).map(|(at, b)| (at, b.len())), Some((32, 100)));
        assert_eq!(t.find(0, 60, 10).map(|(at, b)| (at, b[0])), Some((32, 1)));
        assert_eq!(t.find(0, 140, 42).map(|(at, b)| (at, b[0])), Some((132, 2)));
        assert_eq!(t.find(0, 120, 20), None, "spans two entries");
        assert_eq!(t.find(0, 170, 20), None, "past the last write to segment 0");
        assert_eq!(t.find(0, 0, 8), None, "before the first kept chunk");
        assert_eq!(t.find(7, 0, 40).map(|(at, b)| (at, b[0])), Some((0, 3)));
        assert_eq!(t.find(3, 0, 1), None, "a segment with nothing kept");
    }

    #[test]
    fn the_tail_drops_its_oldest_chunks_beyond_its_bound_and_below_the_checkpoint() {
        let t = Tail::default();
        let big = Bytes::from(vec![0u8; TAIL_BYTES / 2]);
        t.push(0, 32, big.clone(), big.len(), 10);
        t.push(0, 32 + big.len() as u64, big.clone(), big.len(), 20);
        assert_eq!(t.held(), TAIL_BYTES);
        t.push(0, 32 + 2 * big.len() as u64, Bytes::from(vec![9u8; 10]), 10, 21);
        assert!(t.find(0, 32, 1).is_none(), "the oldest went first");
        assert!(t.find(0, 32 + big.len() as u64, 1).is_some());
        assert_eq!(t.held(), TAIL_BYTES / 2 + 10);
        t.push(0, 0, Bytes::from(vec![0u8; TAIL_BYTES + 1]), TAIL_BYTES + 1, 30);
        assert_eq!(t.held(), TAIL_BYTES / 2 + 10, "a chunk over the bound is not kept");
        t.push(0, 0, Bytes::from(vec![0u8; 10]), TAIL_BYTES + 1, 30);
        assert_eq!(t.held(), TAIL_BYTES / 2 + 10, "the bound counts the buffer, not the bytes");
        t.release_below(20);
        assert_eq!(t.held(), 10, "entries wholly below the checkpoint are dropped");
        t.release_below(20);
        assert_eq!(t.held(), 10);
        t.release_below(21);
        assert_eq!(t.held(), 0);
    }
}
