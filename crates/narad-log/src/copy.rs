//! Copying a partition log to another node, byte for byte (SPEC §7.3: node
//! RPC 22 ListPartitionSegments and 23 FetchSegmentChunk on the source; the
//! destination's staging, verification and install).
//!
//! # Source side
//!
//! [`PartitionLog::segment_extents`] lists the segments with the length of
//! their *verified* bytes (the view's, never the file's: a crash's torn tail
//! or the zero runway after the last frame is not copied), and
//! [`PartitionLog::read_segment_bytes`] reads raw bytes inside that extent.
//! Sealed segments never change; the active one only grows, so a chunk
//! read within an extent listed earlier is always the same bytes. A segment
//! that retention removed in between reads as [`CopyError::Gone`]: the copier
//! lists again.
//!
//! # Destination side
//!
//! [`IncomingCopy`] writes the chunks into a staging directory, strictly in
//! order per segment (a chunk at any other position is refused, so a
//! duplicated or reordered chunk cannot leave a hole; a chunk is booked
//! in order by [`IncomingCopy::stage`] and its bytes written by the
//! [`StagedChunk`], so the caller may write one chunk on another thread
//! while it receives the next), and
//! [`IncomingCopy::verify`] makes it durable (every file fdatasynced, the
//! directory synced) and then opens it as a log: recovery walks every frame
//! and checks its CRC (seeded with the source log's salt, which the copied
//! segment headers carry). The copy passes only if recovery had nothing to
//! repair (no truncation: the copy is exact) and it ends at the expected
//! high watermark and begins at the expected oldest offset. The caller then
//! moves the staged segments into place ([`install`]).
//!
//! Invariants: nothing under the destination's partition directory changes
//! before a copy verified; a staging directory is only ever the copier's
//! (created empty, removed on abort).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use narad_clock::ClockRef;
use narad_fs::{FileRef, FsRef, OpenMode};

use crate::config::LogConfig;
use crate::error::{LogError, ReadError};
use crate::log::PartitionLog;
use crate::segment::segment_path;

/// One segment as a copy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentExtent {
    /// The offset of its first record (its file name).
    pub base: u64,
    /// Bytes of header and verified frames.
    pub len: u64,
    /// The offset after its last verified record.
    pub end_offset: u64,
}

/// Why a copy step failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The segment is not in the log (any more): list again.
    #[error("segment {0} is not in the log")]
    Gone(u64),
    /// A chunk outside the segment's verified bytes, or out of order.
    #[error("chunk refused: {0}")]
    Range(String),
    /// The staged copy is not the log it should be.
    #[error("copy does not verify: {0}")]
    Mismatch(String),
    /// A read, write or open failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was done.
        op: &'static str,
        /// On which file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// Opening the staged copy as a log failed (damage, I/O).
    #[error(transparent)]
    Log(#[from] LogError),
}

fn io_err(op: &'static str, path: &Path, source: io::Error) -> CopyError {
    CopyError::Io { op, path: path.to_owned(), source }
}

impl PartitionLog {
    /// The log's segments, oldest first, with their verified lengths (see
    /// the module docs).
    pub fn segment_extents(&self) -> Vec<SegmentExtent> {
        self.view_read()
            .segments
            .iter()
            .map(|s| SegmentExtent { base: s.base(), len: s.end_pos, end_offset: s.end_offset })
            .collect()
    }

    /// Up to `max_len` raw bytes of segment `base` from byte `at`, within
    /// its verified extent (empty at its end).
    pub fn read_segment_bytes(&self, base: u64, at: u64, max_len: u64) -> Result<Bytes, CopyError> {
        let (seg, end_pos, end_offset) = {
            let view = self.view_read();
            let s = view.segments.iter().find(|s| s.base() == base).ok_or(CopyError::Gone(base))?;
            (s.file.clone(), s.end_pos, s.end_offset)
        };
        if at > end_pos {
            return Err(CopyError::Range(format!(
                "byte {at} is past the {end_pos} verified bytes of segment {base}"
            )));
        }
        let len = (end_pos - at).min(max_len) as usize;
        if len == 0 {
            return Ok(Bytes::new());
        }
        let file = self.segment_handle(&seg, end_offset).map_err(|e| match e {
            ReadError::Gone { .. } | ReadError::Closed => CopyError::Gone(base),
            ReadError::Io { op, path, source } => CopyError::Io {
                op,
                path,
                source: io::Error::new(source.kind(), source.to_string()),
            },
        })?;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, at).map_err(|e| io_err("read", &seg.path, e))?;
        Ok(Bytes::from(buf))
    }
}

/// A copy being written into a staging directory (see the module docs).
#[derive(Debug)]
pub struct IncomingCopy {
    fs: FsRef,
    dir: PathBuf,
    /// Per segment base: its file and how many bytes it holds.
    files: BTreeMap<u64, (FileRef, u64)>,
}

impl IncomingCopy {
    /// Starts a copy in `dir`, removing whatever an earlier, abandoned copy
    /// left there.
    pub fn create(fs: FsRef, dir: &Path) -> Result<IncomingCopy, CopyError> {
        if fs.exists(dir).map_err(|e| io_err("look up", dir, e))? {
            fs.remove_dir_all(dir).map_err(|e| io_err("remove", dir, e))?;
        }
        fs.create_dir_all(dir).map_err(|e| io_err("create directory", dir, e))?;
        Ok(IncomingCopy { fs, dir: dir.to_owned(), files: BTreeMap::new() })
    }

    /// How many bytes of segment `base` the copy holds (0 for one not
    /// started): where its next chunk goes.
    pub fn written(&self, base: u64) -> u64 {
        self.files.get(&base).map_or(0, |(_, n)| *n)
    }

