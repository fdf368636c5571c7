//! Every bound of the HTTP layer.

/// Produce body (exactly 1 MiB allowed).
pub const PRODUCE_BODY_BYTES: usize = 1 << 20;
/// Topic create/alter body.
pub const TOPIC_BODY_BYTES: usize = 1 << 20;
/// Bodies Narad streams into its JSON decoder (users, attach): over the
/// cap is a 400, not a 413.
pub const STREAMED_BODY_BYTES: usize = 1 << 20;
/// Batch produce body, compressed or not, and its decompressed size.
pub const BATCH_BODY_BYTES: usize = 16 << 20;
/// The largest zstd window a compressed request body may ask for (log2):
/// 16 MiB, the batch body cap (the decoder allocates the window up front).
pub const ZSTD_WINDOW_LOG_MAX: u32 = 24;
/// Records per batch produce.
pub const BATCH_MAX_RECORDS: usize = 1_000;
/// Receipt handles per batch ack.
pub const BATCH_ACK_MAX: usize = 100;
/// Batch ack body.
pub const BATCH_ACK_BODY_BYTES: usize = 1 << 20;

const _: () = {
    assert!(PRODUCE_BODY_BYTES <= BATCH_BODY_BYTES);
    // A window the size of the largest body is always allowed.
    assert!(1 << ZSTD_WINDOW_LOG_MAX >= BATCH_BODY_BYTES);
    // A batch record's payload fits in a WAL record.
    assert!(BATCH_BODY_BYTES <= narad_wal::limits::MAX_RECORD_BYTES as usize);
};
