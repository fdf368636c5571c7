//! Reads by offset.
//!
//! A read snapshots the high watermark and never goes past it, so it only
//! ever touches verified frames. For each frame it needs it asks the
//! decoded-frame cache, else finds the frame's segment and the nearest
//! sparse-index entry below it, walks frame headers forward, reads the frame
//! (through a bounded read-ahead window), checks its CRC and decodes it.
//! Within one read, consecutive frames are walked sequentially.
//!
//! A frame that fails its checks at read time (bit rot after open) is
//! skipped: its offsets are reported in [`ReadBatch::corrupt`], counted, and
//! logged at error level. Where the frame's own header can still be trusted
//! (the next frame's header continues its offsets) exactly its offsets are
//! skipped. Otherwise the read looks for the first later frame that passes
//! its CRC and whose headers chain to the next known-good position (the
//! next sparse-index entry, or the end of the segment), and resumes there;
//! failing that, it skips to that known-good position. A read never panics
//! on bad bytes and never gets stuck: every step moves forward.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use narad_fs::FileRef;
use tracing::error;

use crate::cache::{DecodedFrame, DecodedRecord};
use crate::error::ReadError;
use crate::frame::{self, FRAME_MAGIC, FrameHeader};
use crate::limits::{FRAME_HEADER_LEN, MAX_READ_RECORDS, READ_WINDOW_BYTES};
use crate::log::{PartitionLog, SegFile, lock};
use crate::metrics::Counters;
use crate::{LogRecord, ReadBatch, ReadRequest};

/// Where a read is in a segment.
struct Cursor {
    seg: Arc<SegFile>,
    file: FileRef,
    /// Byte position of the next frame.
    pos: u64,
    /// The offset the frame at `pos` should start with.
    expected: u64,
    /// Verified bytes and offsets of the segment when the cursor was made.
    end_pos: u64,
    end_offset: u64,
    window_pos: u64,
    window: Vec<u8>,
}

impl Cursor {
    /// `len` bytes at `pos` (within the verified part), through the window.
    fn bytes(&mut self, pos: u64, len: usize) -> io::Result<&[u8]> {
        let covered = pos >= self.window_pos
            && pos + len as u64 <= self.window_pos + self.window.len() as u64;
        if !covered {
            let n = (self.end_pos - pos).min(READ_WINDOW_BYTES as u64) as usize;
            self.window.resize(n.max(len), 0);
            self.file.read_exact_at(&mut self.window, pos)?;
            self.window_pos = pos;
        }
        let start = (pos - self.window_pos) as usize;
        Ok(&self.window[start..start + len])
    }

    /// The stored payload of a frame: copied out of the window when small,
    /// read into its own buffer (no copy) when large.
    fn payload(&mut self, pos: u64, len: usize) -> io::Result<Bytes> {
        if len > READ_WINDOW_BYTES / 2 {
            let mut buf = vec![0u8; len];
            self.file.read_exact_at(&mut buf, pos)?;
            return Ok(Bytes::from(buf));
        }
        Ok(Bytes::copy_from_slice(self.bytes(pos, len)?))
    }

    fn header(&mut self, pos: u64) -> io::Result<[u8; FRAME_HEADER_LEN]> {
        Ok(self.bytes(pos, FRAME_HEADER_LEN)?.try_into().expect("header length"))
    }

