//! The consumer frontier file, `consumer.offset`: the last contiguously
//! resolved offset of a partition's consumers (SPEC §2.1 `committed`).
//!
//! # Byte layout (big-endian, 20 bytes)
//!
//! ```text
//! off  size  field
//! 0    4     magic "NCOF"
//! 4    1     version = 1
//! 5    3     reserved, zero
//! 8    8     last committed offset, u64
//! 16   4     CRC32C over bytes [0, 16)
//! ```
//!
//! SPEC §5.1's file is 8 raw bytes; this one adds a magic, a version and a
//! CRC (DESIGN §3), so that a damaged file is refused instead of moving the
//! frontier to an arbitrary offset. An 8-byte file in SPEC's layout (a
//! big-endian i64, −1 for none) is still read.
//!
//! # Writing, and what a crash may leave
//!
//! The file is replaced with [`narad_fs::write_file_atomic`]: a temporary
//! sibling `consumer.offset.tmp` is written and fdatasynced, then renamed
//! over the file, and the directory is fsynced. A crash leaves the old value
//! or the new one, never a mix, and possibly a stale temporary file (ignored,
//! overwritten next time). The partition directory is never created here: a
//! write into a directory that was deleted (the topic was) fails.
//!
//! A missing file means nothing was committed yet.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use narad_fs::FsRef;

use crate::error::FrontierError;
use crate::limits::{CONSUMER_OFFSET_FILE_LEN, CONSUMER_OFFSET_MAX_READ};

/// The file name, inside the partition directory.
pub const CONSUMER_OFFSET_FILE_NAME: &str = "consumer.offset";

const MAGIC: [u8; 4] = *b"NCOF";
const VERSION: u8 = 1;

/// The `consumer.offset` file of one partition.
#[derive(Debug, Clone)]
pub struct ConsumerOffset {
    fs: FsRef,
    path: PathBuf,
}

