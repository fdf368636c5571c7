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
    /// 503: the replicated control plane cannot take the write now (no
    /// leader known); shown as `control plane temporarily unavailable: <why>`.
    #[error("control plane temporarily unavailable: {0}")]
    Unavailable(String),
    /// 502: the leader could not be reached (a transport failure on the way
    /// to it); the text says why.
    #[error("{0}")]
    Upstream(String),
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
            MetaError::Unavailable(_) => 503,
            MetaError::Upstream(_) => 502,
        }
    }

    /// The error as it crosses the node RPC (a follower forwarding a write
    /// to the leader): its status and its `Display` text.
    pub fn to_wire(&self) -> (u16, String) {
        (self.status(), self.to_string())
    }

    /// The error [`MetaError::to_wire`] sent, rebuilt so that its status and
    /// `Display` text are exactly the ones sent (the variant may differ
    /// where two share a status: every 409 comes back as
    /// [`MetaError::Conflict`], every 500 as [`StorageError::Remote`]). A
    /// status no variant has (a peer speaking a newer protocol) comes back
    /// as [`MetaError::Upstream`] naming it.
    pub fn from_wire(status: u16, text: String) -> MetaError {
        fn strip(text: String, prefix: &str) -> Result<String, String> {
            match text.strip_prefix(prefix) {
                Some(rest) => Ok(rest.to_owned()),
                None => Err(text),
            }
        }
        match status {
            404 => MetaError::NotFound(text),
            409 => MetaError::Conflict(text),
            403 => MetaError::Forbidden(text),
            502 => MetaError::Upstream(text),
            400 => match strip(text, "invalid argument: ") {
                Ok(reason) => MetaError::Invalid(reason),
                Err(text) => MetaError::Invalid(text),
            },
            503 => match strip(text, "control plane temporarily unavailable: ") {
                Ok(why) => MetaError::Unavailable(why),
                Err(text) => MetaError::Unavailable(text),
            },
            500 => MetaError::Storage(StorageError::Remote(text)),
            other => MetaError::Upstream(format!("the leader answered status {other}: {text}")),
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
    /// The leader's storage failure, as its text (a 500 that came back over
    /// the node RPC, see [`MetaError::from_wire`]).
    #[error("{0}")]
    Remote(String),
    /// A state-machine snapshot does not decode or fails its checks
    /// (see `storage::snapshot`).
    #[error("metastore snapshot is invalid: {0}")]
    BadSnapshot(String),
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
            (
                MetaError::Unavailable("no leader".into()),
                503,
                "control plane temporarily unavailable: no leader",
            ),
            (MetaError::Upstream("cannot reach n2".into()), 502, "cannot reach n2"),
            (MetaError::Storage(StorageError::Remote("disk".into())), 500, "disk"),
        ];
        for (err, status, text) in cases {
            assert_eq!((err.status(), err.to_string()), (status, text.to_owned()));
            let (wire_status, wire_text) = err.to_wire();
            assert_eq!((wire_status, wire_text.as_str()), (status, text));
            let back = MetaError::from_wire(wire_status, wire_text);
            assert_eq!((back.status(), back.to_string()), (status, text.to_owned()), "{err:?}");
        }
    }

    #[test]
    fn a_wire_error_without_the_usual_prefix_or_with_an_unknown_status_keeps_its_text() {
        let e = MetaError::from_wire(500, "metastore is corrupt: x".into());
        assert_eq!((e.status(), e.to_string().as_str()), (500, "metastore is corrupt: x"));
        let e = MetaError::from_wire(503, "busy".into());
        assert_eq!(e.to_string(), "control plane temporarily unavailable: busy");
        let e = MetaError::from_wire(418, "teapot".into());
        assert_eq!(
            (e.status(), e.to_string().as_str()),
            (502, "the leader answered status 418: teapot")
        );
    }
}
