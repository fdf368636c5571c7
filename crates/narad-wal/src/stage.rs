//! Staging: where appenders put encoded frames for the next group commit.
//!
//! Appenders encode their frames, under the append lock, straight into the
//! staging buffer, taking consecutive sequence numbers. The sync thread
//! swaps the whole staging area out (the two buffers alternate), writes it
//! and syncs it, and completes the [`Group`] every appender of that round is
//! waiting on.
//!
//! Staged bytes are a list of *chunks*, one per segment they go to: a frame
//! that does not fit the active segment rolls it, and the frames after it go
//! to a new chunk that starts with the new segment's header. Each chunk is
//! one `pwrite` + `fdatasync`, so a chunk is the "write" of the frame
//! format's `write_index`, and a sealed segment is always synced before its
//! successor exists.

use std::sync::Arc;

use crate::frame::{FrameSeed, begin_frame, new_salt, seal_frame, segment_header};
use crate::group::Group;
use crate::limits::{FRAME_HEADER_BYTES, SEGMENT_HEADER_BYTES, STAGING_KEEP_BYTES};
use crate::record::RecordRef;

/// Bytes bound for one segment, written with one `pwrite` and one
/// `fdatasync`.
#[derive(Debug)]
pub(crate) struct Chunk {
    /// Base sequence number of the target segment.
    pub segment: u64,
    /// Whether the segment file must be created first (the bytes then start
    /// with its header, at offset 0).
    pub create: bool,
    /// Byte offset in the segment where `bytes` go.
    pub offset: u64,
    /// Encoded frames (and the segment header if `create`).
    pub bytes: Vec<u8>,
    /// The salt in the header of a segment this chunk creates (0 otherwise).
    pub salt: u64,
    /// Sequence number of the first frame in `bytes`.
    pub first_seq: u64,
    /// One past the last frame's sequence number.
    pub end_seq: u64,
    /// Bytes written by its flush (set once `bytes` went to the tail).
    pub written: usize,
}

/// The append side's state, guarded by the append lock.
#[derive(Debug)]
pub(crate) struct Stage {
    /// Next sequence number to hand out.
    pub next_seq: u64,
    /// Base of the segment receiving new frames.
    pub active_base: u64,
    /// Byte offset where the next frame goes in the active segment.
    pub active_end: u64,
    /// The seed the active segment's frames are sealed with.
    pub active_seed: FrameSeed,
    /// The active segment takes no more frames (it is an older binary's,
    /// unsalted): the next record rolls first.
    pub roll_first: bool,
    /// Staged, not yet taken by the sync thread.
    pub chunks: Vec<Chunk>,
    /// The other staging buffer, returned by the sync thread after a flush.
    pub spare: Vec<u8>,
    /// Completion of whatever is staged now.
    pub group: Arc<Group>,
    /// The sync thread is parked waiting for work.
    pub sync_waiting: bool,
    /// While it is parked, the sync thread wants waking only once
    /// `next_seq` reaches this (0 while it waits for any record): a gather
    /// wait is not woken by every returning caller, only by the one that
    /// completes it.
    pub sync_wake_at_seq: u64,
    /// Close was requested: drain and stop.
    pub closing: bool,
    /// Segment size limit.
    segment_bytes: u64,
}

/// A point to roll back to if staging a batch fails.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    next_seq: u64,
    active_base: u64,
    active_end: u64,
    active_seed: FrameSeed,
    roll_first: bool,
    chunks: usize,
    last_chunk_len: usize,
    last_chunk_end_seq: u64,
}

impl Stage {
    pub(crate) fn new(
        next_seq: u64,
        active_base: u64,
        active_end: u64,
        active_seed: FrameSeed,
        segment_bytes: u64,
    ) -> Stage {
        Stage {
            segment_bytes,
            next_seq,
            active_base,
            active_end,
            active_seed,
            roll_first: false,
            chunks: Vec::new(),
            spare: Vec::new(),
            group: Arc::new(Group::default()),
            sync_waiting: false,
            sync_wake_at_seq: 0,
            closing: false,
        }
    }

