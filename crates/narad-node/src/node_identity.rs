//! The node's identity file, `<data>/node.id`: the node id this data
//! directory belongs to, written at its first start and checked at every
//! later one (issue 35). A node's id is what owns its partitions and what
//! names it in the Raft group, so a start under another id would orphan
//! its partitions (a single node) or make the group see a stranger holding
//! a member's state (a cluster): such a start is refused.
//!
//! Why a file of its own and not a metastore key: the metastore is the
//! replicated state (a snapshot install replaces it whole, and every
//! replica's copy must be identical), while the id is this directory's
//! alone; and the check must run before the metastore opens.
//!
//! # Format
//!
//! ```text
//! file = magic "NNID" | version u8 (1) | len u32 BE | crc32c u32 BE of the body | body
//! body = the node id, UTF-8 (len bytes, 1..=64, settings::validate_node_id's rules)
//! ```
//!
//! Written whole with [`narad_fs::write_file_atomic`] (temporary sibling,
//! fsync, rename): a crash leaves no file or the whole file. A file that
//! fails any check refuses the start (never silently replaced).
//!
//! # Which id
//!
//! * The file exists: its id. A configured id (`--node-id`,
//!   `NARAD_NODE_ID`, `cluster.node_id`) that differs is refused.
//! * No file, a directory that already holds a metastore (written by a
//!   release before this file existed): the configured id, or without one
//!   the host name (that release's default), adopted, and written once the
//!   start has checked that its partitions are owned by that id.
//! * No file, a new directory: the configured id, or without one a
//!   generated `node-` + 8 hex digits, written.

use std::path::{Path, PathBuf};

use narad_fs::Fs;

/// The file's name under the data directory.
pub const FILE_NAME: &str = "node.id";
/// The file's magic.
pub const MAGIC: [u8; 4] = *b"NNID";
/// The format version this build writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the body.
pub const HEADER_LEN: usize = 4 + 1 + 4 + 4;
/// The largest file accepted (header and the longest id).
const MAX_FILE_LEN: u64 = (HEADER_LEN + crate::settings::NODE_ID_LEN_MAX) as u64;

/// Where the identity file of `data_dir` lives.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// The file's bytes for `id`.
pub fn encode(id: &str) -> Vec<u8> {
    let body = id.as_bytes();
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// The id in a file's bytes, every field checked.
pub fn decode(bytes: &[u8]) -> Result<String, String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!("{} bytes, shorter than its {HEADER_LEN}-byte header", bytes.len()));
    }
    if bytes[..4] != MAGIC {
        return Err("bad magic (not a narad node id file)".into());
    }
    if bytes[4] != VERSION {
        return Err(format!(
            "format version {} is not supported (this build reads version {VERSION})",
            bytes[4]
        ));
    }
    let len = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) as usize;
    let body = &bytes[HEADER_LEN..];
    if body.len() != len {
        return Err(format!("its header says {len} bytes of id, the file holds {}", body.len()));
    }
    let crc = u32::from_be_bytes([bytes[9], bytes[10], bytes[11], bytes[12]]);
    if crc32c::crc32c(body) != crc {
        return Err("checksum mismatch (the file is damaged)".into());
    }
    let id = std::str::from_utf8(body).map_err(|_| "the id is not UTF-8".to_owned())?;
    crate::settings::validate_node_id(id)?;
    Ok(id.to_owned())
}

/// Why the start is refused.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The configured id is not the one this directory belongs to.
    #[error(
        "this data directory ({dir}) belongs to node {stored:?}, but this start is configured as \
         {configured:?}. A node's id cannot change: its partitions and its Raft membership are \
         recorded under it. Start it with --node-id {stored} (or NARAD_NODE_ID={stored}, or \
         without an id for a single node); to run a node named {configured:?}, give it a new, \
         empty data directory"
    )]
    Mismatch {
        /// The data directory.
        dir: String,
        /// The id in the file.
        stored: String,
        /// The configured id.
        configured: String,
    },
    /// The file cannot be read, is damaged, or cannot be written.
    #[error("node id file {path}: {why}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        why: String,
    },
}

/// How this start settled its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Read from the file.
    Stored(String),
    /// No file, a directory from an older release: adopted and written.
    Adopted(String),
    /// No file, a new directory: written.
    New(String),
}

impl Settled {
    /// The id.
    pub fn id(&self) -> &str {
        match self {
            Settled::Stored(id) | Settled::Adopted(id) | Settled::New(id) => id,
        }
    }
}

/// A fresh generated id, `node-` + 8 hex digits.
fn generate() -> String {
    let mut b = [0u8; 4];
    // A failing OS random source leaves zeros: still a valid id, and the
    // file makes it stable.
    let _ = getrandom::fill(&mut b);
    format!("node-{:08x}", u32::from_be_bytes(b))
}

