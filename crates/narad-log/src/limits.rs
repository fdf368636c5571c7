//! Every bound of the partition log, in one place.
//!
//! A length read from disk is checked against these before anything is
//! allocated for it, and a commit is checked against them before it is
//! queued. The `const` assertions at the bottom state how the bounds relate;
//! change one and the build tells you which others must move with it.

/// Bytes in a frame header (magic, flags, count, base offset, two sizes, CRC).
pub const FRAME_HEADER_LEN: usize = 27;

/// Bytes in a (format 2) segment header (magic, version, flags, base offset,
/// salt, CRC).
pub const SEGMENT_HEADER_LEN: usize = 32;

/// The largest frame payload, stored or uncompressed, that is ever written or
/// read (SPEC §5.2: "sizes > 256 MiB rejected").
pub const MAX_FRAME_BYTES: u64 = 256 << 20;

/// The most uncompressed payload bytes the writer puts in one frame; a commit
/// cycle with more is split into several frames (SPEC §5.2: "≤ 128 MiB
/// frames"). [`LogConfig::frame_target_bytes`](crate::LogConfig) may lower it.
pub const MAX_FRAME_TARGET_BYTES: u64 = 128 << 20;

/// The default split point of a commit cycle into frames. A read of one
/// record costs reading and checking its whole frame, so frames are kept
/// small; one commit cycle still costs one fdatasync however many frames it
/// writes.
pub const DEFAULT_FRAME_TARGET_BYTES: u64 = 1 << 20;

/// The smallest allowed frame split point.
pub const MIN_FRAME_TARGET_BYTES: u64 = 1 << 10;

/// The most records the writer puts in one frame.
pub const MAX_FRAME_RECORDS_WRITTEN: u32 = 1 << 16;

/// The envelope's fixed part: version byte, a one-byte key tag, commit time.
pub const MIN_ENVELOPE_LEN: usize = 1 + 1 + 8;

/// A record inside a frame payload: a u32 length and at least the envelope.
pub const MIN_RECORD_WIRE_LEN: usize = 4 + MIN_ENVELOPE_LEN;

/// The most records a frame read from disk may claim: more than can fit in a
/// maximal payload is corruption, refused before allocating.
pub const MAX_FRAME_RECORDS_READ: u64 = MAX_FRAME_BYTES / MIN_RECORD_WIRE_LEN as u64;

/// The largest key of a record.
pub const MAX_KEY_BYTES: u64 = 16 << 20;

/// The largest key plus payload of one record.
pub const MAX_RECORD_BYTES: u64 = 64 << 20;

/// The most bytes one uvarint key tag may take (a tag ≤ `MAX_KEY_BYTES + 1`
/// fits in 4; 5 is the LEB128 length of any u32).
pub const MAX_KEY_TAG_LEN: usize = 5;

/// The largest envelope of one record.
pub const MAX_ENVELOPE_LEN: u64 = 1 + MAX_KEY_TAG_LEN as u64 + 8 + MAX_RECORD_BYTES;

/// The most records of one `commit` call.
pub const MAX_COMMIT_RECORDS: usize = 1 << 20;

/// The most key + payload bytes of one `commit` call.
pub const MAX_COMMIT_BYTES: u64 = 512 << 20;

/// A commit cycle stops draining queued batches once it holds this many
/// records (it always takes at least one batch whole).
pub const CYCLE_DRAIN_RECORDS: usize = 1 << 16;

/// A commit cycle stops draining queued batches once it holds this many key
/// + payload bytes (it always takes at least one batch whole).
pub const CYCLE_DRAIN_BYTES: u64 = 64 << 20;

/// The default segment size (SPEC §5.1).
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;

/// The smallest segment size (tests use small segments to exercise rolls).
pub const MIN_SEGMENT_BYTES: u64 = 256;

/// The largest segment size. A segment may exceed its size by one frame;
/// positions in the sparse index are u32.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;

/// The default spacing of sparse-index entries, in file bytes.
pub const DEFAULT_INDEX_STRIDE_BYTES: u64 = 64 << 10;

/// The smallest index stride.
pub const MIN_INDEX_STRIDE_BYTES: u64 = 1 << 10;

/// The default byte budget of the decoded-frame cache of one log (SPEC §5.3).
pub const DEFAULT_CACHE_BYTES: u64 = 8 << 20;

