//! The dispatch checkpoint: the first WAL sequence number not yet dispatched.
//!
//! # File `checkpoint` (48 bytes, big-endian)
//! ```text
//! 0  magic "NWALCKPT" (8) | 8 version u16 = 1 | 10 reserved (6 bytes, zero)
//! 16 slot 0: value u64 | crc32c u32 over (value ++ slot index u8) | 4 zero
//! 32 slot 1: same
//! ```
//! SPEC and DESIGN describe an 8-byte value; this file is that value twice,
//! under CRCs, behind a magic and a version: it is overwritten in place on
//! every move and synced only later, so a torn write must be detectable and
//! must not destroy the previous value (docs/DURABILITY.md).
//!
//! # How it is written
//! The file is created whole by write-temp + fdatasync + rename. After that,
//! every move of the checkpoint overwrites one 12-byte slot in place, the two
//! slots alternating, without a sync ("stored"): a process crash keeps the
//! value, because it is in the page cache. A background flush fdatasyncs the
//! file at most [`crate::limits::CHECKPOINT_SYNC_DELAY`] later ("synced");
//! compaction trusts only synced values.
//!
//! # What a crash may leave, and why it is safe
//! A torn slot fails its CRC; the other slot then holds the previous value.
//! The reader takes the largest valid slot (the checkpoint only grows). A
//! power loss can bring back a value up to one flush old: records between it
//! and the real checkpoint are dispatched again (duplicates, never loss).
//! With no valid slot at all the WAL falls back to its oldest segment, which
//! is equally safe: segments are only deleted behind a synced checkpoint.

use std::io;
use std::path::{Path, PathBuf};

use narad_fs::{FileRef, Fs, OpenMode};

/// File name of the checkpoint inside the WAL directory.
pub const CHECKPOINT_FILE: &str = "checkpoint";
const MAGIC: [u8; 8] = *b"NWALCKPT";
const VERSION: u16 = 1;
const FILE_BYTES: usize = 48;
const SLOT_OFFSETS: [u64; 2] = [16, 32];

fn slot_bytes(index: usize, value: u64) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&value.to_be_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..8]), &[index as u8]);
    b[8..].copy_from_slice(&crc.to_be_bytes());
    b
}

/// Encodes a whole checkpoint file holding `value` in slot 0 (slot 1 empty).
pub fn encode_file(value: u64) -> [u8; FILE_BYTES] {
    let mut f = [0u8; FILE_BYTES];
    f[..8].copy_from_slice(&MAGIC);
    f[8..10].copy_from_slice(&VERSION.to_be_bytes());
    f[16..28].copy_from_slice(&slot_bytes(0, value));
    f
}

/// What a checkpoint file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// The largest valid slot value.
    Value(u64),
    /// The header is valid but no slot is.
    NoValidSlot,
    /// Not a checkpoint file of a known version.
    Damaged,
}

/// Decodes a checkpoint file's bytes.
pub fn decode_file(b: &[u8]) -> Stored {
    if b.len() < FILE_BYTES
        || b[..8] != MAGIC
        || u16::from_be_bytes([b[8], b[9]]) != VERSION
        || b[10..16].iter().any(|&x| x != 0)
    {
        return Stored::Damaged;
    }
    let mut best = None;
    for (i, off) in SLOT_OFFSETS.iter().enumerate() {
        let o = *off as usize;
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[o..o + 8]);
        let value = u64::from_be_bytes(v);
        if b[o..o + 12] == slot_bytes(i, value) {
            best = best.max(Some(value));
        }
    }
    best.map_or(Stored::NoValidSlot, Stored::Value)
}

/// An open checkpoint file, overwritten in place.
#[derive(Debug)]
pub struct CheckpointFile {
    file: FileRef,
    next_slot: usize,
}

