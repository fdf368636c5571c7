//! The errors of the partition log, one enum per kind of call.
//!
//! Every error is `Clone`: a commit cycle hands the same outcome to every
//! caller combined into it, so I/O errors are kept behind an `Arc`.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// An error of opening, committing to, or maintaining a partition log.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LogError {
    /// A file operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done (`"fdatasync"`, `"open"`, …).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The log on disk is damaged where recovery may not repair it (a bad
    /// frame with valid frames after it, a damaged sealed segment, a gap).
    /// Opening stops; an operator must look at the named file and offset.
    #[error("corrupt partition log {} at byte {offset}: {reason}", path.display())]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// The byte offset in that file.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A frame read back after its fdatasync did not match what was written.
    /// The commit failed and its bytes were truncated away.
    #[error("read-back of {} at byte {offset} failed: {reason}", path.display())]
    VerifyFailed {
        /// The segment file.
        path: PathBuf,
        /// The byte offset of the frame.
        offset: u64,
        /// What did not match.
        reason: String,
    },
    /// The log was closed (see [`PartitionLog::close`](crate::PartitionLog::close)):
    /// nothing was appended.
    #[error("partition log is closed")]
    Closed,
    /// An earlier failure could not be cleaned up (the truncation back to the
    /// high watermark failed): the log refuses every commit until it is
    /// reopened, which rescans and truncates.
    #[error("partition log is poisoned by an earlier failure: {source}")]
    Poisoned {
        /// The failure that poisoned it.
        #[source]
        source: Arc<LogError>,
    },
    /// A record or commit over a bound of [`crate::limits`]; nothing was
    /// queued.
    #[error("{what} is {len}, more than the {max} allowed")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size.
        len: u64,
        /// The bound.
        max: u64,
    },
    /// A frame could not be encoded (compression failed).
    #[error("could not encode a frame: {source}")]
    Encode {
        /// Why.
        #[source]
        source: crate::frame::FrameError,
    },
    /// A commit of no records.
    #[error("a commit needs at least one record")]
    EmptyCommit,
    /// The configuration is invalid.
    #[error("invalid partition log configuration: {0}")]
    InvalidConfig(String),
    /// A commit cycle panicked; its callers get this and the log is poisoned.
    #[error("a commit cycle panicked")]
    CyclePanicked,
}

impl LogError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        LogError::Io { op, path: path.into(), source: Arc::new(source) }
    }

    /// Whether the root cause is a full disk (`ENOSPC`).
    pub fn is_no_space(&self) -> bool {
        match self {
            LogError::Io { source, .. } => narad_fs::is_no_space(source),
            LogError::Poisoned { source } => source.is_no_space(),
            _ => false,
        }
    }
}

/// An error of a read by offset. A frame that fails its CRC is not an error:
/// it is skipped and reported in [`ReadBatch::corrupt`](crate::ReadBatch).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    /// The offset was removed by retention (HTTP 410 at the API).
    #[error("offset {offset} is gone: retention removed it (oldest is {oldest})")]
    Gone {
        /// The offset asked for.
        offset: u64,
        /// The oldest offset still in the log.
        oldest: u64,
    },
    /// The log was closed.
    #[error("partition log is closed")]
    Closed,
    /// Reading a segment failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: Arc<io::Error>,
    },
}

impl ReadError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        ReadError::Io { op, path: path.into(), source: Arc::new(source) }
    }
}

/// An error of the `consumer.offset` file.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FrontierError {
    /// Reading or writing the file failed (a missing partition directory is
    /// reported here too: the file is never written into a recreated one).
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The file exists but is not a valid frontier file.
    #[error("corrupt consumer offset file {}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}