/// The default number of frames in the decoded-frame cache of one log.
pub const DEFAULT_CACHE_FRAMES: usize = 64;

/// How many sealed-segment file handles one log keeps open for readers.
pub const MAX_OPEN_SEALED_FILES: usize = 2;

/// The read buffer used to scan segments on open (freed when open returns).
pub const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// How far ahead a reader fetches frame bytes in one `pread`.
pub const READ_WINDOW_BYTES: usize = 256 << 10;

/// The most records one read returns.
pub const MAX_READ_RECORDS: usize = 1 << 16;

/// The default bound of a commit leader's linger (see
/// [`LogConfig::commit_linger_us`](crate::LogConfig)), in µs.
pub const DEFAULT_COMMIT_LINGER_US: u64 = 200;

/// The largest allowed linger, in µs.
pub const MAX_COMMIT_LINGER_US: u64 = 10_000;

/// The default zero runway kept after the active segment's data (see
/// [`LogConfig::runway_bytes`](crate::LogConfig)).
pub const DEFAULT_RUNWAY_BYTES: u64 = 256 << 10;

/// The largest allowed runway.
pub const MAX_RUNWAY_BYTES: u64 = 16 << 20;

/// The highest zstd level accepted in the config.
pub const MAX_ZSTD_LEVEL: i32 = 22;

/// The length of the `consumer.offset` file.
pub const CONSUMER_OFFSET_FILE_LEN: u64 = 28;

/// Files larger than this are refused when reading `consumer.offset`.
pub const CONSUMER_OFFSET_MAX_READ: u64 = 64;

// The relations between the bounds.
const _: () = assert!(MAX_FRAME_TARGET_BYTES <= MAX_FRAME_BYTES / 2);
// zstd's worst case expands input by well under 1/128 plus a constant: a
// maximal split frame still fits the read bound after compression.
const _: () =
    assert!(MAX_FRAME_TARGET_BYTES + MAX_FRAME_TARGET_BYTES / 128 + (1 << 20) <= MAX_FRAME_BYTES);
const _: () = assert!(MIN_FRAME_TARGET_BYTES <= DEFAULT_FRAME_TARGET_BYTES);
const _: () = assert!(DEFAULT_FRAME_TARGET_BYTES <= MAX_FRAME_TARGET_BYTES);
// One maximal record (with its length prefix) fits a frame on its own.
const _: () = assert!(4 + MAX_ENVELOPE_LEN <= MAX_FRAME_TARGET_BYTES);
const _: () = assert!(MAX_KEY_BYTES <= MAX_RECORD_BYTES);
const _: () = assert!(MAX_KEY_BYTES + 1 < 1 << 28); // the key tag fits 4 LEB128 bytes
const _: () = assert!(MAX_RECORD_BYTES <= MAX_COMMIT_BYTES);
const _: () = assert!(CYCLE_DRAIN_BYTES <= MAX_COMMIT_BYTES);
const _: () = assert!(MAX_FRAME_RECORDS_WRITTEN as usize <= CYCLE_DRAIN_RECORDS);
const _: () = assert!(MAX_FRAME_RECORDS_READ <= i32::MAX as u64);
const _: () = assert!(MAX_FRAME_BYTES <= i32::MAX as u64);
// Sparse-index positions and relative offsets are u32: a segment is at most
// its size plus one maximal frame.
const _: () =
    assert!(MAX_SEGMENT_BYTES + FRAME_HEADER_LEN as u64 + MAX_FRAME_BYTES < u32::MAX as u64);
const _: () = assert!(MIN_SEGMENT_BYTES >= FRAME_HEADER_LEN as u64 + MIN_RECORD_WIRE_LEN as u64);
const _: () = assert!(DEFAULT_SEGMENT_BYTES <= MAX_SEGMENT_BYTES);
const _: () = assert!(MIN_INDEX_STRIDE_BYTES <= DEFAULT_INDEX_STRIDE_BYTES);
const _: () = assert!(READ_WINDOW_BYTES as u64 >= MIN_INDEX_STRIDE_BYTES);
const _: () = assert!(CONSUMER_OFFSET_FILE_LEN <= CONSUMER_OFFSET_MAX_READ);
const _: () = assert!(MAX_READ_RECORDS <= CYCLE_DRAIN_RECORDS);
const _: () = assert!(DEFAULT_COMMIT_LINGER_US <= MAX_COMMIT_LINGER_US);
