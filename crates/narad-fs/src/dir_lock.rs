//! The data directory's lock: one process at a time may use a data
//! directory.
//!
//! # File `<data>/LOCK`
//! An exclusive advisory lock (`flock`, through [`std::fs::File::try_lock`])
//! on this file is taken before anything else under the directory is
//! opened and held as long as the [`DirLock`] lives (the server keeps it
//! for the life of the process; the kernel drops it when the process dies,
//! kill -9 included, so a stale file never blocks a restart). The holder
//! writes its pid and a newline into the file, for the error the next
//! process shows; the contents are informative only, never trusted. Like
//! everything narad creates, the directory and the file are for narad's
//! own user only ([`DIR_MODE`], [`FILE_MODE`]).

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::real::{DIR_MODE, FILE_MODE};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "LOCK";

/// Holds the lock on a data directory until dropped.
#[derive(Debug)]
pub struct DirLock {
    _file: fs::File,
    path: PathBuf,
}

impl DirLock {
    /// Creates `dir` if needed and takes its lock without waiting. Fails
    /// with `WouldBlock`, naming the directory and the holder's pid, when
    /// another process (or another `DirLock` in this one) holds it.
    pub fn acquire(dir: &Path) -> io::Result<DirLock> {
        let with_path = |what: &str, p: &Path| {
            let p = p.display().to_string();
            let what = what.to_owned();
            move |e: io::Error| io::Error::new(e.kind(), format!("{what} {p}: {e}"))
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(with_path("create data directory", dir))?;
        let path = dir.join(LOCK_FILE);
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(&path)
            .map_err(with_path("open lock file", &path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = (&file).take(32).read_to_string(&mut holder);
                let holder = match holder.trim() {
                    pid if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) => {
                        format!("pid {pid}")
                    }
                    _ => "pid unknown".to_owned(),
                };
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "data directory {} is in use by another narad process ({holder}; lock file {})",
                        dir.display(),
                        path.display()
                    ),
                ));
            }
            Err(fs::TryLockError::Error(e)) => return Err(with_path("lock", &path)(e)),
        }
        file.set_len(0).map_err(with_path("write lock file", &path))?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes())
            .map_err(with_path("write lock file", &path))?;
        Ok(DirLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_a_held_directory_fails_naming_it_and_the_pid_until_the_first_is_dropped() {
        let dir = std::env::temp_dir().join(format!("narad-fs-lock-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let first = DirLock::acquire(&dir).unwrap();
        let e = DirLock::acquire(&dir).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let text = e.to_string();
        assert!(text.contains(&dir.display().to_string()), "{text}");
        assert!(text.contains(&format!("pid {}", std::process::id())), "{text}");
        drop(first);
        let again = DirLock::acquire(&dir).unwrap();
        assert_eq!(again.path(), dir.join(LOCK_FILE));
        drop(again);
        fs::remove_dir_all(&dir).unwrap();
    }
}
