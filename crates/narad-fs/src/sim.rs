//! The simulated file system: an in-memory disk that knows which bytes and
//! which directory entries are durable.
//!
//! # Model
//!
//! * Each file is an inode with its *live* bytes (what reads see), its
//!   *durable* bytes (as of the last successful `sync_data`) and the list of
//!   operations since then (*pending*: writes and `set_len`s, in order).
//! * The namespace exists twice: *live* (what `list_dir`/`open` see) and
//!   *durable*. Creating, renaming and removing update both when they succeed
//!   (the real implementation fsyncs the parent directory), only the live one
//!   when an injected fault makes them fail after the change.
//! * [`SimFs::crash`] replaces the live state by the durable one. With
//!   [`CrashMode::Torn`] or [`CrashMode::TornWithHoles`] each file also keeps a
//!   random prefix of its pending operations, the last of which may be cut
//!   short (and, with holes, lose random 512-byte sectors: zeros past the
//!   old end of the file, the old bytes where it overwrote): what a power
//!   cut in the middle of writeback leaves.
//! * A failed `sync_data` behaves like Linux: the pending operations stay in
//!   the live bytes but are forgotten by writeback, so they never become
//!   durable, even if a later sync succeeds. Retrying an fsync proves nothing.
//!
//! # Faults
//!
//! Every mutating call (open with create, write, set_len, sync, rename,
//! remove, create_dir_all, sync_dir) is one *operation*, numbered from 0.
//! [`SimFs::inject`] arms a one-shot fault that fires on the first matching
//! operation at or after a number; [`SimFs::power_cut_at`] makes every
//! operation from a number on fail without effect (the machine is gone), so
//! whatever returned `Ok` before it is exactly what the workload was told;
//! [`SimFs::set_capacity`] makes writes past a total size fail with `ENOSPC`.
//! All randomness comes from the seed given to [`SimFs::new`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{DirEntry, File, FileRef, Fs, OpenMode, SimRng, parent_dir};

/// What a simulated crash keeps of the writes that were never synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Keep only durable bytes.
    DropUnsynced,
    /// Keep, per file, a random prefix of the unsynced writes; the last kept
    /// write may be cut at a random length.
    Torn,
    /// As `Torn`, and random 512-byte sectors of the cut write never reach
    /// the disk: past the file's old end they read as zeros, over old bytes
    /// they keep the old bytes (a sector is written whole or not at all).
    TornWithHoles,
}

/// A fault [`SimFs::inject`] can arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The next `sync_data` or directory sync fails with `EIO`.
    SyncError,
    /// The next write fails with `EIO` after writing a random prefix.
    WriteError,
    /// The next write fails with `ENOSPC` after writing a random prefix.
    NoSpace,
    /// The next namespace operation (create, rename, remove, mkdir) takes
    /// effect, but the directory sync after it fails with `EIO`: the change
    /// is visible and not durable until a later [`Fs::sync_dir`] succeeds.
    DirSyncError,
    /// The next open that would create a file fails with `EMFILE` (the
    /// process is out of file descriptors) before anything is created.
    TooManyFiles,
}

/// The kind of a numbered operation, for fault matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Write,
    Sync,
    Namespace,
    /// An open that may create a file (a namespace operation too).
    Create,
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

#[derive(Debug, Default, Clone)]
struct Namespace {
    dirs: BTreeSet<PathBuf>,
    files: BTreeMap<PathBuf, u64>,
}

impl Namespace {
    fn has_dir(&self, p: &Path) -> bool {
        p == Path::new(".") || p == Path::new("/") || self.dirs.contains(p)
    }
}

#[derive(Debug)]
struct State {
    generation: u64,
    live: Namespace,
    durable: Namespace,
    inodes: HashMap<u64, Inode>,
    next_inode: u64,
    ops: u64,
    syncs: u64,
    faults: Vec<(u64, FaultKind)>,
    power_cut_at: Option<u64>,
    capacity: Option<u64>,
    rng: SimRng,
}

/// An in-memory, crash-simulating file system. Cloning gives another handle
/// to the same disk.
#[derive(Debug, Clone)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct SimFile {
    state: Arc<Mutex<State>>,
    inode: u64,
    generation: u64,
}

