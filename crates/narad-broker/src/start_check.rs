//! Start-up checks that the metastore and the data beside it belong
//! together, run before anything is opened or removed. The broker deletes
//! the files of topics the metastore does not know and discards WAL records
//! of deleted incarnations; both are right only if the metastore is the
//! newest one. These checks refuse to start, naming the file and what
//! disagrees, when it visibly is not:
//!
//! * the metastore file is missing while `topics/` or the ingress WAL
//!   directory holds anything (an empty metastore would be created and
//!   every topic's files deleted);
//! * a topic directory's incarnation marker names an incarnation above the
//!   metastore's applied index (incarnations are the index of the command
//!   that created them, so the metastore is older than the topic);
//! * an ingress WAL record carries a topic incarnation above the
//!   metastore's applied index (it was accepted under that incarnation, so
//!   the metastore had applied it then).
//!
//! A metastore behind its own applied-index record is refused by
//! [`narad_meta::MetaStore::open`].

use std::path::Path;

use narad_fs::Fs;

use crate::error::BrokerError;
use crate::topics::{MARKER_FILE, decode_marker};

fn refuse(detail: String) -> BrokerError {
    BrokerError::internal("start", detail)
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> BrokerError + '_ {
    move |e| refuse(format!("{}: {e}", path.display()))
}

/// Before the metastore is opened: refuses a missing metastore beside data.
pub(crate) fn metastore_missing_beside_data(
    fs: &dyn Fs,
    data_dir: &Path,
) -> Result<(), BrokerError> {
    let meta = narad_meta::metastore_path(data_dir);
    if fs.exists(&meta).map_err(io(&meta))? {
        return Ok(());
    }
    let wal = narad_wal::wal_dir(data_dir);
    for dir in [data_dir.join("topics"), wal] {
        if fs.exists(&dir).map_err(io(&dir))? && !fs.list_dir(&dir).map_err(io(&dir))?.is_empty() {
            return Err(refuse(format!(
                "the metastore {} is missing but {} holds data: refusing to start with an empty metastore, which would delete every topic's files and discard their undispatched records; restore the metastore",
                meta.display(),
                dir.display()
            )));
        }
    }
    Ok(())
}

/// After the metastore is opened, before any topic directory is opened or
/// removed: refuses a marker newer than the metastore's applied index.
pub(crate) fn markers_not_newer(
    fs: &dyn Fs,
    topics_root: &Path,
    applied_index: u64,
) -> Result<(), BrokerError> {
    if !fs.exists(topics_root).map_err(io(topics_root))? {
        return Ok(());
    }
    for e in fs.list_dir(topics_root).map_err(io(topics_root))?.into_iter().filter(|e| e.is_dir) {
        let marker = topics_root.join(&e.name).join(MARKER_FILE);
        if !fs.exists(&marker).map_err(io(&marker))? {
            continue;
        }
        let bytes = narad_fs::read_small_file(fs, &marker, 64).map_err(io(&marker))?;
        if let Some(incarnation) = decode_marker(&bytes).filter(|i| *i > applied_index) {
            return Err(refuse(format!(
                "{} names incarnation {incarnation}, above the metastore's applied index {applied_index}: the metastore is older than this topic (rolled back or replaced); refusing to start rather than delete the topic's files",
                marker.display()
            )));
        }
    }
    Ok(())
}

/// After the ingress WAL is opened, before the dispatcher reads it:
/// refuses a WAL holding a record whose topic incarnation is above the
/// metastore's applied index. A record is accepted under the incarnation
/// the metastore had applied, so such a record proves the metastore lost
/// commits (an older copy restored); starting would discard the record as
/// one of a deleted topic.
pub(crate) fn wal_records_not_newer(
    wal: &narad_wal::Wal,
    metastore: &Path,
    applied_index: u64,
) -> Result<(), BrokerError> {
    match wal.newest_incarnation_at_open() {
        Some(n) if n.incarnation > applied_index => Err(refuse(format!(
            "{} holds record {} of topic incarnation {}, above the metastore's applied index {applied_index} ({}): the metastore is older than the ingress WAL (rolled back or replaced); refusing to start rather than discard the WAL's records",
            n.segment.display(),
            n.seq,
            n.incarnation,
            metastore.display()
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use narad_fs::{OpenMode, SimFs};

    use super::*;
    use crate::topics::encode_marker;

    #[test]
    fn a_marker_above_the_applied_index_is_refused_naming_it() {
        let fs = SimFs::new(1);
        let root = PathBuf::from("/d/topics");
        fs.create_dir_all(&root.join("t")).unwrap();
        let marker = root.join("t").join(MARKER_FILE);
        let f = fs.open(&marker, OpenMode::CreateNew).unwrap();
        f.write_all_at(&encode_marker(5), 0).unwrap();
        markers_not_newer(&fs, &root, 5).unwrap();
        let e = markers_not_newer(&fs, &root, 4).unwrap_err().to_string();
        assert!(e.contains("/d/topics/t/incarnation names incarnation 5"), "{e}");
        assert!(e.contains("applied index 4"), "{e}");
    }
}
