//! The consumer frontier file, `consumer.offset`: the last contiguously
//! resolved offset of a partition's consumers (SPEC §2.1 `committed`), and
//! the topic incarnation it belongs to.
//!
//! # Byte layout (big-endian, 28 bytes, version 2)
//!
//! ```text
//! off  size  field
//! 0    4     magic "NCOF"
//! 4    1     version = 2
//! 5    3     reserved, zero
//! 8    8     last committed offset, u64
//! 16   8     topic incarnation, u64
//! 24   4     CRC32C over bytes [0, 24)
//! ```
//!
//! SPEC §5.1's file is 8 raw bytes; this one adds a magic, a version and a
//! CRC (DESIGN §3), so that a damaged file is refused instead of moving the
//! frontier to an arbitrary offset, and the incarnation, so that a frontier
//! written by a deleted topic's consumers (a persist that raced the delete
//! and the recreation of the name) is never taken for the new topic's:
//! [`ConsumerOffset::load`] ignores and removes a file of another
//! incarnation (its consumers start at the oldest record: duplicates, never
//! a skip). Older files are still read, as the live incarnation's (the
//! topic directory's marker vouches for the directory; the next persist
//! rewrites them as version 2): version 1 (20 bytes: the same header and
//! offset, then the CRC32C over bytes [0, 16)) and SPEC's 8-byte layout (a
//! big-endian i64, −1 for none).
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
use tracing::warn;

use crate::error::FrontierError;
use crate::limits::{CONSUMER_OFFSET_FILE_LEN, CONSUMER_OFFSET_MAX_READ};

/// The file name, inside the partition directory.
pub const CONSUMER_OFFSET_FILE_NAME: &str = "consumer.offset";

const MAGIC: [u8; 4] = *b"NCOF";
const VERSION: u8 = 2;
/// The length of a version 1 file (no incarnation).
const V1_LEN: usize = 20;

/// The `consumer.offset` file of one partition of one topic incarnation.
#[derive(Debug, Clone)]
pub struct ConsumerOffset {
    fs: FsRef,
    path: PathBuf,
    incarnation: u64,
}

/// A decoded frontier file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frontier {
    /// The last committed offset (`None`: SPEC's "−1", nothing yet).
    pub last_committed: Option<u64>,
    /// The topic incarnation that wrote it (`None`: an older version that
    /// did not record it).
    pub incarnation: Option<u64>,
}

