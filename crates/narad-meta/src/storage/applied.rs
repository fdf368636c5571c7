//! The applied-index record: an independent witness of how far the
//! metastore got, kept outside its directory, so a metastore that went back
//! in time (an older copy restored, a damaged newest commit that redb
//! answered with the previous one, a deleted file) is refused at open
//! instead of believed.
//!
//! # File `<data>/metastore.applied` (48 bytes, big-endian)
//! ```text
//! 0  magic "NMETAAPL" (8) | 8 version u16 = 1 | 10 reserved (6 bytes, zero)
//! 16 slot 0: applied index u64 | crc32c u32 over (index ++ slot number u8) | 4 zero
//! 32 slot 1: same
//! ```
//! An index is written into slot `index % 2`, so consecutive commits
//! alternate slots.
//!
//! # How it is written
//! Created whole (write temp + fdatasync + rename) at the first open that
//! finds none. After every metastore commit the new index overwrites its
//! slot in place and the file is fdatasynced, before the command's answer
//! goes out. A failed write or sync latches: the store refuses further
//! writes (as after a failed commit).
//!
//! The one way down: installing a Raft snapshot may move the metastore to a
//! lower applied index (the index is the store's own count of applied
//! commands, and the snapshot's is whatever the leader's was). Before the
//! new database replaces the old one, [`AppliedRecord::lower`] rewrites the
//! whole file (write temp + fdatasync + rename) holding only the lower
//! index, so neither slot keeps the old one: a crash before the rename
//! leaves the old metastore, ahead of the record (allowed); after it, the
//! new one, equal to it.
//!
//! # Invariants, and what a crash may leave
//! * The record never runs ahead of the metastore: it is written after the
//!   commit is durable. A crash between the two leaves it one behind, which
//!   is allowed (open then brings it up to date).
//! * A torn slot fails its CRC; the other slot holds an older index. The
//!   reader takes the largest valid slot.
//! * Open refuses when the metastore's applied index is below the record,
//!   when the metastore file is missing while the record exists, and when
//!   the record is damaged (no valid header or slot): each means the
//!   metastore cannot be shown to hold every acknowledged command.

use std::io;
use std::path::{Path, PathBuf};

use narad_fs::{FileRef, Fs, OpenMode};

/// File name of the record inside the data directory.
pub const APPLIED_FILE: &str = "metastore.applied";
const MAGIC: [u8; 8] = *b"NMETAAPL";
const VERSION: u16 = 1;
const FILE_BYTES: usize = 48;
const SLOT_OFFSETS: [u64; 2] = [16, 32];

/// Where the record of the metastore under `data_dir` lives.
pub fn applied_path(data_dir: &Path) -> PathBuf {
    data_dir.join(APPLIED_FILE)
}

fn slot_of(index: u64) -> usize {
    (index % 2) as usize
}

fn slot_bytes(slot: usize, index: u64) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&index.to_be_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..8]), &[slot as u8]);
    b[8..].copy_from_slice(&crc.to_be_bytes());
    b
}

/// A whole record file holding `index` in its slot (the other slot empty).
pub(crate) fn encode_file(index: u64) -> [u8; FILE_BYTES] {
    let mut f = [0u8; FILE_BYTES];
    f[..8].copy_from_slice(&MAGIC);
    f[8..10].copy_from_slice(&VERSION.to_be_bytes());
    let at = SLOT_OFFSETS[slot_of(index)] as usize;
    f[at..at + 12].copy_from_slice(&slot_bytes(slot_of(index), index));
    f
}

/// The largest valid slot of a record file's bytes, or why there is none.
pub(crate) fn decode_file(b: &[u8]) -> Result<u64, String> {
    if b.len() != FILE_BYTES {
        return Err(format!("is {} bytes, not {FILE_BYTES}", b.len()));
    }
    if b[..8] != MAGIC {
        return Err("has no applied-index magic".to_owned());
    }
    let version = u16::from_be_bytes([b[8], b[9]]);
    if version != VERSION || b[10..16].iter().any(|&x| x != 0) {
        return Err(format!("has unknown version {version} or a damaged header"));
    }
    SLOT_OFFSETS
        .iter()
        .enumerate()
        .filter_map(|(slot, &off)| {
            let o = off as usize;
            let index = u64::from_be_bytes(b[o..o + 8].try_into().expect("8 bytes"));
            (b[o..o + 12] == slot_bytes(slot, index) && slot_of(index) == slot).then_some(index)
        })
        .max()
        .ok_or_else(|| "has no valid slot".to_owned())
}

/// The open record.
#[derive(Debug)]
pub(crate) struct AppliedRecord {
    path: PathBuf,
    file: FileRef,
    index: u64,
}