fn err(kind: io::ErrorKind, msg: impl Into<String>) -> io::Error {
    io::Error::new(kind, msg.into())
}

fn eio(msg: &str) -> io::Error {
    io::Error::other(format!("simulated I/O error (EIO) in {msg}"))
}

/// `EMFILE`: the process has no file descriptor left.
const EMFILE: i32 = 24;

fn enospc() -> io::Error {
    io::Error::from_raw_os_error(28)
}

fn power_cut() -> io::Error {
    io::Error::other("simulated power loss: the disk is gone")
}

fn apply(data: &mut Vec<u8>, op: &Pending) {
    match op {
        Pending::Write { offset, bytes } => {
            let end = *offset as usize + bytes.len();
            if data.len() < end {
                data.resize(end, 0);
            }
            data[*offset as usize..end].copy_from_slice(bytes);
        }
        Pending::SetLen(len) => data.resize(*len as usize, 0),
    }
}

impl State {
    /// Numbers an operation and decides its fate: `Ok(None)` proceed,
    /// `Ok(Some(fault))` proceed but fail with that fault, `Err` the power is
    /// cut (no effect at all).
    fn begin(&mut self, kind: OpKind) -> io::Result<Option<FaultKind>> {
        let n = self.ops;
        self.ops += 1;
        if self.power_cut_at.is_some_and(|cut| n >= cut) {
            return Err(power_cut());
        }
        let pos = self.faults.iter().position(|(at, f)| {
            *at <= n
                && match f {
                    FaultKind::SyncError => kind == OpKind::Sync,
                    FaultKind::WriteError | FaultKind::NoSpace => kind == OpKind::Write,
                    FaultKind::DirSyncError => matches!(kind, OpKind::Namespace | OpKind::Create),
                    FaultKind::TooManyFiles => kind == OpKind::Create,
                }
        });
        Ok(pos.map(|i| self.faults.remove(i).1))
    }

    fn used_bytes(&self) -> u64 {
        let referenced: BTreeSet<u64> = self.live.files.values().copied().collect();
        referenced.iter().map(|i| self.inodes.get(i).map_or(0, |n| n.live.len() as u64)).sum()
    }

    fn check_generation(&self, generation: u64) -> io::Result<()> {
        if generation != self.generation {
            return Err(io::Error::other("stale file handle from before a simulated crash"));
        }
        Ok(())
    }

    fn require_parent(&self, path: &Path) -> io::Result<()> {
        if self.live.has_dir(parent_dir(path)) {
            Ok(())
        } else {
            Err(err(
                io::ErrorKind::NotFound,
                format!("{}: parent directory missing", path.display()),
            ))
        }
    }
}

impl SimFs {
    /// An empty disk; `seed` drives every random decision (tears, holes,
    /// partial writes).
    pub fn new(seed: u64) -> Self {
        SimFs {
            state: Arc::new(Mutex::new(State {
                generation: 0,
                live: Namespace::default(),
                durable: Namespace::default(),
                inodes: HashMap::new(),
                next_inode: 1,
                ops: 0,
                syncs: 0,
                faults: Vec::new(),
                power_cut_at: None,
                capacity: None,
                rng: SimRng::new(seed),
            })),
        }
    }

    /// A shared handle, for APIs that take `Arc<dyn Fs>`.
    pub fn shared(&self) -> Arc<SimFs> {
        Arc::new(self.clone())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many operations have been numbered so far.
    pub fn op_count(&self) -> u64 {
        self.lock().ops
    }

    /// How many `sync_data` calls succeeded so far.
    pub fn sync_count(&self) -> u64 {
        self.lock().syncs
    }

    /// Arms a one-shot fault on the first matching operation numbered `at_op`
    /// or later.
    pub fn inject(&self, at_op: u64, fault: FaultKind) {
        self.lock().faults.push((at_op, fault));
    }

    /// From operation `at_op` on, every operation fails and changes nothing.
    pub fn power_cut_at(&self, at_op: u64) {
        self.lock().power_cut_at = Some(at_op);
    }

    /// Limits the total live size of all files; writes past it fail with
    /// `ENOSPC` (after writing what fits). `None` removes the limit.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.lock().capacity = bytes;
    }