    /// The base of the first segment the copy holds (`None` before any).
    pub fn first_segment(&self) -> Option<u64> {
        self.files.keys().next().copied()
    }

    /// Appends `bytes` at byte `at` of segment `base`; `at` must be
    /// [`IncomingCopy::written`]. [`IncomingCopy::stage`] and
    /// [`StagedChunk::write`] in one step.
    pub fn write(&mut self, base: u64, at: u64, bytes: &[u8]) -> Result<(), CopyError> {
        self.stage(base, at, Bytes::copy_from_slice(bytes))?.write().map(|_| ())
    }

    /// Books `bytes` at byte `at` of segment `base` (`at` must be
    /// [`IncomingCopy::written`], which then counts them) and answers the
    /// write to do, which the caller may run on another thread while it
    /// books the next chunk. A staged chunk that is never written, or whose
    /// write fails, leaves a hole: the copy must then be abandoned, and
    /// [`IncomingCopy::verify`] refuses it if it is not (recovery finds the
    /// hole, or the copy ends short of the high watermark).
    pub fn stage(&mut self, base: u64, at: u64, bytes: Bytes) -> Result<StagedChunk, CopyError> {
        let have = self.written(base);
        if at != have {
            return Err(CopyError::Range(format!(
                "segment {base}: chunk at byte {at}, but the copy holds {have}"
            )));
        }
        let path = segment_path(&self.dir, base);
        if !bytes.is_empty() && !self.files.contains_key(&base) {
            let file =
                self.fs.open(&path, OpenMode::CreateNew).map_err(|e| io_err("create", &path, e))?;
            self.files.insert(base, (file, 0));
        }
        let file = match self.files.get_mut(&base) {
            Some((file, n)) => {
                *n += bytes.len() as u64;
                Some(file.clone())
            }
            None => None,
        };
        Ok(StagedChunk { file, path, at, bytes })
    }

    /// Makes the copy durable and checks it (see the module docs): it must
    /// recover without repair to records `[oldest, high_watermark)`.
    /// Returns the staging directory, ready for [`install`].
    pub fn verify(
        self,
        config: &LogConfig,
        clock: ClockRef,
        oldest: u64,
        high_watermark: u64,
    ) -> Result<PathBuf, CopyError> {
        for (base, (file, _)) in &self.files {
            let path = segment_path(&self.dir, *base);
            file.sync_data().map_err(|e| io_err("fdatasync", &path, e))?;
        }
        self.fs.sync_dir(&self.dir).map_err(|e| io_err("sync directory", &self.dir, e))?;
        drop(self.files);
        let log = PartitionLog::open(self.fs.clone(), self.dir.clone(), config.clone(), clock)?;
        let report = log.recovery_report();
        let check = if let Some(t) = &report.truncation {
            Err(format!("recovery had to repair it: {t:?}"))
        } else if log.high_watermark() != high_watermark {
            Err(format!(
                "it ends at offset {}, the source at {high_watermark}",
                log.high_watermark()
            ))
        } else if high_watermark > oldest && log.oldest_offset() != oldest {
            Err(format!("it begins at offset {}, the source at {oldest}", log.oldest_offset()))
        } else {
            Ok(())
        };
        log.close();
        check.map_err(CopyError::Mismatch)?;
        Ok(self.dir)
    }

    /// Gives the copy up: removes the staging directory.
    pub fn abandon(self) -> Result<(), CopyError> {
        drop(self.files);
        self.fs.remove_dir_all(&self.dir).map_err(|e| io_err("remove", &self.dir, e))
    }
}

/// One chunk's write, booked by [`IncomingCopy::stage`].
#[derive(Debug)]
#[must_use = "a staged chunk that is not written leaves a hole in the copy"]
pub struct StagedChunk {
    /// `None` for an empty chunk (nothing to write, no file created).
    file: Option<FileRef>,
    path: PathBuf,
    at: u64,
    bytes: Bytes,
}

impl StagedChunk {
    /// Writes the chunk (a positional write: staged chunks of one segment
    /// may be written in any order); answers its length.
    pub fn write(self) -> Result<u64, CopyError> {
        if let Some(file) = &self.file {
            file.write_all_at(&self.bytes, self.at).map_err(|e| io_err("write", &self.path, e))?;
        }
        Ok(self.bytes.len() as u64)
    }
}

/// Moves the segments of a verified copy at `staged` into `dir` (created,
/// and required empty: a leftover of an earlier ownership is the caller's
/// to remove first), one rename each, each durable when it returns, then
/// removes the staging directory. A crash part way leaves `dir` holding a
/// prefix of the copy's segments: that is a valid log of fewer records,
/// which nothing serves before the ownership flip that follows the install
/// succeeded, and which the next copy replaces.
pub fn install(fs: &dyn narad_fs::Fs, staged: &Path, dir: &Path) -> Result<(), CopyError> {
    fs.create_dir_all(dir).map_err(|e| io_err("create directory", dir, e))?;
    let present = fs.list_dir(dir).map_err(|e| io_err("list", dir, e))?;
    if !present.is_empty() {
        return Err(CopyError::Range(format!(
            "{} already holds {} entries",
            dir.display(),
            present.len()
        )));
    }
    let files = fs.list_dir(staged).map_err(|e| io_err("list", staged, e))?;
    for f in files {
        let (from, to) = (staged.join(&f.name), dir.join(&f.name));
        fs.rename(&from, &to).map_err(|e| io_err("rename", &from, e))?;
    }
    fs.sync_dir(dir).map_err(|e| io_err("sync directory", dir, e))?;
    fs.remove_dir_all(staged).map_err(|e| io_err("remove", staged, e))
}