impl ConsumerOffset {
    /// The frontier file of the partition directory `dir` of topic
    /// incarnation `incarnation`.
    pub fn new(fs: FsRef, dir: &Path, incarnation: u64) -> Self {
        ConsumerOffset { fs, path: dir.join(CONSUMER_OFFSET_FILE_NAME), incarnation }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last committed offset, or `None` if nothing was committed (no
    /// file, or a file another incarnation wrote, which is removed).
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
        let f = decode(&bytes)
            .map_err(|reason| FrontierError::Corrupt { path: self.path.clone(), reason })?;
        match f.incarnation {
            Some(other) if other != self.incarnation => {
                warn!(
                    path = %self.path.display(),
                    found = other,
                    live = self.incarnation,
                    last_committed = ?f.last_committed,
                    "ignoring and removing the consumer frontier of another topic incarnation"
                );
                if let Err(e) = self.fs.remove_file(&self.path)
                    && e.kind() != io::ErrorKind::NotFound
                {
                    // The next persist replaces it; until then it is
                    // ignored again at every load.
                    warn!(path = %self.path.display(), error = %e, "cannot remove the file");
                }
                Ok(None)
            }
            _ => Ok(f.last_committed),
        }
    }

    /// Durably replaces the file with `last_committed`.
    pub fn store(&self, last_committed: u64) -> Result<(), FrontierError> {
        narad_fs::write_file_atomic(
            &*self.fs,
            &self.path,
            &encode(last_committed, self.incarnation),
        )
        .map_err(|e| self.io("write", e))
    }

    fn io(&self, op: &'static str, source: io::Error) -> FrontierError {
        FrontierError::Io { op, path: self.path.clone(), source: Arc::new(source) }
    }
}

/// The file's bytes for `last_committed` of topic incarnation `incarnation`.
pub fn encode(last_committed: u64, incarnation: u64) -> [u8; CONSUMER_OFFSET_FILE_LEN as usize] {
    let mut out = [0u8; CONSUMER_OFFSET_FILE_LEN as usize];
    out[0..4].copy_from_slice(&MAGIC);
    out[4] = VERSION;
    out[8..16].copy_from_slice(&last_committed.to_be_bytes());
    out[16..24].copy_from_slice(&incarnation.to_be_bytes());
    let crc = crc32c::crc32c(&out[0..24]);
    out[24..28].copy_from_slice(&crc.to_be_bytes());
    out
}

/// Decodes the file's bytes (version 2, version 1 or SPEC's 8 bytes).
pub fn decode(bytes: &[u8]) -> Result<Frontier, String> {
    if bytes.len() == 8 {
        let v = i64::from_be_bytes(bytes.try_into().expect("8 bytes"));
        return match v {
            -1 => Ok(Frontier { last_committed: None, incarnation: None }),
            v if v >= 0 => Ok(Frontier { last_committed: Some(v as u64), incarnation: None }),
            v => Err(format!("legacy 8-byte value {v} is negative")),
        };
    }
    let (version, crc_at) = match bytes.len() {
        V1_LEN => (1, 16),
        n if n as u64 == CONSUMER_OFFSET_FILE_LEN => (VERSION, 24),
        n => return Err(format!("{n} bytes, expected {CONSUMER_OFFSET_FILE_LEN} (or {V1_LEN})")),
    };
    if bytes[0..4] != MAGIC {
        return Err(format!("bad magic {:02x?}", &bytes[0..4]));
    }
    let crc = u32::from_be_bytes(bytes[crc_at..crc_at + 4].try_into().expect("4 bytes"));
    let actual = crc32c::crc32c(&bytes[0..crc_at]);
    if crc != actual {
        return Err(format!("CRC mismatch: file says {crc:#010x}, bytes give {actual:#010x}"));
    }
    if bytes[4] != version {
        return Err(format!("version {} in a file of {} bytes", bytes[4], bytes.len()));
    }
    if bytes[5..8] != [0, 0, 0] {
        return Err("reserved bytes are not zero".to_string());
    }
    let last = u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let incarnation = (version == VERSION)
        .then(|| u64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes")));
    Ok(Frontier { last_committed: Some(last), incarnation })
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_fs::{CrashMode, Fs, SimFs};

    /// Checked-in bytes for offset 1,234,567 of incarnation
    /// 0x0102030405060708 (CRC computed independently).
    const GOLDEN: [u8; 28] = [
        b'N', b'C', b'O', b'F', 0x02, 0x00, 0x00, 0x00, // magic, version, reserved
        0x00, 0x00, 0x00, 0x00, 0x00, 0x12, 0xd6, 0x87, // 1,234,567
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // incarnation
        0xd0, 0x2d, 0x8e, 0x3e, // CRC32C
    ];

    /// Version 1 (before the incarnation), offset 1,234,567.
    const GOLDEN_V1: [u8; 20] = [
        b'N', b'C', b'O', b'F', 0x01, 0x00, 0x00, 0x00, // magic, version, reserved
        0x00, 0x00, 0x00, 0x00, 0x00, 0x12, 0xd6, 0x87, // 1,234,567
        0x60, 0x22, 0xeb, 0x91, // CRC32C
    ];

    const INC: u64 = 0x0102_0304_0506_0708;

    fn at(last: Option<u64>, incarnation: Option<u64>) -> Frontier {
        Frontier { last_committed: last, incarnation }
    }

    #[test]
    fn consumer_offset_golden_bytes() {
        assert_eq!(encode(1_234_567, INC), GOLDEN);
        assert_eq!(decode(&GOLDEN), Ok(at(Some(1_234_567), Some(INC))));
        // Version 1 and SPEC's 8-byte layout are still read (upgrades).
        assert_eq!(decode(&GOLDEN_V1), Ok(at(Some(1_234_567), None)));
        assert_eq!(decode(&42i64.to_be_bytes()), Ok(at(Some(42), None)));
        assert_eq!(decode(&(-1i64).to_be_bytes()), Ok(at(None, None)));
    }

    #[test]
    fn damaged_consumer_offset_files_are_refused() {
        for i in 0..GOLDEN.len() {
            let mut bad = GOLDEN;
            bad[i] ^= 0x01;
            assert!(decode(&bad).is_err(), "flip at byte {i}");
        }
        for i in 0..GOLDEN_V1.len() {
            let mut bad = GOLDEN_V1;
            bad[i] ^= 0x01;
            assert!(decode(&bad).is_err(), "v1 flip at byte {i}");
        }
        // A version that does not match the length, CRC made valid.
        let mut v1_in_v2 = GOLDEN;
        v1_in_v2[4] = 1;
        let crc = crc32c::crc32c(&v1_in_v2[..24]);
        v1_in_v2[24..].copy_from_slice(&crc.to_be_bytes());
        assert!(decode(&v1_in_v2).is_err());
        assert!(decode(&GOLDEN[..27]).is_err());
        assert!(decode(&GOLDEN[..19]).is_err());
        assert!(decode(&[]).is_err());
        assert!(decode(&(-2i64).to_be_bytes()).is_err());
    }

    #[test]
    fn missing_file_means_nothing_committed_and_values_round_trip() {
        let fs = SimFs::new(1);
        fs.create_dir_all(Path::new("/p")).unwrap();
        let f = ConsumerOffset::new(fs.shared(), Path::new("/p"), 1);
        assert_eq!(f.load().unwrap(), None);
        f.store(7).unwrap();
        assert_eq!(f.load().unwrap(), Some(7));
        f.store(u64::MAX >> 1).unwrap();
        assert_eq!(f.load().unwrap(), Some(u64::MAX >> 1));
        fs.crash(CrashMode::DropUnsynced);
        assert_eq!(
            ConsumerOffset::new(fs.shared(), Path::new("/p"), 1).load().unwrap(),
            Some(u64::MAX >> 1)
        );
    }

    #[test]
    fn a_crash_during_store_leaves_the_old_or_the_new_value() {
        for cut in 0..6 {
            for mode in [CrashMode::DropUnsynced, CrashMode::Torn, CrashMode::TornWithHoles] {
                let fs = SimFs::new(cut);
                fs.create_dir_all(Path::new("/p")).unwrap();
                let f = ConsumerOffset::new(fs.shared(), Path::new("/p"), 1);
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
        let f = ConsumerOffset::new(fs.shared(), Path::new("/t/p"), 1);
        f.store(1).unwrap();
        fs.remove_dir_all(Path::new("/t/p")).unwrap();
        assert!(matches!(f.store(2), Err(FrontierError::Io { .. })));
        assert!(!fs.exists(Path::new("/t/p")).unwrap());
    }

    #[test]
    fn a_corrupt_file_is_an_error_not_a_value() {
        let fs = SimFs::new(3);
        fs.create_dir_all(Path::new("/p")).unwrap();
        let f = ConsumerOffset::new(fs.shared(), Path::new("/p"), 1);
        f.store(5).unwrap();
        fs.poke(f.path(), 10, &[0xff]).unwrap();
        assert!(matches!(f.load(), Err(FrontierError::Corrupt { .. })));
    }

    /// A frontier another incarnation of the topic wrote is not this
    /// one's: it is ignored (its consumers start at the oldest record) and
    /// removed. A version 1 file is read as the live incarnation's and
    /// rewritten as version 2 by the next store.
    #[test]
    fn a_frontier_of_another_incarnation_is_ignored_and_removed() {
        let fs = SimFs::new(4);
        fs.create_dir_all(Path::new("/p")).unwrap();
        ConsumerOffset::new(fs.shared(), Path::new("/p"), 7).store(41).unwrap();
        let live = ConsumerOffset::new(fs.shared(), Path::new("/p"), 9);
        assert_eq!(live.load().unwrap(), None);
        assert!(!fs.exists(live.path()).unwrap(), "removed");
        live.store(3).unwrap();
        assert_eq!(live.load().unwrap(), Some(3));
        narad_fs::write_file_atomic(&fs, live.path(), &GOLDEN_V1).unwrap();
        assert_eq!(live.load().unwrap(), Some(1_234_567), "an upgrade keeps its frontier");
        live.store(1_234_568).unwrap();
        let bytes = narad_fs::read_small_file(&fs, live.path(), 64).unwrap();
        assert_eq!(decode(&bytes), Ok(at(Some(1_234_568), Some(9))));
    }
}