    /// The first frame at or after byte `from` (and before `bound`, a
    /// known-good (position, offset) pair) that passes its header checks
    /// and its CRC, holds offsets above `expected`, and from which the
    /// headers chain exactly to `bound`. Returns its (position, offset).
    fn resync(
        &mut self,
        from: u64,
        expected: u64,
        bound: (u64, u64),
    ) -> io::Result<Option<(u64, u64)>> {
        let (bound_pos, bound_off) = bound;
        let mut q = from;
        while q + FRAME_HEADER_LEN as u64 <= bound_pos {
            let n = (bound_pos - q).min(READ_WINDOW_BYTES as u64) as usize;
            let window = self.bytes(q, n)?;
            let Some(i) = window.windows(2).position(|w| w == &FRAME_MAGIC[..]) else {
                // Keep the last byte: it may be the first half of a magic.
                q += (n as u64 - 1).max(1);
                continue;
            };
            let cand = q + i as u64;
            q = cand + 1;
            if cand + FRAME_HEADER_LEN as u64 > bound_pos {
                break;
            }
            let raw = self.header(cand)?;
            let Ok(h) = FrameHeader::parse(&raw) else { continue };
            let fits = h.base_offset > expected
                && h.base_offset < bound_off
                && cand + h.frame_len() <= bound_pos;
            if !fits {
                continue;
            }
            let stored = self.payload(cand + FRAME_HEADER_LEN as u64, h.stored_len as usize)?;
            if h.check_crc(self.seg.seed(), &raw, &stored).is_err() {
                continue;
            }
            let (mut p, mut e) = (cand + h.frame_len(), h.end_offset());
            while p < bound_pos {
                match self.plausible_header(p, e)? {
                    Some((next, _)) => {
                        p += next.frame_len();
                        e = next.end_offset();
                    }
                    None => break,
                }
            }
            if p == bound_pos && e == bound_off {
                return Ok(Some((cand, h.base_offset)));
            }
        }
        Ok(None)
    }

    /// Parses the header at `pos` and checks that it continues the offsets
    /// and fits the verified part of the segment.
    fn plausible_header(
        &mut self,
        pos: u64,
        expected: u64,
    ) -> io::Result<Option<(FrameHeader, [u8; FRAME_HEADER_LEN])>> {
        if pos + FRAME_HEADER_LEN as u64 > self.end_pos {
            return Ok(None);
        }
        let raw = self.header(pos)?;
        Ok(FrameHeader::parse(&raw)
            .ok()
            .filter(|h| h.base_offset == expected && pos + h.frame_len() <= self.end_pos)
            .map(|h| (h, raw)))
    }
}

/// The outcome of looking for the frame holding an offset.
enum Step {
    Frame(Arc<DecodedFrame>),
    /// The offsets up to `end` cannot be read: skip them.
    Skip {
        end: u64,
        reason: String,
    },
    Gone {
        oldest: u64,
    },
    End,
}

impl PartitionLog {
    /// Reads up to `max_records` records from offset `from`, stopping before
    /// the record that would take key + payload bytes past `max_bytes` (the
    /// first record is returned whatever its size). A read at or past the
    /// high watermark returns no records. See [`PartitionLog::read_with`].
    pub fn read(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: u64,
    ) -> Result<ReadBatch, ReadError> {
        self.read_with(&ReadRequest { from, max_records, max_bytes, max_commit_time_ms: None })
    }

    /// [`PartitionLog::read`] behind a delay gate: stops at the first record
    /// committed after `max_commit_time_ms` and reports its commit time in
    /// [`ReadBatch::held_back_commit_time_ms`].
    pub fn read_committed_until(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: u64,
        max_commit_time_ms: u64,
    ) -> Result<ReadBatch, ReadError> {
        self.read_with(&ReadRequest {
            from,
            max_records,
            max_bytes,
            max_commit_time_ms: Some(max_commit_time_ms),
        })
    }