/// Settles the id of the node whose data directory is `data_dir` (created
/// if missing): `configured` is the id given by flag, environment or file
/// (`None`: none given), `legacy_default` the id a release before this file
/// used without one (the host name). See the module docs.
pub fn settle(
    fs: &dyn Fs,
    data_dir: &Path,
    configured: Option<&str>,
    legacy_default: &str,
) -> Result<Settled, IdentityError> {
    let file = path(data_dir);
    let file_err = |why: String| IdentityError::File { path: file.display().to_string(), why };
    if fs.exists(&file).map_err(|e| file_err(format!("stat: {e}")))? {
        let bytes = narad_fs::read_small_file(fs, &file, MAX_FILE_LEN)
            .map_err(|e| file_err(format!("read: {e}")))?;
        let stored = decode(&bytes).map_err(|why| {
            file_err(format!(
                "{why}; if you know this directory's node id, remove the file and start with \
                 --node-id <that id>"
            ))
        })?;
        return match configured {
            Some(c) if c != stored => Err(IdentityError::Mismatch {
                dir: data_dir.display().to_string(),
                stored,
                configured: c.to_owned(),
            }),
            _ => Ok(Settled::Stored(stored)),
        };
    }
    let older = fs
        .exists(&narad_meta::metastore_path(data_dir))
        .map_err(|e| file_err(format!("stat the metastore: {e}")))?;
    let settled = match (configured, older) {
        (Some(c), true) => Settled::Adopted(c.to_owned()),
        (None, true) => Settled::Adopted(legacy_default.to_owned()),
        (Some(c), false) => Settled::New(c.to_owned()),
        (None, false) => Settled::New(generate()),
    };
    // An adopted id is recorded only once the start's checks of the
    // partitions' owners passed ([`record`]): a wrong guess must not stick.
    if let Settled::New(id) = &settled {
        record(fs, data_dir, id)?;
    }
    Ok(settled)
}

/// Writes `id` as the identity of `data_dir` (created if missing).
pub fn record(fs: &dyn Fs, data_dir: &Path, id: &str) -> Result<(), IdentityError> {
    let file = path(data_dir);
    let file_err = |why: String| IdentityError::File { path: file.display().to_string(), why };
    fs.create_dir_all(data_dir).map_err(|e| file_err(format!("create the directory: {e}")))?;
    narad_fs::write_file_atomic(fs, &file, &encode(id)).map_err(|e| file_err(format!("write: {e}")))
}

/// The ids other than `me` (and other than `members`) that own
/// partitions in `meta`'s state: a data directory from an older release
/// holds no `node.id`, so the adopted id is checked against the owners its
/// partitions were assigned to.
pub fn foreign_owners(
    meta: &narad_meta::MetaStore,
    me: &str,
    members: &[&str],
) -> std::collections::BTreeSet<String> {
    let snap = meta.snapshot();
    snap.topics()
        .filter_map(|t| snap.assignments(t.name()))
        .flat_map(|a| a.values())
        .map(|a| a.owner_id.as_str())
        .filter(|owner| *owner != me && !members.contains(owner))
        .map(str::to_owned)
        .collect()
}

/// Refuses a single-node start on a data directory that says it was a
/// cluster member (`metastore/raft.redb` exists: its partitions, its place
/// in the group and any records it accepted for other owners belong to
/// the cluster; alone it would misplace them), or whose partitions are
/// owned by another id (a renamed node from before `node.id`).
pub fn refuse_single_start(
    data_dir: &Path,
    meta: &narad_meta::MetaStore,
    me: &str,
) -> Result<(), String> {
    let raft_log = narad_cluster::raft::log_store::raft_log_path(data_dir);
    if raft_log.exists() {
        return Err(format!(
            "this data directory ({}) belongs to a cluster member ({} exists), and this start \
             has no peers: start it with its cluster's peers (--peers id@host:port,... or \
             NARAD_CLUSTER_PEERS, and --node-id {me}); a cluster node never runs alone, since \
             it would keep records meant for other nodes' partitions",
            data_dir.display(),
            raft_log.display()
        ));
    }
    let foreign = foreign_owners(meta, me, &[]);
    if !foreign.is_empty() {
        let ids: Vec<&str> = foreign.iter().map(String::as_str).collect();
        return Err(format!(
            "this data directory's partitions are owned by node id {}, and this node is {me:?}: \
             a node's id cannot change. Start it with --node-id {} (or NARAD_NODE_ID)",
            ids.join(", "),
            ids[0]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_file_bytes_are_stable() {
        // Golden bytes: a change here breaks every data directory written
        // before it.
        let bytes = encode("n1");
        assert_eq!(
            bytes,
            [
                b'N', b'N', b'I', b'D', 1, 0, 0, 0, 2, // magic, version, len
                0x47, 0xae, 0x0a, 0xec, // crc32c("n1")
                b'n', b'1',
            ]
        );
        assert_eq!(decode(&bytes).unwrap(), "n1");
    }

    #[test]
    fn damaged_node_id_files_are_refused() {
        let good = encode("node-0a1b2c3d");
        for (i, bad) in [
            good[..5].to_vec(),
            {
                let mut b = good.clone();
                b[0] = b'X';
                b
            },
            {
                let mut b = good.clone();
                b[4] = 2;
                b
            },
            {
                let mut b = good.clone();
                b[8] += 1;
                b
            },
            {
                let mut b = good.clone();
                b[HEADER_LEN] ^= 1;
                b
            },
            encode("not a valid id"),
        ]
        .into_iter()
        .enumerate()
        {
            assert!(decode(&bad).is_err(), "case {i} decoded");
        }
    }

    #[test]
    fn the_first_start_writes_the_id_and_later_starts_keep_it() {
        let fs = narad_fs::SimFs::new(1);
        let dir = Path::new("/d");
        let first = settle(&fs, dir, None, "host").unwrap();
        let Settled::New(id) = &first else { panic!("{first:?}") };
        assert!(id.starts_with("node-") && id.len() == 13, "{id}");
        assert_eq!(settle(&fs, dir, None, "host").unwrap(), Settled::Stored(id.clone()));
        assert_eq!(settle(&fs, dir, Some(id), "host").unwrap(), Settled::Stored(id.clone()));
        let e = settle(&fs, dir, Some("n1"), "host").unwrap_err().to_string();
        assert!(e.contains(&format!("--node-id {id}")), "{e}");
    }
}
