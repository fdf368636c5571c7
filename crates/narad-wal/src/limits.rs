//! Every bound of the ingress WAL, in one place, with the relations between
//! them checked at compile time.

use std::time::Duration;

/// A segment is rolled before a frame would take it past this size.
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// The largest encoded record (a frame's payload).
pub const MAX_RECORD_BYTES: u32 = 16 << 20;

/// Bytes of the segment header at offset 0 of every segment.
pub const SEGMENT_HEADER_BYTES: u64 = 32;

/// Bytes of a frame header.
pub const FRAME_HEADER_BYTES: u64 = 24;

/// The largest topic name a record may carry (SPEC: 255 bytes).
pub const MAX_TOPIC_BYTES: usize = 255;

/// A staging buffer that grew past this is shrunk back after its flush, so a
/// burst does not pin memory for good (two buffers alternate).
pub const STAGING_KEEP_BYTES: usize = 4 << 20;

/// The sync thread wakes on every append; this bounds a missed wakeup.
pub const SYNC_BACKSTOP: Duration = Duration::from_millis(10);

/// After a group commit of at least this many records, the sync thread
/// waits briefly for its callers to come back before the next sync.
pub const GATHER_MIN_GROUP: u64 = 8;

/// The longest that gather wait (it is also at most half the last sync's
/// duration).
pub const GATHER_MAX_WAIT: Duration = Duration::from_micros(400);

/// A stored checkpoint is made durable within this delay (one fdatasync for
/// every store in the burst).
pub const CHECKPOINT_SYNC_DELAY: Duration = Duration::from_millis(250);

/// How often the checkpoint flusher looks for compaction work when idle.
pub const COMPACTION_INTERVAL: Duration = Duration::from_secs(1);

/// A fully dispatched active segment larger than this is rotated so it can
/// be reclaimed: a lightly loaded node keeps its WAL near this size.
pub const ROTATE_DISPATCHED_ACTIVE_BYTES: u64 = 1 << 20;

/// The default zero runway kept after the active segment's frames (see
/// [`WalOptions::runway_bytes`](crate::WalOptions)): groups of up to
/// 64 KiB (64 appenders of 1 KiB) write over it. `narad bench disk`'s 64
/// appenders (60 KiB groups) made a median of 89k appends/s with it
/// against 74k appending (8 interleaved pairs); 1 MiB was no better.
pub const RUNWAY_BYTES: u64 = 512 << 10;

/// The reader fetches at least this much of a segment per read call.
pub const READ_CHUNK_BYTES: usize = 256 << 10;

/// The latest durable chunks kept in memory for readers at the frontier
/// (see `tail`): at most this many bytes. Twice the staging buffer's kept
/// size, so the dispatcher one large group behind still reads from memory.
pub const TAIL_BYTES: usize = 2 * STAGING_KEEP_BYTES;

/// One sparse index entry per this many bytes of a segment (at most).
pub const INDEX_STRIDE_BYTES: u64 = 64 << 10;

/// The largest frame, header included.
pub const MAX_FRAME_BYTES: u64 = FRAME_HEADER_BYTES + MAX_RECORD_BYTES as u64;

const _: () = {
    // A maximal frame always fits in an empty segment, so a roll always
    // makes room and no frame ever spans two segments.
    assert!(SEGMENT_HEADER_BYTES + MAX_FRAME_BYTES <= SEGMENT_BYTES);
    assert!(ROTATE_DISPATCHED_ACTIVE_BYTES < SEGMENT_BYTES);
    assert!(RUNWAY_BYTES <= SEGMENT_BYTES);
    assert!(READ_CHUNK_BYTES as u64 >= FRAME_HEADER_BYTES);
    assert!(INDEX_STRIDE_BYTES >= FRAME_HEADER_BYTES);
};
