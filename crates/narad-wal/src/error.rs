//! The WAL's one error enum. Errors are `Clone` because one failed group
//! commit answers every caller in it with the same error.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::record::RecordError;

/// Everything that can go wrong in the ingress WAL.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WalError {
    /// The record itself is not acceptable (too large, bad topic). Nothing
    /// was staged.
    #[error("record refused: {0}")]
    Record(#[from] RecordError),

    /// A write or fsync failed. The WAL is latched: this error answers every
    /// later append until the WAL is reopened (a restart rescans and
    /// truncates the torn tail). Never retried.
    #[error("ingress WAL failed ({op} {path}): {source}; every append fails until restart")]
    Latched {
        /// What failed: `write`, `fdatasync`, `create segment`.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The kernel's error.
        #[source]
        source: Arc<io::Error>,
    },

    /// The next segment could not be created (out of file descriptors, no
    /// inode left): the group commit that needed it failed before any byte
    /// reached the new file, so the WAL is not latched and the next append
    /// retries the roll.
    #[error(
        "ingress WAL could not create its next segment {path}: {source}; nothing was written, retry"
    )]
    SegmentUnavailable {
        /// The segment file.
        path: PathBuf,
        /// The kernel's error.
        #[source]
        source: Arc<io::Error>,
    },

    /// An I/O error outside the append path (open, read, checkpoint).
    #[error("ingress WAL I/O error ({op} {path}): {source}")]
    Io {
        /// What failed.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The kernel's error.
        #[source]
        source: Arc<io::Error>,
    },

    /// Damage that recovery must not repair by itself.
    #[error("corrupt ingress WAL: {path} at byte offset {offset}: {reason}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Byte offset of the damage in that file.
        offset: u64,
        /// What is wrong.
        reason: String,
    },

    /// A checkpoint store asked for a value the WAL cannot hold.
    #[error("checkpoint {requested} is beyond the durable end of the WAL ({durable_next})")]
    CheckpointBeyondEnd {
        /// The value asked for.
        requested: u64,
        /// The first sequence number not yet durable.
        durable_next: u64,
    },

    /// A reader asked for a record that compaction already removed.
    #[error("sequence number {seq} was compacted away (oldest kept: {oldest})")]
    Compacted {
        /// The sequence number asked for.
        seq: u64,
        /// The oldest sequence number still in the WAL.
        oldest: u64,
    },

    /// The WAL was closed.
    #[error("ingress WAL is closed")]
    Closed,
}

impl WalError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, e: io::Error) -> WalError {
        WalError::Io { op, path: path.into(), source: Arc::new(e) }
    }

    /// Whether the disk was full when the WAL latched.
    pub fn is_no_space(&self) -> bool {
        match self {
            WalError::Latched { source, .. }
            | WalError::SegmentUnavailable { source, .. }
            | WalError::Io { source, .. } => narad_fs::is_no_space(source),
            _ => false,
        }
    }

    /// Whether the append failed without latching the WAL and without
    /// writing anything, so the same append may simply be tried again.
    pub fn is_retriable(&self) -> bool {
        matches!(self, WalError::SegmentUnavailable { .. })
    }
}