    /// Simulates a crash: everything not durable is gone (or torn, per
    /// `mode`), open handles become stale, faults and power cuts are cleared.
    pub fn crash(&self, mode: CrashMode) {
        let mut st = self.lock();
        let st = &mut *st;
        st.generation += 1;
        st.live = st.durable.clone();
        st.faults.clear();
        st.power_cut_at = None;
        let referenced: BTreeSet<u64> = st.durable.files.values().copied().collect();
        st.inodes.retain(|id, _| referenced.contains(id));
        let mut ids: Vec<u64> = referenced.into_iter().collect();
        ids.sort_unstable(); // deterministic order of rng draws
        for id in ids {
            let Some(inode) = st.inodes.get_mut(&id) else { continue };
            let mut data = std::mem::take(&mut inode.durable);
            if mode != CrashMode::DropUnsynced && !inode.pending.is_empty() {
                let keep = st.rng.below(inode.pending.len() as u64 + 1) as usize;
                for op in &inode.pending[..keep] {
                    apply(&mut data, op);
                }
                if let Some(Pending::Write { offset, bytes }) = inode.pending.get(keep) {
                    let mut cut = st.rng.below(bytes.len() as u64 + 1) as usize;
                    if mode == CrashMode::TornWithHoles && cut < bytes.len() {
                        cut -= cut % 512; // sectors land whole or not at all
                    }
                    let part = &bytes[..cut];
                    if mode == CrashMode::TornWithHoles {
                        // A sector that never reached the disk reads as
                        // zeros past the old end of the file, and as the
                        // old bytes where the write overwrote them.
                        let old_len = data.len() as u64;
                        for (i, sector) in part.chunks(512).enumerate() {
                            let at = offset + (i * 512) as u64;
                            let lost = st.rng.chance(1, 3);
                            let bytes = if !lost {
                                sector.to_vec()
                            } else if at >= old_len {
                                vec![0; sector.len()]
                            } else {
                                let keep_old = (old_len - at).min(sector.len() as u64) as usize;
                                let mut v = data[at as usize..at as usize + keep_old].to_vec();
                                v.resize(sector.len(), 0);
                                v
                            };
                            apply(&mut data, &Pending::Write { offset: at, bytes });
                        }
                    } else {
                        apply(&mut data, &Pending::Write { offset: *offset, bytes: part.to_vec() });
                    }
                }
            }
            inode.live = data.clone();
            inode.durable = data;
            inode.pending.clear();
        }
    }

    /// Overwrites bytes of a file in both its live and durable state, as a
    /// bit rot or a bad sector would. For corruption tests.
    pub fn poke(&self, path: &Path, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let mut st = self.lock();
        let id = *st
            .live
            .files
            .get(path)
            .ok_or_else(|| err(io::ErrorKind::NotFound, path.display().to_string()))?;
        let inode = st.inodes.get_mut(&id).expect("inode of a live file");
        let op = Pending::Write { offset, bytes: bytes.to_vec() };
        apply(&mut inode.live, &op);
        apply(&mut inode.durable, &op);
        Ok(())
    }

    /// The durable length of a file, for tests.
    pub fn durable_len(&self, path: &Path) -> Option<u64> {
        let st = self.lock();
        let id = st.durable.files.get(path)?;
        st.inodes.get(id).map(|i| i.durable.len() as u64)
    }
}