impl AppliedRecord {
    /// The index the record at `path` holds; `None` when there is no file.
    pub(crate) fn read(fs: &dyn Fs, path: &Path) -> Result<Option<u64>, String> {
        if !fs.exists(path).map_err(|e| format!("cannot stat {}: {e}", path.display()))? {
            return Ok(None);
        }
        let bytes = narad_fs::read_small_file(fs, path, FILE_BYTES as u64)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        decode_file(&bytes).map(Some).map_err(|why| format!("{} {why}", path.display()))
    }

    /// Opens the record at `path` and brings it up to `index` (creating it
    /// if missing). The caller has checked that `index` is not behind it.
    pub(crate) fn open(fs: &dyn Fs, path: &Path, index: u64) -> io::Result<AppliedRecord> {
        if !fs.exists(path)? {
            narad_fs::write_file_atomic(fs, path, &encode_file(index))?;
        }
        let file = fs.open(path, OpenMode::Existing)?;
        let mut record = AppliedRecord { path: path.to_path_buf(), file, index: 0 };
        let stored = narad_fs::read_small_file(fs, path, FILE_BYTES as u64)
            .ok()
            .and_then(|b| decode_file(&b).ok());
        record.index = stored.unwrap_or(0);
        if stored != Some(index) {
            record.store(index)?;
        }
        Ok(record)
    }

    /// Records `index` durably (one 12-byte slot write and an fdatasync).
    pub(crate) fn store(&mut self, index: u64) -> io::Result<()> {
        let slot = slot_of(index);
        self.file.write_all_at(&slot_bytes(slot, index), SLOT_OFFSETS[slot])?;
        self.file.sync_data()?;
        self.index = index;
        Ok(())
    }

    /// Lowers the record to `index`, explicitly (only for installing a
    /// snapshot behind the current state; see the module docs): rewrites
    /// the whole file atomically so that no slot keeps a larger index, and
    /// reopens it.
    pub(crate) fn lower(&mut self, fs: &dyn Fs, index: u64) -> io::Result<()> {
        narad_fs::write_file_atomic(fs, &self.path, &encode_file(index))?;
        self.file = fs.open(&self.path, OpenMode::Existing)?;
        self.index = index;
        Ok(())
    }

    /// The index last recorded.
    pub(crate) fn index(&self) -> u64 {
        self.index
    }

    /// The record's file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_matches_its_golden_bytes_and_rejects_damage() {
        let f = encode_file(0x0102_0304_0506_0708);
        let mut golden = [0u8; 48];
        golden[..16].copy_from_slice(b"NMETAAPL\x00\x01\x00\x00\x00\x00\x00\x00");
        // index 0x0102030405060708 is even: slot 0.
        golden[16..28].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 0x22, 0xA6, 0x62, 0x35]);
        assert_eq!(f, golden);
        assert_eq!(
            crc32c::crc32c(&[1, 2, 3, 4, 5, 6, 7, 8, 0]),
            0x22A6_6235,
            "the slot CRC covers the index and the slot number"
        );
        assert_eq!(decode_file(&f), Ok(0x0102_0304_0506_0708));
        for i in (0..16).chain(16..28) {
            let mut bad = f;
            bad[i] ^= 0x40;
            assert!(decode_file(&bad).is_err(), "byte {i}");
        }
        assert!(decode_file(&f[..47]).is_err());
    }

    #[test]
    fn the_larger_valid_slot_wins_and_a_torn_slot_falls_back_to_the_other() {
        let fs = narad_fs::SimFs::new(1);
        let path = PathBuf::from("/d/metastore.applied");
        fs.create_dir_all(Path::new("/d")).unwrap();
        let mut r = AppliedRecord::open(&fs, &path, 6).unwrap();
        r.store(7).unwrap();
        assert_eq!(AppliedRecord::read(&fs, &path), Ok(Some(7)));
        // Tear slot 1 (index 7): slot 0 still says 6.
        let file = fs.open(&path, OpenMode::Existing).unwrap();
        file.write_all_at(&[0xFF], 40).unwrap();
        assert_eq!(AppliedRecord::read(&fs, &path), Ok(Some(6)));
        file.write_all_at(&[0xFF], 24).unwrap();
        let e = AppliedRecord::read(&fs, &path).unwrap_err();
        assert!(e.contains("metastore.applied has no valid slot"), "{e}");
        assert_eq!(AppliedRecord::read(&fs, Path::new("/d/none")), Ok(None));
    }

    #[test]
    fn lowering_the_record_forgets_the_larger_index_in_both_slots() {
        let fs = narad_fs::SimFs::new(1);
        let path = PathBuf::from("/d/metastore.applied");
        fs.create_dir_all(Path::new("/d")).unwrap();
        let mut r = AppliedRecord::open(&fs, &path, 8).unwrap();
        r.store(9).unwrap();
        r.lower(&fs, 4).unwrap();
        assert_eq!(AppliedRecord::read(&fs, &path), Ok(Some(4)));
        r.store(5).unwrap();
        assert_eq!(AppliedRecord::read(&fs, &path), Ok(Some(5)));
        assert_eq!(r.index(), 5);
    }
}