impl CheckpointFile {
    /// Reads the checkpoint in `dir`, if the file exists.
    pub fn read(fs: &dyn Fs, dir: &Path) -> io::Result<Option<Stored>> {
        let path = dir.join(CHECKPOINT_FILE);
        if !fs.exists(&path)? {
            return Ok(None);
        }
        let bytes = narad_fs::read_small_file(fs, &path, 4096)?;
        Ok(Some(decode_file(&bytes)))
    }

    /// Replaces the file with one holding `value`, durably (temp + fdatasync
    /// + rename), and opens it for in-place stores.
    pub fn create(fs: &dyn Fs, dir: &Path, value: u64) -> io::Result<CheckpointFile> {
        let path = Self::path(dir);
        narad_fs::write_file_atomic(fs, &path, &encode_file(value))?;
        let file = fs.open(&path, OpenMode::Existing)?;
        Ok(CheckpointFile { file, next_slot: 1 })
    }

    /// The checkpoint's path in `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(CHECKPOINT_FILE)
    }

    /// Overwrites the next slot with `value` (no sync).
    pub fn store(&mut self, value: u64) -> io::Result<()> {
        let slot = self.next_slot;
        self.file.write_all_at(&slot_bytes(slot, value), SLOT_OFFSETS[slot])?;
        self.next_slot = 1 - slot;
        Ok(())
    }

    /// Another handle to the file, to sync it without holding a lock.
    pub fn clone_handle(&self) -> FileRef {
        self.file.clone()
    }

    /// Makes every stored value durable.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_fs::{CrashMode, SimFs};

    const GOLDEN_FILE_VALUE_7: &[u8] = &[
        b'N', b'W', b'A', b'L', b'C', b'K', b'P', b'T', 0, 1, 0, 0, 0, 0, 0, 0, //
        0, 0, 0, 0, 0, 0, 0, 7, 0xC1, 0x88, 0xA1, 0xE6, 0, 0, 0, 0, // crc32c(value ++ 0)
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn checkpoint_file_matches_golden_bytes() {
        let f = encode_file(7);
        assert_eq!(&f[..], GOLDEN_FILE_VALUE_7, "{:02X?}", &f[24..28]);
        assert_eq!(decode_file(GOLDEN_FILE_VALUE_7), Stored::Value(7));
    }

    #[test]
    fn largest_valid_slot_wins_and_a_torn_slot_falls_back() {
        let mut f = encode_file(7).to_vec();
        f[32..44].copy_from_slice(&slot_bytes(1, 9));
        assert_eq!(decode_file(&f), Stored::Value(9));
        f[40] ^= 0xFF; // tear slot 1
        assert_eq!(decode_file(&f), Stored::Value(7));
        f[20] ^= 0xFF; // and slot 0
        assert_eq!(decode_file(&f), Stored::NoValidSlot);
        f[0] = b'X';
        assert_eq!(decode_file(&f), Stored::Damaged);
        // A slot's CRC binds it to its position: slot 0's bytes in slot 1 fail.
        let mut g = encode_file(7).to_vec();
        let s0 = g[16..28].to_vec();
        g[32..44].copy_from_slice(&s0);
        g[16..28].fill(0);
        assert_eq!(decode_file(&g), Stored::NoValidSlot);
    }

    #[test]
    fn stored_values_survive_a_crash_only_once_synced() {
        for seed in 0..50 {
            let fs = SimFs::new(seed);
            let dir = Path::new("/wal");
            fs.create_dir_all(dir).unwrap();
            let mut c = CheckpointFile::create(&fs, dir, 10).unwrap();
            c.store(11).unwrap();
            c.store(12).unwrap();
            c.sync().unwrap();
            c.store(13).unwrap();
            c.store(14).unwrap();
            fs.crash(CrashMode::TornWithHoles);
            match CheckpointFile::read(&fs, dir).unwrap() {
                Some(Stored::Value(v)) => assert!((12..=14).contains(&v), "seed {seed}: {v}"),
                other => panic!("seed {seed}: {other:?}"),
            }
        }
    }
}
