//! narad-fs: the one door to the disk.
//!
//! Every durable structure in narad (the ingress WAL, the partition logs, the
//! checkpoint and offset files) touches the disk only through the [`Fs`] and
//! [`File`] traits defined here. There are two implementations:
//!
//! * [`RealFs`]: `std::fs`. `sync_data` is `fdatasync`; every operation that
//!   changes a directory entry (creating a file, rename, remove) fsyncs the
//!   parent directory before it returns.
//! * [`SimFs`]: an in-memory file system that remembers, per file, which bytes
//!   were written and which were made durable, and which directory entries are
//!   durable. [`SimFs::crash`] keeps only the durable state (optionally tearing
//!   the unsynced writes), and faults (fsync error, write error, `ENOSPC`, a
//!   power cut) can be injected at a chosen operation number. It is
//!   deterministic from a seed.
//!
//! Beside them, [`DirLock`] keeps a second process off a data directory (a
//! real `flock`, so it is outside the traits: a simulation has one process).
//!
//! # The contract callers may rely on
//!
//! * Bytes written with [`File::write_all_at`] are durable once a later
//!   [`File::sync_data`] on the same file returned `Ok`.
//! * A directory entry created by [`Fs::open`] in a creating mode, or changed
//!   by [`Fs::rename`], [`Fs::remove_file`], [`Fs::remove_dir_all`] or
//!   [`Fs::create_dir_all`], is durable once that call returned `Ok`.
//! * A failed `sync_data` says nothing about which bytes reached the disk, and
//!   retrying it proves nothing (Linux marks the pages clean). Callers latch
//!   the error; the simulation punishes a retry by never making those bytes
//!   durable.

mod dir_lock;
mod fault;
pub mod probe;
mod real;
mod rng;
mod sim;

use std::fmt::Debug;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use dir_lock::{DirLock, LOCK_FILE};
pub use fault::{FaultFs, FaultRule};
pub use real::{DIR_MODE, FILE_MODE, RealFs, open_to_others};
pub use rng::SimRng;
pub use sim::{CrashMode, FaultKind, SimFs};

/// A shared handle to an open file.
pub type FileRef = Arc<dyn File>;

/// A shared handle to a file system.
pub type FsRef = Arc<dyn Fs>;

/// How [`Fs::open`] treats the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Open an existing file for reading and writing; fail if it is missing.
    Existing,
    /// Create a new, empty file; fail with `AlreadyExists` if the path exists.
    /// The new directory entry is durable when `open` returns.
    CreateNew,
    /// Create the file, or truncate it to zero length if it exists. The
    /// directory entry is durable when `open` returns.
    CreateOrTruncate,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DirEntry {
    /// The entry's file name (no directory part).
    pub name: String,
    /// Whether the entry is a directory.
    pub is_dir: bool,
}

/// A file system: the directory operations narad needs, and the way to open
/// files.
pub trait Fs: Send + Sync + Debug {
    /// Opens or creates a file for reading and writing.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileRef>;

    /// Creates a directory and every missing parent; the new entries are
    /// durable when this returns. An existing directory is not an error.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Lists a directory, sorted by name. `.` and `..` are not listed.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>>;

    /// Renames a file atomically, replacing `to` if it exists; durable when
    /// this returns (the parent directories are synced).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Removes a file; durable when this returns. Open handles stay readable.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Removes a directory and everything below it; durable when this returns.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Fsyncs a directory, making its entries durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;

    /// Whether a file or directory exists at `path`.
    fn exists(&self, path: &Path) -> io::Result<bool>;

    /// Whether every operation is a memory operation that never blocks on
    /// a device (the simulated disk). Callers that move blocking file work
    /// off an async runtime run it inline instead: no worker to keep free,
    /// and a simulated run stays on one thread, so it replays exactly.
    fn in_memory(&self) -> bool {
        false
    }
}

/// An open file. Every method takes `&self`: reads may run concurrently with
/// one writer, as with `pread`/`pwrite`.
pub trait File: Send + Sync + Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read
    /// (fewer only at end of file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Writes all of `buf` at `offset`, extending the file if needed. The
    /// bytes are not durable until [`File::sync_data`] returns `Ok`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// The current length of the file.
    fn len(&self) -> io::Result<u64>;

    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Truncates or extends the file. Not durable until `sync_data`.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Makes every byte written so far durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;

    /// Reads exactly `buf.len()` bytes at `offset`, or fails with
    /// `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "short read: wanted {} bytes at offset {offset}, got {done}",
                        buf.len()
                    ),
                ));
            }
            done += n;
        }
        Ok(())
    }
}

/// Replaces the file at `path` with `bytes` atomically and durably: write a
/// temporary sibling, `fdatasync` it, rename it over `path` (which syncs the
/// directory). A crash leaves either the old or the new content, never a mix;
/// a stale temporary file may be left behind and is overwritten next time.
pub fn write_file_atomic(fs: &dyn Fs, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = tmp_sibling(path);
    let file = fs.open(&tmp, OpenMode::CreateOrTruncate)?;
    file.write_all_at(bytes, 0)?;
    file.sync_data()?;
    drop(file);
    fs.rename(&tmp, path)
}

/// The zeros [`write_zeros`] writes from.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Writes zeros over `from..to` of `file`, 64 KiB per write, from a static
/// buffer: nothing is allocated or cleared per call (a fresh zeroed buffer
/// per zero runway top-up cost the WAL and the partition logs a few
/// percent of their instructions).
pub fn write_zeros(file: &dyn File, from: u64, to: u64) -> io::Result<()> {
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

/// Reads a whole (small) file, refusing files larger than `max_len` before
/// allocating for them.
pub fn read_small_file(fs: &dyn Fs, path: &Path, max_len: u64) -> io::Result<Vec<u8>> {
    let file = fs.open(path, OpenMode::Existing)?;
    let len = file.len()?;
    if len > max_len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is {len} bytes, more than the {max_len} allowed", path.display()),
        ));
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

/// The temporary sibling used by [`write_file_atomic`]: `<name>.tmp`.
pub fn tmp_sibling(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

/// The parent directory of `path`, or `.` for a bare file name.
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Whether an I/O error means the disk is full.
pub fn is_no_space(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::StorageFull || err.raw_os_error() == Some(28)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_zeros_covers_exactly_the_range_across_several_writes() {
        let fs = SimFs::new(1);
        let path = Path::new("/f");
        let file = fs.open(path, OpenMode::CreateNew).unwrap();
        let len = 200 << 10; // more than three writes of the static zeros
        file.write_all_at(&vec![7u8; len + 10], 0).unwrap();
        write_zeros(&*file, 5, len as u64 + 5).unwrap();
        let mut back = vec![0u8; len + 10];
        file.read_exact_at(&mut back, 0).unwrap();
        assert!(back[..5].iter().all(|&b| b == 7));
        assert!(back[5..len + 5].iter().all(|&b| b == 0));
        assert!(back[len + 5..].iter().all(|&b| b == 7));
        // Past the end of the file, it grows the file.
        write_zeros(&*file, len as u64 + 10, len as u64 + 100).unwrap();
        assert_eq!(file.len().unwrap(), len as u64 + 100);
        // An empty range writes nothing.
        write_zeros(&*file, 50, 50).unwrap();
        assert_eq!(file.len().unwrap(), len as u64 + 100);
    }
}
