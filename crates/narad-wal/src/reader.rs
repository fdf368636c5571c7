//! Reading the WAL for the dispatcher: records in sequence order, from any
//! sequence number up to the durable frontier.
//!
//! The reader takes segment bytes from the in-memory tail of the latest
//! group commits when it holds them (the dispatcher reading at the durable
//! frontier), and otherwise reads the file in large chunks; it hands out
//! frames as [`WalEntry`]s that share those chunks (no copy). An entry is
//! not decoded or CRC-checked until asked ([`WalEntry::decode`]), so
//! passing over records that need no work costs a header parse.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::error::WalError;
use crate::frame::FrameHeader;
use crate::limits::{FRAME_HEADER_BYTES, READ_CHUNK_BYTES, SEGMENT_HEADER_BYTES};
use crate::record::{self, WalRecord};
use crate::segment::Segment;
use crate::wal::Shared;

/// One durable frame, not yet decoded.
#[derive(Debug, Clone)]
pub struct WalEntry {
    /// Its sequence number.
    pub seq: u64,
    header: [u8; FRAME_HEADER_BYTES as usize],
    payload: Bytes,
    segment: Arc<Segment>,
    offset: u64,
    /// Taken from the in-memory tail: the very buffer the frame was sealed
    /// in (its CRC computed over these bytes) and then written and synced
    /// from, never read back from the disk.
    from_memory: bool,
}

impl WalEntry {
    /// Checks the CRC (of a frame read from the segment file) and decodes
    /// the record. A frame from the in-memory tail is not CRC-checked
    /// again: its bytes never left this process since its CRC was computed
    /// over them, so the check could not find what it is for (a torn or
    /// damaged write, a bad sector), and cost a second pass over every
    /// record; its header is parsed and its sequence checked all the same,
    /// and its record decoded with every length checked.
    pub fn decode(&self) -> Result<WalRecord, WalError> {
        let corrupt = |reason: String| WalError::Corrupt {
            path: self.segment.path.clone(),
            offset: self.offset,
            reason,
        };
        let header = FrameHeader::parse(&self.header)
            .map_err(|f| corrupt(format!("frame header became unreadable: {f:?}")))?;
        if !self.from_memory && !header.check(&self.header, &self.payload, self.segment.seed) {
            return Err(corrupt(format!("CRC mismatch reading sequence {}", self.seq)));
        }
        record::decode(self.seq, &self.payload)
            .map_err(|e| corrupt(format!("record at sequence {}: {e}", self.seq)))
    }

    /// The encoded record's size in bytes.
    pub fn len(&self) -> usize {
        self.payload.len()
    }

    /// Whether the record is empty (never true for a valid frame).
    pub fn is_empty(&self) -> bool {
        self.payload.is_empty()
    }
}

/// A cursor over the WAL. Not shared: each user has its own.
#[derive(Debug)]
pub struct WalReader {
    shared: Arc<Shared>,
    next_seq: u64,
    /// Where `next_seq` sits, once found.
    pos: Option<(Arc<Segment>, u64)>,
    /// Bytes of the current segment starting at `buf_at`.
    buf: Bytes,
    buf_at: u64,
    /// `buf` came from the in-memory tail.
    buf_from_memory: bool,
}

impl WalReader {
    pub(crate) fn new(shared: Arc<Shared>, seq: u64) -> WalReader {
        WalReader {
            shared,
            next_seq: seq,
            pos: None,
            buf: Bytes::new(),
            buf_at: 0,
            buf_from_memory: false,
        }
    }

    /// The sequence number the next call to [`WalReader::next_entry`] returns.
    pub fn position(&self) -> u64 {
        self.next_seq
    }

    /// Moves the cursor to `seq` (forwards or backwards).
    pub fn seek(&mut self, seq: u64) {
        if seq != self.next_seq {
            self.next_seq = seq;
            self.pos = None;
        }
    }