impl Fs for SimFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileRef> {
        let mut st = self.lock();
        let generation = st.generation;
        if mode == OpenMode::Existing {
            let id = *st.live.files.get(path).ok_or_else(|| {
                err(io::ErrorKind::NotFound, format!("{}: no such file", path.display()))
            })?;
            return Ok(Arc::new(SimFile { state: self.state.clone(), inode: id, generation }));
        }
        let fault = st.begin(OpKind::Create)?;
        if fault == Some(FaultKind::TooManyFiles) {
            return Err(io::Error::from_raw_os_error(EMFILE));
        }
        st.require_parent(path)?;
        if st.live.dirs.contains(path) {
            return Err(err(io::ErrorKind::IsADirectory, path.display().to_string()));
        }
        let existing = st.live.files.get(path).copied();
        let id = match (mode, existing) {
            (OpenMode::CreateNew, Some(_)) => {
                return Err(err(
                    io::ErrorKind::AlreadyExists,
                    format!("{}: exists", path.display()),
                ));
            }
            (OpenMode::CreateOrTruncate, Some(id)) => {
                let inode = st.inodes.get_mut(&id).expect("inode");
                inode.live.clear();
                inode.pending.push(Pending::SetLen(0));
                id
            }
            _ => {
                let id = st.next_inode;
                st.next_inode += 1;
                st.inodes.insert(id, Inode::default());
                st.live.files.insert(path.to_path_buf(), id);
                id
            }
        };
        if fault.is_some() {
            // The file exists, but the directory sync failed.
            return Err(eio("directory sync after create"));
        }
        st.durable.files.insert(path.to_path_buf(), id);
        Ok(Arc::new(SimFile { state: self.state.clone(), inode: id, generation }))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        if st.live.has_dir(path) {
            return Ok(());
        }
        let fault = st.begin(OpKind::Namespace)?;
        let mut cur = Some(path);
        let mut added = Vec::new();
        while let Some(p) = cur {
            if p.as_os_str().is_empty() || st.live.has_dir(p) {
                break;
            }
            if st.live.files.contains_key(p) {
                return Err(err(
                    io::ErrorKind::AlreadyExists,
                    format!("{} is a file", p.display()),
                ));
            }
            added.push(p.to_path_buf());
            cur = p.parent();
        }
        for p in &added {
            st.live.dirs.insert(p.clone());
        }
        if fault.is_some() {
            return Err(eio("directory sync after mkdir"));
        }
        for p in added {
            st.durable.dirs.insert(p);
        }
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let st = self.lock();
        if !st.live.has_dir(path) {
            return Err(err(
                io::ErrorKind::NotFound,
                format!("{}: no such directory", path.display()),
            ));
        }
        let name_of = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_owned);
        let mut out = Vec::new();
        for d in &st.live.dirs {
            if d.parent() == Some(path) {
                out.extend(name_of(d).map(|name| DirEntry { name, is_dir: true }));
            }
        }
        for f in st.live.files.keys() {
            if f.parent() == Some(path) {
                out.extend(name_of(f).map(|name| DirEntry { name, is_dir: false }));
            }
        }
        out.sort();
        Ok(out)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.lock();
        let fault = st.begin(OpKind::Namespace)?;
        let id = *st.live.files.get(from).ok_or_else(|| {
            err(io::ErrorKind::NotFound, format!("{}: no such file", from.display()))
        })?;
        st.require_parent(to)?;
        st.live.files.remove(from);
        st.live.files.insert(to.to_path_buf(), id);
        if fault.is_some() {
            return Err(eio("directory sync after rename"));
        }
        // A rename is atomic: the durable namespace either has the old name
        // or the new one, never both.
        st.durable.files.remove(from);
        st.durable.files.insert(to.to_path_buf(), id);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        let fault = st.begin(OpKind::Namespace)?;
        if st.live.files.remove(path).is_none() {
            return Err(err(io::ErrorKind::NotFound, format!("{}: no such file", path.display())));
        }
        if fault.is_some() {
            return Err(eio("directory sync after remove"));
        }
        st.durable.files.remove(path);
        Ok(())
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        let fault = st.begin(OpKind::Namespace)?;
        if !st.live.dirs.contains(path) {
            return Err(err(
                io::ErrorKind::NotFound,
                format!("{}: no such directory", path.display()),
            ));
        }
        let under = |p: &Path| p.starts_with(path);
        st.live.dirs.retain(|d| !under(d));
        st.live.files.retain(|f, _| !under(f));
        if fault.is_some() {
            return Err(eio("directory sync after remove_dir_all"));
        }
        st.durable.dirs.retain(|d| !under(d));
        st.durable.files.retain(|f, _| !under(f));
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        let fault = st.begin(OpKind::Sync)?;
        if !st.live.has_dir(path) {
            return Err(err(
                io::ErrorKind::NotFound,
                format!("{}: no such directory", path.display()),
            ));
        }
        if fault.is_some() {
            return Err(eio("directory fsync"));
        }
        // The directory's entries become durable as they are now (after a
        // namespace operation whose own directory sync failed).
        let live: Vec<(PathBuf, u64)> = st
            .live
            .files
            .iter()
            .filter(|(p, _)| parent_dir(p) == path)
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        st.durable.files.retain(|p, _| parent_dir(p) != path);
        st.durable.files.extend(live);
        Ok(())
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let st = self.lock();
        Ok(st.live.has_dir(path) || st.live.files.contains_key(path))
    }

    fn in_memory(&self) -> bool {
        true
    }
}