impl ConsumerOffset {
    /// The frontier file of the partition directory `dir`.
    pub fn new(fs: FsRef, dir: &Path) -> Self {
        ConsumerOffset { fs, path: dir.join(CONSUMER_OFFSET_FILE_NAME) }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last committed offset, or `None` if nothing was committed (no
    /// file).
    pub fn load(&self) -> Result<Option<u64>, FrontierError> {
        let bytes = match narad_fs::read_small_file(&*self.fs, &self.path, CONSUMER_OFFSET_MAX_READ)
        {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return Err(FrontierError::Corrupt {
                    path: self.path.clone(),
                    reason: e.to_string(),
                });
            }
            Err(e) => return Err(self.io("read", e)),
        };
        decode(&bytes).map_err(|reason| FrontierError::Corrupt { path: self.path.clone(), reason })
    }

    /// Durably replaces the file with `last_committed`.
    pub fn store(&self, last_committed: u64) -> Result<(), FrontierError> {
        narad_fs::write_file_atomic(&*self.fs, &self.path, &encode(last_committed))
            .map_err(|e| self.io("write", e))
    }

    fn io(&self, op: &'static str, source: io::Error) -> FrontierError {
        FrontierError::Io { op, path: self.path.clone(), source: Arc::new(source) }
    }
}

/// The file's bytes for `last_committed`.
pub fn encode(last_committed: u64) -> [u8; CONSUMER_OFFSET_FILE_LEN as usize] {
    let mut out = [0u8; CONSUMER_OFFSET_FILE_LEN as usize];
    out[0..4].copy_from_slice(&MAGIC);
    out[4] = VERSION;
    out[8..16].copy_from_slice(&last_committed.to_be_bytes());
    let crc = crc32c::crc32c(&out[0..16]);
    out[16..20].copy_from_slice(&crc.to_be_bytes());
    out
}

/// Decodes the file's bytes: `None` for SPEC's legacy "−1".
pub fn decode(bytes: &[u8]) -> Result<Option<u64>, String> {
    if bytes.len() == 8 {
        let v = i64::from_be_bytes(bytes.try_into().expect("8 bytes"));
        return match v {
            -1 => Ok(None),
            v if v >= 0 => Ok(Some(v as u64)),
            v => Err(format!("legacy 8-byte value {v} is negative")),
        };
    }
    if bytes.len() as u64 != CONSUMER_OFFSET_FILE_LEN {
        return Err(format!("{} bytes, expected {CONSUMER_OFFSET_FILE_LEN}", bytes.len()));
    }
    if bytes[0..4] != MAGIC {
        return Err(format!("bad magic {:02x?}", &bytes[0..4]));
    }
    let crc = u32::from_be_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let actual = crc32c::crc32c(&bytes[0..16]);
    if crc != actual {
        return Err(format!("CRC mismatch: file says {crc:#010x}, bytes give {actual:#010x}"));
    }
    if bytes[4] != VERSION {
        return Err(format!("unknown version {}", bytes[4]));
    }
    if bytes[5..8] != [0, 0, 0] {
        return Err("reserved bytes are not zero".to_string());
    }
    Ok(Some(u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes"))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_fs::{CrashMode, Fs, SimFs};

    /// Checked-in bytes for offset 1,234,567 (CRC computed independently).
    const GOLDEN: [u8; 20] = [
        b'N', b'C', b'O', b'F', 0x01, 0x00, 0x00, 0x00, // magic, version, reserved
        0x00, 0x00, 0x00, 0x00, 0x00, 0x12, 0xd6, 0x87, // 1,234,567
        0x60, 0x22, 0xeb, 0x91, // CRC32C
    ];

    #[test]
    fn consumer_offset_golden_bytes() {
        assert_eq!(encode(1_234_567), GOLDEN);
        assert_eq!(decode(&GOLDEN), Ok(Some(1_234_567)));
        // SPEC's legacy 8-byte layout.
        assert_eq!(decode(&42i64.to_be_bytes()), Ok(Some(42)));
        assert_eq!(decode(&(-1i64).to_be_bytes()), Ok(None));
    }

    #[test]
    fn damaged_consumer_offset_files_are_refused() {
        for i in 0..GOLDEN.len() {
            let mut bad = GOLDEN;
            bad[i] ^= 0x01;
            assert!(decode(&bad).is_err(), "flip at byte {i}");
        }
        assert!(decode(&GOLDEN[..19]).is_err());
        assert!(decode(&[]).is_err());
        assert!(decode(&(-2i64).to_be_bytes()).is_err());
    }

    #[test]
    fn missing_file_means_nothing_committed_and_values_round_trip() {
        let fs = SimFs::new(1);
        fs.create_dir_all(Path::new("/p")).unwrap();
        let f = ConsumerOffset::new(fs.shared(), Path::new("/p"));
        assert_eq!(f.load().unwrap(), None);
        f.store(7).unwrap();
        assert_eq!(f.load().unwrap(), Some(7));
        f.store(u64::MAX >> 1).unwrap();
        assert_eq!(f.load().unwrap(), Some(u64::MAX >> 1));
        fs.crash(CrashMode::DropUnsynced);
        assert_eq!(
            ConsumerOffset::new(fs.shared(), Path::new("/p")).load().unwrap(),
            Some(u64::MAX >> 1)
        );
    }

    #[test]
    fn a_crash_during_store_leaves_the_old_or_the_new_value() {
        for cut in 0..6 {
            for mode in [CrashMode::DropUnsynced, CrashMode::Torn, CrashMode::TornWithHoles] {
                let fs = SimFs::new(cut);
                fs.create_dir_all(Path::new("/p")).unwrap();
                let f = ConsumerOffset::new(fs.shared(), Path::new("/p"));
                f.store(100).unwrap();
                fs.power_cut_at(fs.op_count() + cut);
                let stored = f.store(200).is_ok();
                fs.crash(mode);
                let got = f.load().unwrap();
                assert!(got == Some(100) || got == Some(200), "cut {cut} {mode:?}: {got:?}");
                if stored {
                    assert_eq!(got, Some(200), "an Ok store must survive");
                }
            }
        }
    }

    #[test]
    fn store_never_recreates_a_deleted_partition_directory() {
        let fs = SimFs::new(2);
        fs.create_dir_all(Path::new("/t/p")).unwrap();
        let f = ConsumerOffset::new(fs.shared(), Path::new("/t/p"));
        f.store(1).unwrap();
        fs.remove_dir_all(Path::new("/t/p")).unwrap();
        assert!(matches!(f.store(2), Err(FrontierError::Io { .. })));
        assert!(!fs.exists(Path::new("/t/p")).unwrap());
    }

    #[test]
    fn a_corrupt_file_is_an_error_not_a_value() {
        let fs = SimFs::new(3);
        fs.create_dir_all(Path::new("/p")).unwrap();
        let f = ConsumerOffset::new(fs.shared(), Path::new("/p"));
        f.store(5).unwrap();
        fs.poke(f.path(), 10, &[0xff]).unwrap();
        assert!(matches!(f.load(), Err(FrontierError::Corrupt { .. })));
    }
}
