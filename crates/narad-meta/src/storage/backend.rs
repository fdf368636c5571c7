//! redb's storage backend over a `narad_fs` file, so the metastore reaches
//! the disk through the same door as everything else and can be crash-tested
//! on `SimFs`.
//!
//! The mapping is one-to-one: redb's `read` is `read_exact_at` (a read past
//! the end fails with `UnexpectedEof`, as redb requires), `write` is
//! `write_all_at`, `set_len` extends with zeros, and `sync_data` is the file's
//! `fdatasync`. Locking is left unsupported: redb then runs in its
//! exclusive-writer mode without a file lock, so keeping a second process
//! off the data directory is the server's job.

use std::io;

use narad_fs::FileRef;

/// A redb backend over one open file (also the Raft log's, in narad-cluster).
#[derive(Debug)]
pub struct FsBackend {
    file: FileRef,
}

impl FsBackend {
    /// The backend over `file`.
    pub fn new(file: FileRef) -> Self {
        FsBackend { file }
    }
}

impl redb::StorageBackend for FsBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.file.read_exact_at(out, offset)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.file.write_all_at(data, offset)
    }
}
