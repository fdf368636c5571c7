//! The real file system: `std::fs` with the durability rules of the crate
//! contract (fdatasync for data, a parent-directory fsync after every change
//! to a directory entry). What it creates is for narad's own user only:
//! directories [`DIR_MODE`], files [`FILE_MODE`] (the data directory holds
//! every message and the password hashes).

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use crate::{DirEntry, File, FileRef, Fs, OpenMode, parent_dir};

/// The mode of every directory narad creates (before the umask).
pub const DIR_MODE: u32 = 0o700;
/// The mode of every file narad creates (before the umask).
pub const FILE_MODE: u32 = 0o600;

/// Whether users other than the owner may read, write or enter `path`
/// (its group or other permission bits are set): a data directory that is
/// should be warned about.
pub fn open_to_others(path: &Path) -> io::Result<bool> {
    Ok(fs::metadata(path)?.permissions().mode() & 0o077 != 0)
}

/// `std::fs`, with directory fsyncs after create, rename and remove.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

impl RealFs {
    /// A shared handle to the real file system.
    pub fn shared() -> Arc<RealFs> {
        Arc::new(RealFs)
    }
}

#[derive(Debug)]
struct RealFile {
    file: fs::File,
}

fn fsync_dir(path: &Path) -> io::Result<()> {
    fs::File::open(path)?.sync_all()
}

impl Fs for RealFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileRef> {
        let mut opts = fs::OpenOptions::new();
        opts.read(true).write(true).mode(FILE_MODE);
        match mode {
            OpenMode::Existing => {}
            OpenMode::CreateNew => {
                opts.create_new(true);
            }
            OpenMode::CreateOrTruncate => {
                opts.create(true).truncate(true);
            }
        }
        let file = opts.open(path)?;
        if mode != OpenMode::Existing {
            fsync_dir(parent_dir(path))?;
        }
        Ok(Arc::new(RealFile { file }))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        if path.is_dir() {
            return Ok(());
        }
        // Create each missing component and fsync its parent, top-down, so
        // the whole chain is durable.
        let mut missing = Vec::new();
        let mut cur = Some(path);
        while let Some(p) = cur {
            if p.as_os_str().is_empty() || p.is_dir() {
                break;
            }
            missing.push(p);
            cur = p.parent();
        }
        for dir in missing.into_iter().rev() {
            match fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
                Ok(()) => fsync_dir(parent_dir(dir))?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                continue; // narad never creates non-UTF-8 names
            };
            out.push(DirEntry { name, is_dir: entry.file_type()?.is_dir() });
        }
        out.sort();
        Ok(out)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)?;
        let (pf, pt) = (parent_dir(from), parent_dir(to));
        fsync_dir(pt)?;
        if pf != pt {
            fsync_dir(pf)?;
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)?;
        fsync_dir(parent_dir(path))
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)?;
        fsync_dir(parent_dir(path))
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        fsync_dir(path)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }
}

impl File for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        loop {
            match self.file.read_at(buf, offset) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{read_small_file, write_file_atomic};

    fn tmpdir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("narad-fs-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn real_fs_round_trips_files_and_directories() {
        let root = tmpdir("roundtrip");
        let fs_ = RealFs;
        fs_.create_dir_all(&root.join("a/b")).unwrap();
        let f = fs_.open(&root.join("a/b/x"), OpenMode::CreateNew).unwrap();
        f.write_all_at(b"hello", 0).unwrap();
        f.write_all_at(b"world", 5).unwrap();
        f.sync_data().unwrap();
        assert_eq!(f.len().unwrap(), 10);
        let mut buf = [0u8; 10];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"helloworld");
        assert_eq!(
            fs_.open(&root.join("a/b/x"), OpenMode::CreateNew).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        fs_.rename(&root.join("a/b/x"), &root.join("a/y")).unwrap();
        let names: Vec<_> = fs_.list_dir(&root.join("a")).unwrap();
        assert_eq!(
            names,
            vec![
                DirEntry { name: "b".into(), is_dir: true },
                DirEntry { name: "y".into(), is_dir: false }
            ]
        );
        write_file_atomic(&fs_, &root.join("a/z"), b"123").unwrap();
        assert_eq!(read_small_file(&fs_, &root.join("a/z"), 8).unwrap(), b"123");
        assert!(read_small_file(&fs_, &root.join("a/y"), 4).is_err());
        fs_.remove_file(&root.join("a/y")).unwrap();
        assert!(!fs_.exists(&root.join("a/y")).unwrap());
        fs_.remove_dir_all(&root).unwrap();
        assert!(!fs_.exists(&root).unwrap());
    }

    #[test]
    fn what_it_creates_is_for_the_owner_only() {
        let root = tmpdir("modes");
        let fs_ = RealFs;
        fs_.create_dir_all(&root.join("a/b")).unwrap();
        fs_.open(&root.join("a/b/x"), OpenMode::CreateNew).unwrap();
        fs_.open(&root.join("a/y"), OpenMode::CreateOrTruncate).unwrap();
        write_file_atomic(&fs_, &root.join("a/z"), b"123").unwrap();
        let mode = |p: &str| fs::metadata(root.join(p)).unwrap().permissions().mode() & 0o777;
        for dir in ["", "a", "a/b"] {
            assert_eq!(mode(dir) & !DIR_MODE, 0, "{dir}: {:o}", mode(dir));
        }
        for file in ["a/b/x", "a/y", "a/z"] {
            assert_eq!(mode(file) & !FILE_MODE, 0, "{file}: {:o}", mode(file));
        }
        assert!(!open_to_others(&root).unwrap());
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(open_to_others(&root).unwrap());
        fs_.remove_dir_all(&root).unwrap();
    }
}
