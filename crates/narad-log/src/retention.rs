//! Retention: deleting sealed segments whose newest record is older than
//! the topic's retention. The broker calls [`PartitionLog::enforce_retention`]
//! (every minute, SPEC §5.6); there is no timer in this crate.
//!
//! * Only sealed segments, oldest first, and never the active (last) one.
//! * A segment's age is the commit time of its newest record (commit times
//!   never decrease along a partition, so the scan stops at the first
//!   segment that is young enough). If that record cannot be read, the first
//!   record of the next segment bounds it from above.
//! * The file is removed first (durably), then the view forgets the segment.
//!   A reader that already holds the file's handle keeps reading it (an
//!   unlinked file stays readable); one that opens it afterwards gets
//!   [`ReadError::Gone`](crate::ReadError::Gone), as does any read below the
//!   new oldest offset.

use std::sync::Arc;

use tracing::{info, warn};

use crate::error::LogError;
use crate::log::{PartitionLog, SegFile, lock};
use crate::metrics::Counters;

/// What one retention pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Segments deleted.
    pub segments_deleted: usize,
    /// Records (offsets) deleted.
    pub records_deleted: u64,
    /// Bytes deleted.
    pub bytes_deleted: u64,
    /// The oldest offset after the pass.
    pub oldest_offset: u64,
}

/// The oldest sealed segment, as the pass needs it.
struct Candidate {
    file: Arc<SegFile>,
    end_offset: u64,
    end_pos: u64,
    newest_ms: Option<u64>,
    last_frame_pos: Option<u64>,
    next: Arc<SegFile>,
    next_first_ms: Option<u64>,
}

impl PartitionLog {
    /// Deletes the sealed segments whose newest record was committed more
    /// than `retention_ms` before `now_ms`. A `retention_ms` of 0 keeps
    /// everything. Stops at the first error (the rest is retried next time).
    pub fn enforce_retention(
        &self,
        now_ms: u64,
        retention_ms: u64,
    ) -> Result<RetentionReport, LogError> {
        let _pass = lock(&self.retention_lock);
        let mut report =
            RetentionReport { oldest_offset: self.oldest_offset(), ..Default::default() };
        if retention_ms == 0 || self.is_closed() {
            return Ok(report);
        }
        let cutoff = now_ms.saturating_sub(retention_ms);
        while let Some(c) = self.oldest_sealed() {
            let Some(newest) = self.newest_time(&c) else { break };
            if newest >= cutoff {
                break;
            }
            match self.fs.remove_file(&c.file.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(LogError::io("remove", &c.file.path, e)),
            }
            {
                let mut v = self.view_write();
                if v.segments.first().is_some_and(|s| Arc::ptr_eq(&s.file, &c.file)) {
                    v.segments.remove(0);
                    v.oldest = c.end_offset;
                }
            }
            lock(&self.open_sealed).retain(|s| !Arc::ptr_eq(s, &c.file));
            *lock(&c.file.handle) = None;
            lock(&self.cache).evict_below(c.end_offset);
            let records = c.end_offset - c.file.base;
            info!(
                file = %c.file.path.display(), records, bytes = c.end_pos, newest_commit_ms = newest,
                "retention: deleted a sealed segment"
            );
            report.segments_deleted += 1;
            report.records_deleted += records;
            report.bytes_deleted += c.end_pos;
            report.oldest_offset = c.end_offset;
            Counters::add(&self.counters.segments_deleted, 1);
            Counters::add(&self.counters.bytes_deleted, c.end_pos);
        }
        Ok(report)
    }

    fn oldest_sealed(&self) -> Option<Candidate> {
        let v = self.view_read();
        let [first, next, ..] = &v.segments[..] else { return None };
        Some(Candidate {
            file: first.file.clone(),
            end_offset: first.end_offset,
            end_pos: first.end_pos,
            newest_ms: first.newest_time_ms,
            last_frame_pos: first.last_frame_pos,
            next: next.file.clone(),
            next_first_ms: next.first_time_ms,
        })
    }

    /// The commit time of the segment's newest record: known, or read from
    /// its last frame (then remembered), or bounded by the next segment's
    /// first record.
    fn newest_time(&self, c: &Candidate) -> Option<u64> {
        match self.segment_newest_ms(&c.file, c.newest_ms, c.last_frame_pos) {
            Some(Ok(t)) => return Some(t),
            Some(Err(e)) => warn!(
                file = %c.file.path.display(), error = %e,
                "retention: cannot read the newest record of a segment; using the next segment's first"
            ),
            None => {}
        }
        if let Some(t) = c.next_first_ms {
            return Some(t);
        }
        match self.frame_times(&c.next, c.next.frames_start()) {
            Ok((first, _)) => {
                if let Some(s) = self.view_write().segment_by_base(c.next.base) {
                    s.first_time_ms = Some(first);
                }
                Some(first)
            }
            Err(e) => {
                warn!(
                    file = %c.next.path.display(), error = %e,
                    "retention: cannot date a sealed segment; keeping it"
                );
                None
            }
        }
    }
}

impl PartitionLog {
    /// The commit time (ms) of the newest record of the segment holding
    /// `offset`: when that segment was last written, the "mtime of the
    /// frontier segment" of SPEC §9's `oldest_unconsumed_message_age_seconds`.
    /// `None` if `offset` is not a committed, retained offset, or the
    /// segment's last frame cannot be read. Known for segments written since
    /// open; read once from the last frame (then remembered) otherwise.
    pub fn segment_written_at_ms(&self, offset: u64) -> Option<u64> {
        let (file, known, last_frame_pos) = {
            let v = self.view_read();
            if offset < v.oldest || offset >= v.hwm {
                return None;
            }
            let s = v.segment_of(offset)?;
            (s.file.clone(), s.newest_time_ms, s.last_frame_pos)
        };
        self.segment_newest_ms(&file, known, last_frame_pos)?.ok()
    }

    /// The commit time of a segment's newest record: `known`, or read from
    /// its last frame (at `last_frame_pos`) and remembered in the view.
    /// `None` for a segment without frames.
    fn segment_newest_ms(
        &self,
        file: &Arc<SegFile>,
        known: Option<u64>,
        last_frame_pos: Option<u64>,
    ) -> Option<Result<u64, LogError>> {
        if let Some(t) = known {
            return Some(Ok(t));
        }
        let read = self.frame_times(file, last_frame_pos?).map(|(_, newest)| newest);
        if let Ok(t) = read
            && let Some(s) = self.view_write().segment_by_base(file.base)
        {
            s.newest_time_ms.get_or_insert(t);
        }
        Some(read)
    }
}