    /// Whether a record just staged should wake the parked sync thread: it
    /// is parked and `next_seq` has reached what it waits for. Clears
    /// [`sync_waiting`](Self::sync_waiting) when it answers yes, so one
    /// wake-up is sent, not one per record.
    pub(crate) fn take_sync_wake(&mut self) -> bool {
        let wake = self.sync_waiting && self.next_seq >= self.sync_wake_at_seq;
        if wake {
            self.sync_waiting = false;
        }
        wake
    }

    /// Starts a new segment at the next sequence number, with a fresh salt.
    /// Fails (changing nothing) only if the system has no randomness to give.
    pub(crate) fn roll(&mut self) -> std::io::Result<()> {
        let salt = new_salt()?;
        let base = self.next_seq;
        self.active_base = base;
        self.active_end = SEGMENT_HEADER_BYTES;
        self.active_seed = FrameSeed::of_salt(salt);
        self.roll_first = false;
        self.chunks.push(Chunk {
            segment: base,
            create: true,
            offset: 0,
            bytes: segment_header(base, salt).to_vec(),
            salt,
            first_seq: base,
            end_seq: base,
            written: 0,
        });
        Ok(())
    }

    /// Encodes one record as a frame into the staging area; returns its
    /// sequence number. `len` is the record's checked encoded length. Fails
    /// (staging nothing) only if a roll it needs fails ([`Stage::roll`]).
    pub(crate) fn stage(&mut self, rec: &RecordRef<'_>, len: u32) -> std::io::Result<u64> {
        let frame_len = FRAME_HEADER_BYTES + u64::from(len);
        if self.roll_first
            || (self.active_end + frame_len > self.segment_bytes
                && self.active_end > SEGMENT_HEADER_BYTES)
        {
            self.roll()?;
        }
        if self.chunks.last().is_none_or(|c| c.segment != self.active_base) {
            let bytes = std::mem::take(&mut self.spare);
            self.chunks.push(Chunk {
                segment: self.active_base,
                create: false,
                offset: self.active_end,
                bytes,
                salt: 0,
                first_seq: self.next_seq,
                end_seq: self.next_seq,
                written: 0,
            });
        }
        let seq = self.next_seq;
        let chunk = self.chunks.last_mut().expect("a chunk was just ensured");
        let write_index = (seq - chunk.first_seq) as u32;
        chunk.bytes.reserve(frame_len as usize);
        let at = begin_frame(&mut chunk.bytes, len, seq, write_index);
        rec.encode_into(&mut chunk.bytes);
        debug_assert_eq!(chunk.bytes.len() - at, frame_len as usize);
        seal_frame(&mut chunk.bytes, at, self.active_seed);
        chunk.end_seq = seq + 1;
        self.next_seq = seq + 1;
        self.active_end += frame_len;
        Ok(seq)
    }