    /// The next durable record, or `None` at the durable frontier.
    pub fn next_entry(&mut self) -> Result<Option<WalEntry>, WalError> {
        if self.next_seq >= self.shared.durable_next.load(Ordering::Acquire) {
            return Ok(None);
        }
        loop {
            let (segment, offset) = match &self.pos {
                Some((s, o)) => (s.clone(), *o),
                None => self.locate()?,
            };
            if self.next_seq >= segment.end_seq() {
                // This segment is done: the next one starts at next_seq.
                self.pos = None;
                self.buf = Bytes::new();
                let segs = self.shared.segments.read().unwrap_or_else(|p| p.into_inner());
                if !segs.contains_key(&self.next_seq) {
                    return Ok(None); // not created yet
                }
                continue;
            }
            let header_bytes = self.bytes(&segment, offset, FRAME_HEADER_BYTES)?;
            let header = FrameHeader::parse(&header_bytes).map_err(|f| WalError::Corrupt {
                path: segment.path.clone(),
                offset,
                reason: format!("unreadable frame header: {f:?}"),
            })?;
            let frame = self.bytes(&segment, offset, header.frame_len())?;
            if header.seq != self.next_seq {
                return Err(WalError::Corrupt {
                    path: segment.path.clone(),
                    offset,
                    reason: format!("expected sequence {}, found {}", self.next_seq, header.seq),
                });
            }
            let mut h = [0u8; FRAME_HEADER_BYTES as usize];
            h.copy_from_slice(&frame[..FRAME_HEADER_BYTES as usize]);
            let entry = WalEntry {
                seq: header.seq,
                header: h,
                payload: frame.slice(FRAME_HEADER_BYTES as usize..),
                segment: segment.clone(),
                offset,
                // `frame` is a slice of the buffer just read or found.
                from_memory: self.buf_from_memory,
            };
            self.next_seq += 1;
            self.pos = Some((segment, offset + header.frame_len()));
            return Ok(Some(entry));
        }
    }

    /// Finds the segment and byte offset of `next_seq`.
    fn locate(&mut self) -> Result<(Arc<Segment>, u64), WalError> {
        let segment = {
            let segs = self.shared.segments.read().unwrap_or_else(|p| p.into_inner());
            let oldest = segs.keys().next().copied().unwrap_or(0);
            match segs.range(..=self.next_seq).next_back() {
                Some((_, s)) => s.clone(),
                None => return Err(WalError::Compacted { seq: self.next_seq, oldest }),
            }
        };
        let (mut seq, mut offset) =
            segment.index_floor(self.next_seq).unwrap_or((segment.base, SEGMENT_HEADER_BYTES));
        self.buf = Bytes::new();
        while seq < self.next_seq {
            let h = self.bytes(&segment, offset, FRAME_HEADER_BYTES)?;
            let header = FrameHeader::parse(&h).map_err(|f| WalError::Corrupt {
                path: segment.path.clone(),
                offset,
                reason: format!("unreadable frame header while seeking: {f:?}"),
            })?;
            offset += header.frame_len();
            seq += 1;
        }
        self.pos = Some((segment.clone(), offset));
        Ok((segment, offset))
    }

    /// `len` bytes of `segment` at `offset`: from the buffer, else the
    /// in-memory tail, else a new read of the file. Never reads past the
    /// segment's durable length.
    fn bytes(&mut self, segment: &Segment, offset: u64, len: u64) -> Result<Bytes, WalError> {
        let end = offset + len;
        if offset >= self.buf_at && end <= self.buf_at + self.buf.len() as u64 {
            let s = (offset - self.buf_at) as usize;
            return Ok(self.buf.slice(s..s + len as usize));
        }
        let durable = segment.durable_len();
        if end > durable {
            return Err(WalError::Corrupt {
                path: segment.path.clone(),
                offset,
                reason: format!("frame runs past the durable end of the segment ({durable})"),
            });
        }
        let counters = &self.shared.counters;
        if let Some((at, chunk)) = self.shared.tail.find(segment.base, offset, len) {
            counters.read_memory_bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            let s = (offset - at) as usize;
            self.buf = chunk;
            self.buf_at = at;
            self.buf_from_memory = true;
            return Ok(self.buf.slice(s..s + len as usize));
        }
        let want = (len.max(READ_CHUNK_BYTES as u64)).min(durable - offset) as usize;
        // Cleared by hand rather than allocated zeroed: the allocator's
        // zeroed path cost about 6k instructions per read here, against a
        // few hundred to clear the few KiB a read at the frontier takes.
        #[allow(clippy::slow_vector_initialization)] // measured faster here
        let mut buf = Vec::with_capacity(want);
        buf.resize(want, 0u8);
        segment
            .file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| WalError::io("read segment", &segment.path, e))?;
        counters.read_disk_bytes.fetch_add(want as u64, Ordering::Relaxed);
        self.buf = Bytes::from(buf);
        self.buf_at = offset;
        self.buf_from_memory = false;
        Ok(self.buf.slice(0..len as usize))
    }
}
