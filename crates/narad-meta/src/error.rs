//! The metastore's one error enum, and the storage errors it wraps.
//!
//! Each [`MetaError`] variant has exactly one HTTP status ([`MetaError::status`]),
//! so the API layer maps errors with one exhaustive match and sends
//! `{"error": err.to_string()}`. The `Display` texts are the wire texts.

use std::io;
use std::path::PathBuf;

/// Everything a metastore read or write can fail with.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// 404: the topic (or member) does not exist. The text is the wire text,
    /// e.g. `topic not found`.
    #[error("{0}")]
    NotFound(String),
    /// 409: the name is taken, e.g. `topic already exists`.
    #[error("{0}")]
    AlreadyExists(String),
    /// 400: the request breaks a validation rule; shown as
    /// `invalid argument: <reason>`.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// 409: the request conflicts with the current state (fan-out roles,
    /// child limit, schema managed by a parent, a changed incarnation).
    #[error("{0}")]
    Conflict(String),
    /// 403: the change is never allowed, whoever asks (the root user's
    /// protections), e.g. `cannot delete the root user`.
    #[error("{0}")]
    Forbidden(String),
    /// 500: the metastore could not read or persist its state.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl MetaError {
    /// The HTTP status this error maps to.
    pub fn status(&self) -> u16 {
        match self {
            MetaError::NotFound(_) => 404,
            MetaError::AlreadyExists(_) | MetaError::Conflict(_) => 409,
            MetaError::Invalid(_) => 400,
            MetaError::Forbidden(_) => 403,
            MetaError::Storage(_) => 500,
        }
    }

    pub(crate) fn topic_not_found() -> Self {
        MetaError::NotFound("topic not found".to_owned())
    }

    pub(crate) fn user_not_found() -> Self {
        MetaError::NotFound("not found".to_owned())
    }
}

/// A failure of the metastore's storage. Once a commit has failed the store
/// is poisoned: every later write fails with [`StorageError::Poisoned`] until
/// the process reopens the store (reads keep serving the last applied state).
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A file-system operation failed (creating the directory or the file).
    #[error("metastore {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error, kept whole.
        #[source]
        source: io::Error,
    },
    /// redb failed to open, read or commit.
    #[error("metastore {context}: {source}")]
    Redb {
        /// What was being done.
        context: &'static str,
        /// redb's error, kept whole.
        #[source]
        source: Box<redb::Error>,
    },
    /// The stored state does not decode or breaks an invariant.
    #[error("metastore is corrupt: {0}")]
    Corrupt(String),
    /// The file was written by a newer (or unknown) format.
    #[error(
        "metastore format version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedFormat {
        /// The version found in the file.
        found: u64,
        /// The version this build reads and writes.
        supported: u64,
    },
    /// Opening the metastore failed; names the file.
    #[error("cannot open the metastore {path}: {source}")]
    Open {
        /// The metastore file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<StorageError>,
    },
    /// The metastore is behind its applied-index record: it was rolled back
    /// (an older copy restored, a damaged newest commit).
    #[error(
        "its applied index {applied} is behind the applied index {recorded} in {record}: the metastore was rolled back (an older copy, or a lost commit) and would forget acknowledged changes; restore the newest copy"
    )]
    RolledBack {
        /// The metastore's applied index.
        applied: u64,
        /// The index the record holds.
        recorded: u64,
        /// The record file.
        record: PathBuf,
    },
    /// The metastore file is missing although its applied-index record
    /// exists: it was deleted or moved.
    #[error(
        "the file is missing but {record} says applied index {recorded} was reached: refusing to start with an empty metastore; restore the file"
    )]
    Missing {
        /// The index the record holds.
        recorded: u64,
        /// The record file.
        record: PathBuf,
    },
    /// The applied-index record cannot be read or is damaged.
    #[error("applied-index record {0}")]
    Record(String),
    /// An earlier commit failed; the store refuses writes until reopened.
    #[error("metastore is unavailable after an earlier storage failure: {first}")]
    Poisoned {
        /// The first failure, as text.
        first: String,
    },
}

impl StorageError {
    pub(crate) fn redb(context: &'static str, source: impl Into<redb::Error>) -> Self {
        StorageError::Redb { context, source: Box::new(source.into()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_one_status_and_shows_its_wire_text() {
        let cases = [
            (MetaError::topic_not_found(), 404, "topic not found"),
            (MetaError::AlreadyExists("topic already exists".into()), 409, "topic already exists"),
            (MetaError::Invalid("name required".into()), 400, "invalid argument: name required"),
            (MetaError::Conflict("c".into()), 409, "c"),
            (MetaError::user_not_found(), 404, "not found"),
            (MetaError::Forbidden("no".into()), 403, "no"),
            (MetaError::Storage(StorageError::Corrupt("x".into())), 500, "metastore is corrupt: x"),
        ];
        for (err, status, text) in cases {
            assert_eq!((err.status(), err.to_string()), (status, text.to_owned()));
        }
    }
}