    /// Remembers the current staging state.
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            next_seq: self.next_seq,
            active_base: self.active_base,
            active_end: self.active_end,
            active_seed: self.active_seed,
            roll_first: self.roll_first,
            chunks: self.chunks.len(),
            last_chunk_len: self.chunks.last().map_or(0, |c| c.bytes.len()),
            last_chunk_end_seq: self.chunks.last().map_or(0, |c| c.end_seq),
        }
    }

    /// Withdraws everything staged since `mark` and gives the sequence
    /// numbers back. Only valid while the append lock was held since `mark`.
    pub(crate) fn rollback(&mut self, mark: Mark) {
        while self.chunks.len() > mark.chunks {
            let chunk = self.chunks.pop().expect("len > mark");
            if !chunk.create && self.spare.capacity() == 0 {
                let mut bytes = chunk.bytes;
                bytes.clear();
                self.spare = bytes;
            }
        }
        if let Some(last) = self.chunks.last_mut() {
            last.bytes.truncate(mark.last_chunk_len);
            last.end_seq = mark.last_chunk_end_seq;
        }
        self.next_seq = mark.next_seq;
        self.active_base = mark.active_base;
        self.active_end = mark.active_end;
        self.active_seed = mark.active_seed;
        self.roll_first = mark.roll_first;
    }

    /// Takes the staged chunks and their group for a flush.
    pub(crate) fn take(&mut self) -> (Vec<Chunk>, Arc<Group>) {
        let chunks = std::mem::take(&mut self.chunks);
        let group = std::mem::replace(&mut self.group, Arc::new(Group::default()));
        (chunks, group)
    }

    /// Gives a flushed buffer back, to alternate with the other one.
    pub(crate) fn recycle(&mut self, mut bytes: Vec<u8>) {
        if self.spare.capacity() == 0 {
            bytes.clear();
            if bytes.capacity() > STAGING_KEEP_BYTES {
                bytes.shrink_to(STAGING_KEEP_BYTES);
            }
            self.spare = bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::SEGMENT_BYTES;

    fn rec(payload: &[u8]) -> RecordRef<'_> {
        RecordRef {
            topic: "t",
            incarnation: None,
            key: None,
            partition: 0,
            accepted_at_ms: 0,
            payload,
        }
    }

    #[test]
    fn a_parked_sync_thread_is_woken_once_by_the_record_it_waits_for() {
        let payload = [7u8; 16];
        let r = rec(&payload);
        let len = r.encoded_len().unwrap();
        let mut st = Stage::new(100, 0, SEGMENT_HEADER_BYTES, FrameSeed::UNSALTED, SEGMENT_BYTES);
        // Not parked: nobody to wake.
        st.stage(&r, len).unwrap();
        assert!(!st.take_sync_wake());
        // Parked in a gather wait for sequence 105: records 101..104 staged
        // on the way there do not wake it; the one that reaches it does.
        st.sync_waiting = true;
        st.sync_wake_at_seq = 105;
        for _ in 101..104 {
            st.stage(&r, len).unwrap();
            assert!(!st.take_sync_wake(), "next_seq {}", st.next_seq);
        }
        st.stage(&r, len).unwrap();
        assert_eq!(st.next_seq, 105);
        assert!(st.take_sync_wake());
        // One wake-up per park.
        st.stage(&r, len).unwrap();
        assert!(!st.take_sync_wake());
        // Parked for any record (the idle wait).
        st.sync_waiting = true;
        st.sync_wake_at_seq = 0;
        st.stage(&r, len).unwrap();
        assert!(st.take_sync_wake());
    }

    #[test]
    fn a_frame_that_does_not_fit_rolls_the_segment_into_a_new_chunk() {
        let payload = vec![1u8; 1 << 20];
        let r = rec(&payload);
        let len = r.encoded_len().unwrap();
        let frame = FRAME_HEADER_BYTES + u64::from(len);
        let mut st = Stage::new(0, 0, SEGMENT_HEADER_BYTES, FrameSeed::UNSALTED, SEGMENT_BYTES);
        let per_segment = (SEGMENT_BYTES - SEGMENT_HEADER_BYTES) / frame;
        for _ in 0..per_segment {
            st.stage(&r, len).unwrap();
        }
        assert_eq!(st.chunks.len(), 1);
        let seq = st.stage(&r, len).unwrap();
        assert_eq!(st.chunks.len(), 2);
        let new = &st.chunks[1];
        assert!(new.create);
        assert_eq!((new.segment, new.first_seq, new.end_seq), (seq, seq, seq + 1));
        assert_eq!(new.bytes.len() as u64, SEGMENT_HEADER_BYTES + frame);
        assert!(st.chunks[0].offset + st.chunks[0].bytes.len() as u64 <= SEGMENT_BYTES);
    }

    #[test]
    fn rollback_withdraws_frames_and_gives_sequence_numbers_back() {
        let mut st = Stage::new(10, 10, SEGMENT_HEADER_BYTES, FrameSeed::UNSALTED, SEGMENT_BYTES);
        let r = rec(b"abc");
        let len = r.encoded_len().unwrap();
        st.stage(&r, len).unwrap();
        let mark = st.mark();
        let before = st.chunks[0].bytes.clone();
        st.stage(&r, len).unwrap();
        st.roll().unwrap();
        st.stage(&r, len).unwrap();
        st.rollback(mark);
        assert_eq!(st.next_seq, 11);
        assert_eq!(st.chunks.len(), 1);
        assert_eq!(st.chunks[0].bytes, before);
        assert_eq!(st.chunks[0].end_seq, 11);
        assert_eq!(st.active_seed, FrameSeed::UNSALTED, "the roll is undone with its seed");
        assert_eq!(st.stage(&r, len).unwrap(), 11);
    }
}