    /// Reads records by offset. Offsets below the oldest one give
    /// [`ReadError::Gone`]; offsets whose frame fails its checks are skipped
    /// and listed in [`ReadBatch::corrupt`]; I/O errors are returned.
    pub fn read_with(&self, req: &ReadRequest) -> Result<ReadBatch, ReadError> {
        if self.is_closed() {
            return Err(ReadError::Closed);
        }
        let (hwm, oldest) = {
            let v = self.view_read();
            (v.hwm, v.oldest)
        };
        if req.from < oldest {
            return Err(ReadError::Gone { offset: req.from, oldest });
        }
        let max_records = req.max_records.min(MAX_READ_RECORDS);
        let mut batch =
            ReadBatch { next_offset: req.from, high_watermark: hwm, ..ReadBatch::default() };
        let mut offset = req.from;
        let mut bytes = 0u64;
        let mut cursor = None;
        'frames: while offset < hwm && batch.records.len() < max_records {
            match self.frame_at(offset, &mut cursor)? {
                Step::Frame(f) => {
                    for r in &f.records[(offset - f.base) as usize..] {
                        if let Some(max) = req.max_commit_time_ms
                            && r.commit_time_ms > max
                        {
                            batch.held_back_commit_time_ms = Some(r.commit_time_ms);
                            break 'frames;
                        }
                        let size = (r.payload.len() + r.key.as_ref().map_or(0, Bytes::len)) as u64;
                        if !batch.records.is_empty() && bytes + size > req.max_bytes {
                            break 'frames;
                        }
                        batch.records.push(LogRecord {
                            offset,
                            key: r.key.clone(),
                            commit_time_ms: r.commit_time_ms,
                            payload: r.payload.clone(),
                        });
                        bytes += size;
                        offset += 1;
                        if offset >= hwm || batch.records.len() >= max_records {
                            break 'frames;
                        }
                    }
                }
                Step::Skip { end, reason } => {
                    let end = end.clamp(offset + 1, hwm);
                    Counters::add(&self.counters.corrupt_frames_skipped, 1);
                    Counters::add(&self.counters.corrupt_records_skipped, end - offset);
                    error!(
                        dir = %self.dir.display(), from = offset, to = end, %reason,
                        "partition log: skipping records whose frame failed its checks at read time"
                    );
                    match batch.corrupt.last_mut() {
                        Some(last) if last.end == offset => last.end = end,
                        _ => batch.corrupt.push(offset..end),
                    }
                    offset = end;
                }
                Step::Gone { oldest } => {
                    if batch.records.is_empty() && batch.corrupt.is_empty() {
                        return Err(ReadError::Gone { offset, oldest });
                    }
                    break;
                }
                Step::End => break,
            }
        }
        batch.next_offset = offset;
        Counters::add(&self.counters.records_read, batch.records.len() as u64);
        Ok(batch)
    }

    /// Finds (and decodes) the frame holding `offset`.
    fn frame_at(&self, offset: u64, cursor: &mut Option<Cursor>) -> Result<Step, ReadError> {
        let cached = lock(&self.cache).get(offset);
        if let Some(f) = cached {
            Counters::add(&self.counters.cache_hits, 1);
            if let Some(c) = cursor.as_mut().filter(|c| c.seg.base == f.segment_base) {
                c.pos = f.pos + f.frame_len;
                c.expected = f.end();
            }
            return Ok(Step::Frame(f));
        }
        Counters::add(&self.counters.cache_misses, 1);
        if cursor.as_ref().is_none_or(|c| !(c.expected <= offset && offset < c.end_offset)) {
            *cursor = None;
            match self.locate(offset)? {
                Ok(c) => *cursor = Some(c),
                Err(step) => return Ok(step),
            }
        }
        let c = cursor.as_mut().expect("located above");
        match self.walk(c, offset) {
            Ok(step) => Ok(step),
            // A segment shorter than the view says (cut by someone else):
            // the rest of it is unreadable.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                let (end, path) = (c.end_offset, c.seg.path.clone());
                *cursor = None;
                Ok(Step::Skip {
                    end,
                    reason: format!("{} is shorter than its verified frames: {e}", path.display()),
                })
            }
            Err(e) => Err(ReadError::io("read", &c.seg.path, e)),
        }
    }

    /// A cursor at the sparse-index entry at or below `offset`, or the step
    /// to take instead (gone, end).
    fn locate(&self, offset: u64) -> Result<Result<Cursor, Step>, ReadError> {
        let (seg, pos, expected, end_pos, end_offset) = {
            let v = self.view_read();
            if offset < v.oldest {
                return Ok(Err(Step::Gone { oldest: v.oldest }));
            }
            let Some(s) = v.segment_of(offset) else { return Ok(Err(Step::End)) };
            let (pos, expected) = s.index_start(offset);
            (s.file.clone(), pos, expected, s.end_pos, s.end_offset)
        };
        let file = match self.segment_handle(&seg, end_offset) {
            Ok(f) => f,
            Err(ReadError::Gone { oldest, .. }) => return Ok(Err(Step::Gone { oldest })),
            Err(e) => return Err(e),
        };
        Ok(Ok(Cursor {
            seg,
            file,
            pos,
            expected,
            end_pos,
            end_offset,
            window_pos: 0,
            window: Vec::new(),
        }))
    }

    /// Walks from the cursor to the frame holding `offset` and decodes it.
    fn walk(&self, c: &mut Cursor, offset: u64) -> io::Result<Step> {
        loop {
            let Some((h, raw)) = c.plausible_header(c.pos, c.expected)? else {
                let reason = format!(
                    "frame header at byte {} of {} failed its checks",
                    c.pos,
                    c.seg.path.display()
                );
                match self.skip_damage(c, offset, reason)? {
                    Some(step) => return Ok(step),
                    None => continue,
                }
            };
            if h.end_offset() <= offset {
                c.pos += h.frame_len();
                c.expected = h.end_offset();
                continue;
            }
            let pos = c.pos;
            let stored = c.payload(pos + FRAME_HEADER_LEN as u64, h.stored_len as usize)?;
            let checked = h
                .check_crc(c.seg.seed(), &raw, &stored)
                .and_then(|()| frame::decode_records(&h, stored));
            let records = match checked {
                Ok(r) => r,
                Err(e) => {
                    let reason = format!("frame at byte {pos} of {}: {e}", c.seg.path.display());
                    // The frame's own header may be the damaged part: trust
                    // its length only if the next header continues it.
                    let next = pos + h.frame_len();
                    let continues = (next == c.end_pos && h.end_offset() == c.end_offset)
                        || c.plausible_header(next, h.end_offset())?.is_some();
                    if continues {
                        c.pos = next;
                        c.expected = h.end_offset();
                        return Ok(Step::Skip { end: h.end_offset(), reason });
                    }
                    match self.skip_damage(c, offset, reason)? {
                        Some(step) => return Ok(step),
                        None => continue,
                    }
                }
            };
            c.pos = pos + h.frame_len();
            c.expected = h.end_offset();
            let frame = Arc::new(DecodedFrame {
                base: h.base_offset,
                records: records
                    .into_iter()
                    .map(|e| DecodedRecord {
                        key: e.key,
                        commit_time_ms: e.commit_time_ms,
                        payload: e.payload,
                    })
                    .collect(),
                segment_base: c.seg.base,
                pos,
                frame_len: h.frame_len(),
            });
            lock(&self.cache).insert(frame.clone());
            return Ok(Step::Frame(frame));
        }
    }

    /// Handles a damaged spot at the cursor whose extent is unknown: finds
    /// the first intact frame after it (see [`Cursor::resync`]), else the
    /// next sparse-index entry, else the end of the segment, and moves the
    /// cursor there. Returns the skip when it covers `offset`, or `None` when
    /// `offset` lies beyond the damage (the walk goes on).
    fn skip_damage(&self, c: &mut Cursor, offset: u64, reason: String) -> io::Result<Option<Step>> {
        let next_entry = {
            let v = self.view_read();
            v.segments
                .iter()
                .find(|s| Arc::ptr_eq(&s.file, &c.seg))
                .and_then(|s| s.index_after(c.pos))
        };
        let bound = next_entry
            .filter(|&(_, off)| off > c.expected && off <= c.end_offset)
            .unwrap_or((c.end_pos, c.end_offset));
        let (pos, resume) = c.resync(c.pos + 1, c.expected, bound)?.unwrap_or(bound);
        c.pos = pos;
        c.expected = resume;
        Ok((offset < resume).then_some(Step::Skip { end: resume, reason }))
    }
}
