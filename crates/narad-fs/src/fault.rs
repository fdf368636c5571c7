//! A file system that fails operations on chosen paths: for tests that
//! need one part of a node's disk to misbehave while the rest works (a
//! failing partition, a full volume under one topic).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::{DirEntry, File, FileRef, Fs, FsRef, OpenMode};

/// Which operations fail, and under which path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRule {
    /// Paths starting with this prefix are affected.
    pub prefix: PathBuf,
    /// Writes, truncations and file creation fail with `EIO`.
    pub fail_writes: bool,
    /// `sync_data` fails with `EIO`.
    pub fail_syncs: bool,
    /// Reads of open files fail with `EIO` (a bad sector).
    pub fail_reads: bool,
}

/// Wraps a file system; operations under a rule's prefix fail.
#[derive(Debug, Clone)]
pub struct FaultFs {
    inner: FsRef,
    rules: Arc<RwLock<Vec<FaultRule>>>,
}

#[derive(Debug)]
struct FaultFile {
    inner: FileRef,
    path: PathBuf,
    rules: Arc<RwLock<Vec<FaultRule>>>,
}

fn injected(what: &str, path: &Path) -> io::Error {
    io::Error::other(format!("injected fault: {what} {}", path.display()))
}

fn matching(rules: &RwLock<Vec<FaultRule>>, path: &Path, pick: fn(&FaultRule) -> bool) -> bool {
    rules
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|r| pick(r) && path.starts_with(&r.prefix))
}

impl FaultFs {
    /// Wraps `inner` with no rules.
    pub fn new(inner: FsRef) -> FaultFs {
        FaultFs { inner, rules: Arc::default() }
    }

    /// Adds a rule.
    pub fn add_rule(&self, rule: FaultRule) {
        self.rules.write().unwrap_or_else(|p| p.into_inner()).push(rule);
    }

    /// Removes every rule: the disk works again.
    pub fn clear(&self) {
        self.rules.write().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn writes_fail(&self, path: &Path) -> bool {
        matching(&self.rules, path, |r| r.fail_writes)
    }
}

impl Fs for FaultFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileRef> {
        if mode != OpenMode::Existing && self.writes_fail(path) {
            return Err(injected("create", path));
        }
        let inner = self.inner.open(path, mode)?;
        Ok(Arc::new(FaultFile { inner, path: path.to_path_buf(), rules: self.rules.clone() }))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        self.inner.list_dir(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        if self.writes_fail(to) {
            return Err(injected("rename", to));
        }
        self.inner.rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_dir_all(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.inner.exists(path)
    }

    fn in_memory(&self) -> bool {
        self.inner.in_memory()
    }
}

impl File for FaultFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if matching(&self.rules, &self.path, |r| r.fail_reads) {
            return Err(injected("read", &self.path));
        }
        self.inner.read_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if matching(&self.rules, &self.path, |r| r.fail_writes) {
            return Err(injected("write", &self.path));
        }
        self.inner.write_all_at(buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if matching(&self.rules, &self.path, |r| r.fail_writes) {
            return Err(injected("set_len", &self.path));
        }
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        if matching(&self.rules, &self.path, |r| r.fail_syncs) {
            return Err(injected("fdatasync", &self.path));
        }
        self.inner.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimFs;

    #[test]
    fn only_paths_under_a_rule_fail_until_cleared() {
        let sim = SimFs::new(1);
        let fs = FaultFs::new(sim.shared());
        fs.create_dir_all(Path::new("/a")).unwrap();
        fs.create_dir_all(Path::new("/b")).unwrap();
        let a = fs.open(Path::new("/a/f"), OpenMode::CreateNew).unwrap();
        let b = fs.open(Path::new("/b/f"), OpenMode::CreateNew).unwrap();
        fs.add_rule(FaultRule {
            prefix: "/a".into(),
            fail_writes: false,
            fail_syncs: true,
            fail_reads: false,
        });
        a.write_all_at(b"x", 0).unwrap();
        assert!(a.sync_data().is_err());
        b.write_all_at(b"x", 0).unwrap();
        b.sync_data().unwrap();
        fs.add_rule(FaultRule {
            prefix: "/b".into(),
            fail_writes: false,
            fail_syncs: false,
            fail_reads: true,
        });
        assert!(b.read_at(&mut [0u8; 1], 0).is_err());
        assert_eq!(a.read_at(&mut [0u8; 1], 0).unwrap(), 1);
        fs.clear();
        a.sync_data().unwrap();
        assert_eq!(b.read_at(&mut [0u8; 1], 0).unwrap(), 1);
    }
}