impl SimFile {
    fn lock(&self) -> io::Result<MutexGuard<'_, State>> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.check_generation(self.generation)?;
        Ok(st)
    }
}

impl File for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let st = self.lock()?;
        let data = &st.inodes.get(&self.inode).expect("inode of an open file").live;
        let Ok(start) = usize::try_from(offset) else { return Ok(0) };
        if start >= data.len() {
            return Ok(0);
        }
        let n = buf.len().min(data.len() - start);
        buf[..n].copy_from_slice(&data[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut st = self.lock()?;
        let fault = st.begin(OpKind::Write)?;
        let mut len = buf.len();
        let mut result = Ok(());
        if let Some(f) = fault {
            len = st.rng.below(buf.len() as u64 + 1) as usize;
            result = Err(if f == FaultKind::NoSpace { enospc() } else { eio("write") });
        }
        if let Some(cap) = st.capacity {
            let cur = st.inodes.get(&self.inode).map_or(0, |i| i.live.len() as u64);
            let grow = (offset + len as u64).saturating_sub(cur);
            let used = st.used_bytes();
            if used + grow > cap {
                let room = cap.saturating_sub(used);
                let fits = (cur + room).saturating_sub(offset);
                len = len.min(fits as usize);
                result = Err(enospc());
            }
        }
        if len > 0 {
            let op = Pending::Write { offset, bytes: buf[..len].to_vec() };
            let inode = st.inodes.get_mut(&self.inode).expect("inode of an open file");
            apply(&mut inode.live, &op);
            inode.pending.push(op);
        }
        result
    }

    fn len(&self) -> io::Result<u64> {
        let st = self.lock()?;
        Ok(st.inodes.get(&self.inode).expect("inode of an open file").live.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut st = self.lock()?;
        let fault = st.begin(OpKind::Write)?;
        if let Some(f) = fault {
            return Err(if f == FaultKind::NoSpace { enospc() } else { eio("set_len") });
        }
        let op = Pending::SetLen(len);
        let inode = st.inodes.get_mut(&self.inode).expect("inode of an open file");
        apply(&mut inode.live, &op);
        inode.pending.push(op);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut st = self.lock()?;
        let fault = st.begin(OpKind::Sync)?;
        let inode = st.inodes.get_mut(&self.inode).expect("inode of an open file");
        if fault.is_some() {
            // Linux semantics: the dirty pages are dropped from writeback but
            // stay in the cache. The durable image is rebuilt without them.
            inode.pending.clear();
            return Err(eio("fsync"));
        }
        // Only what writeback still knows about reaches the disk: operations
        // forgotten by an earlier failed sync stay volatile.
        for op in std::mem::take(&mut inode.pending) {
            apply(&mut inode.durable, &op);
        }
        st.syncs += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write_file_atomic;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn read_all(fs: &SimFs, path: &str) -> Vec<u8> {
        let f = fs.open(&p(path), OpenMode::Existing).unwrap();
        let mut buf = vec![0; f.len().unwrap() as usize];
        f.read_exact_at(&mut buf, 0).unwrap();
        buf
    }

    #[test]
    fn crash_keeps_only_synced_bytes() {
        let fs = SimFs::new(1);
        fs.create_dir_all(&p("/d")).unwrap();
        let f = fs.open(&p("/d/f"), OpenMode::CreateNew).unwrap();
        f.write_all_at(b"durable", 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(b"-volatile", 7).unwrap();
        assert_eq!(f.len().unwrap(), 16);
        fs.crash(CrashMode::DropUnsynced);
        assert_eq!(read_all(&fs, "/d/f"), b"durable");
        // The old handle belongs to the world before the crash.
        assert!(f.len().is_err());
    }

    #[test]
    fn torn_crash_keeps_a_prefix_of_the_unsynced_writes() {
        for seed in 0..200 {
            let fs = SimFs::new(seed);
            fs.create_dir_all(&p("/d")).unwrap();
            let f = fs.open(&p("/d/f"), OpenMode::CreateNew).unwrap();
            f.write_all_at(b"AAAA", 0).unwrap();
            f.sync_data().unwrap();
            f.write_all_at(b"BBBB", 4).unwrap();
            f.write_all_at(b"CCCC", 8).unwrap();
            fs.crash(CrashMode::Torn);
            let got = read_all(&fs, "/d/f");
            let full = b"AAAABBBBCCCC";
            assert!(got.len() >= 4 && full.starts_with(&got), "seed {seed}: {got:?}");
        }
    }

    #[test]
    fn holes_read_as_zeros_but_never_invent_data() {
        let mut saw_hole = false;
        for seed in 0..100 {
            let fs = SimFs::new(seed);
            let f = fs.open(&p("f"), OpenMode::CreateNew).unwrap();
            f.write_all_at(&[7u8; 4096], 0).unwrap();
            fs.crash(CrashMode::TornWithHoles);
            let got = read_all(&fs, "f");
            assert!(got.iter().all(|&b| b == 0 || b == 7));
            saw_hole |= got.contains(&0);
        }
        assert!(saw_hole);
    }

    #[test]
    fn created_entries_are_durable_but_their_data_is_not() {
        let fs = SimFs::new(2);
        let f = fs.open(&p("new"), OpenMode::CreateNew).unwrap();
        f.write_all_at(b"x", 0).unwrap();
        fs.crash(CrashMode::DropUnsynced);
        assert!(fs.exists(&p("new")).unwrap());
        assert_eq!(read_all(&fs, "new"), b"");
    }

    #[test]
    fn failed_fsync_never_makes_its_bytes_durable_even_if_retried() {
        let fs = SimFs::new(3);
        let f = fs.open(&p("f"), OpenMode::CreateNew).unwrap();
        f.write_all_at(b"lost", 0).unwrap();
        fs.inject(0, FaultKind::SyncError);
        assert!(f.sync_data().is_err());
        // The cache still shows the bytes...
        assert_eq!(read_all(&fs, "f"), b"lost");
        // ...and a retry "succeeds", but proves nothing.
        f.sync_data().unwrap();
        fs.crash(CrashMode::DropUnsynced);
        assert_eq!(read_all(&fs, "f"), b"");
    }

    #[test]
    fn too_many_files_fails_one_create_before_it_creates_anything() {
        let fs = SimFs::new(6);
        fs.inject(fs.op_count(), FaultKind::TooManyFiles);
        let f = fs.open(&p("f"), OpenMode::CreateNew).unwrap_err();
        assert_eq!(f.raw_os_error(), Some(24));
        assert!(!fs.exists(&p("f")).unwrap());
        // One-shot: the next create works.
        fs.open(&p("f"), OpenMode::CreateNew).unwrap();
    }

    #[test]
    fn power_cut_stops_every_later_operation() {
        let fs = SimFs::new(4);
        let f = fs.open(&p("f"), OpenMode::CreateNew).unwrap();
        let at = fs.op_count();
        fs.power_cut_at(at + 1);
        f.write_all_at(b"kept", 0).unwrap();
        assert!(f.sync_data().is_err());
        assert!(fs.open(&p("g"), OpenMode::CreateNew).is_err());
        fs.crash(CrashMode::DropUnsynced);
        assert_eq!(read_all(&fs, "f"), b"");
        assert!(!fs.exists(&p("g")).unwrap());
    }

    #[test]
    fn no_space_fails_writes_past_capacity() {
        let fs = SimFs::new(5);
        fs.set_capacity(Some(10));
        let f = fs.open(&p("f"), OpenMode::CreateNew).unwrap();
        f.write_all_at(b"12345678", 0).unwrap();
        let e = f.write_all_at(b"abcdef", 8).unwrap_err();
        assert!(crate::is_no_space(&e), "{e}");
        assert_eq!(f.len().unwrap(), 10);
        fs.inject(0, FaultKind::NoSpace);
        fs.set_capacity(None);
        assert!(crate::is_no_space(&f.write_all_at(b"z", 0).unwrap_err()));
    }

    #[test]
    fn atomic_replace_leaves_old_or_new_never_a_mix() {
        for cut in 0..8 {
            let fs = SimFs::new(cut);
            write_file_atomic(&fs, &p("v"), b"old-value").unwrap();
            let start = fs.op_count();
            fs.power_cut_at(start + cut);
            let _ = write_file_atomic(&fs, &p("v"), b"new-value");
            fs.crash(CrashMode::TornWithHoles);
            let got = read_all(&fs, "v");
            assert!(got == b"old-value" || got == b"new-value", "cut {cut}: {got:?}");
        }
    }

    #[test]
    fn a_remove_whose_directory_sync_failed_is_durable_only_after_a_later_sync_dir() {
        for sync_after in [false, true] {
            let fs = SimFs::new(7);
            fs.create_dir_all(&p("/d")).unwrap();
            fs.open(&p("/d/x"), OpenMode::CreateNew).unwrap();
            fs.open(&p("/d/y"), OpenMode::CreateNew).unwrap();
            fs.inject(fs.op_count(), FaultKind::DirSyncError);
            assert!(fs.remove_file(&p("/d/x")).is_err());
            assert!(!fs.exists(&p("/d/x")).unwrap(), "gone from the live namespace");
            let again = fs.remove_file(&p("/d/x")).unwrap_err();
            assert_eq!(again.kind(), io::ErrorKind::NotFound);
            if sync_after {
                fs.sync_dir(&p("/d")).unwrap();
            }
            fs.crash(CrashMode::DropUnsynced);
            assert_eq!(fs.exists(&p("/d/x")).unwrap(), !sync_after, "sync_dir {sync_after}");
            assert!(fs.exists(&p("/d/y")).unwrap());
        }
    }

    #[test]
    fn rename_and_remove_update_the_listing() {
        let fs = SimFs::new(6);
        fs.create_dir_all(&p("/a/b")).unwrap();
        fs.open(&p("/a/b/x"), OpenMode::CreateNew).unwrap();
        fs.rename(&p("/a/b/x"), &p("/a/y")).unwrap();
        let names: Vec<String> =
            fs.list_dir(&p("/a")).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, vec!["b", "y"]);
        fs.remove_dir_all(&p("/a/b")).unwrap();
        fs.remove_file(&p("/a/y")).unwrap();
        assert!(fs.list_dir(&p("/a")).unwrap().is_empty());
        fs.crash(CrashMode::DropUnsynced);
        assert!(fs.list_dir(&p("/a")).unwrap().is_empty());
    }

    #[test]
    fn a_lost_sector_of_an_overwrite_keeps_the_old_bytes() {
        let mut saw_old = false;
        for seed in 0..100 {
            let fs = SimFs::new(seed);
            let f = fs.open(&p("f"), OpenMode::CreateNew).unwrap();
            f.write_all_at(&[1u8; 2048], 0).unwrap();
            f.sync_data().unwrap();
            f.write_all_at(&[2u8; 2048], 0).unwrap();
            fs.crash(CrashMode::TornWithHoles);
            let got = read_all(&fs, "f");
            assert_eq!(got.len(), 2048);
            for sector in got.chunks(512) {
                assert!(
                    sector.iter().all(|&b| b == 1) || sector.iter().all(|&b| b == 2),
                    "seed {seed}"
                );
            }
            saw_old |= got[..512].iter().all(|&b| b == 1) && got.contains(&2);
        }
        assert!(saw_old);
    }

    #[test]
    fn same_seed_same_crash_image() {
        let image = |seed| {
            let fs = SimFs::new(seed);
            let f = fs.open(&p("f"), OpenMode::CreateNew).unwrap();
            for i in 0..20u8 {
                f.write_all_at(&[i; 100], u64::from(i) * 100).unwrap();
            }
            fs.crash(CrashMode::TornWithHoles);
            read_all(&fs, "f")
        };
        assert_eq!(image(9), image(9));
    }
}
