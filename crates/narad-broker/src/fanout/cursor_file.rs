//! The fan-out cursor file: how far one child's cursor on one parent
//! partition got.
//!
//! # File `fanout@<epoch>.offset` in the parent partition's directory
//! (28 bytes, big-endian)
//!
//! The name carries the attach epoch (16 lowercase hex digits), not the
//! child's name: `fanout@` + 16 + `.offset.tmp` is 34 bytes whatever the
//! child is called, so every valid topic name (up to 255 characters) fits
//! the file-name limit, and each attachment has its own file. `@` never
//! occurs in a topic name, so these names cannot be mistaken for the
//! earlier `fanout-<child>.offset` ([`legacy_path`]): a cursor that finds
//! no file of its epoch reads that one once (upgrade) and moves it to the
//! new name; the sweep removes one whose child is no longer linked.
//! ```text
//! 0 magic "NFOC" | 4 version u8 = 1 | 5 reserved (3 bytes, zero)
//! 8 attach epoch u64 | 16 next parent offset u64 | 24 crc32c u32 over [0, 24)
//! ```
//! Written by temp + fdatasync + rename, only after every child commit of
//! the records below `next` is durable, so a crash makes the cursor re-send
//! (duplicates), never skip (loss). The epoch inside must match the name's
//! (a file of another epoch is ignored).

use std::path::{Path, PathBuf};

use narad_fs::Fs;

const MAGIC: &[u8; 4] = b"NFOC";
const VERSION: u8 = 1;
/// Bytes of a cursor file.
pub const FILE_BYTES: usize = 28;

/// A cursor position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CursorState {
    /// The attachment it belongs to.
    pub epoch: u64,
    /// The next parent offset to send.
    pub next_offset: u64,
}

/// Encodes a cursor file.
pub fn encode(s: CursorState) -> [u8; FILE_BYTES] {
    let mut b = [0u8; FILE_BYTES];
    b[..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    b[8..16].copy_from_slice(&s.epoch.to_be_bytes());
    b[16..24].copy_from_slice(&s.next_offset.to_be_bytes());
    let crc = crc32c::crc32c(&b[..24]);
    b[24..28].copy_from_slice(&crc.to_be_bytes());
    b
}

/// Decodes a cursor file; `None` if it is not one (damaged or foreign).
pub fn decode(b: &[u8]) -> Option<CursorState> {
    if b.len() != FILE_BYTES || &b[..4] != MAGIC || b[4] != VERSION || b[5..8] != [0; 3] {
        return None;
    }
    let crc = u32::from_be_bytes([b[24], b[25], b[26], b[27]]);
    if crc32c::crc32c(&b[..24]) != crc {
        return None;
    }
    let u = |r: std::ops::Range<usize>| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[r]);
        u64::from_be_bytes(a)
    };
    Some(CursorState { epoch: u(8..16), next_offset: u(16..24) })
}

/// The cursor file of attachment `epoch` in a parent partition directory.
pub fn path(partition_dir: &Path, epoch: u64) -> PathBuf {
    partition_dir.join(format!("fanout@{epoch:016x}.offset"))
}

/// Where earlier versions kept the cursor file of `child` (read once for
/// an upgrade); `None` for a name that could never have fitted.
pub fn legacy_path(partition_dir: &Path, child: &str) -> Option<PathBuf> {
    const NAME_MAX: usize = 255;
    ("fanout-".len() + child.len() + ".offset.tmp".len() <= NAME_MAX)
        .then(|| partition_dir.join(format!("fanout-{child}.offset")))
}

fn load_at(fs: &dyn Fs, path: &Path, epoch: u64) -> std::io::Result<Option<CursorState>> {
    if !fs.exists(path)? {
        return Ok(None);
    }
    let b = narad_fs::read_small_file(fs, path, 64)?;
    Ok(decode(&b).filter(|s| s.epoch == epoch))
}

/// Reads the cursor file of attachment `epoch` of `child` in a parent
/// partition directory: `Ok(None)` if missing or unreadable as a cursor
/// file. A file of this epoch still under the earlier name is moved to the
/// new one (stored durably, then the old name removed).
pub fn load(
    fs: &dyn Fs,
    dir: &Path,
    child: &str,
    epoch: u64,
) -> std::io::Result<Option<CursorState>> {
    let current = path(dir, epoch);
    if let Some(s) = load_at(fs, &current, epoch)? {
        return Ok(Some(s));
    }
    let Some(legacy) = legacy_path(dir, child) else { return Ok(None) };
    let Some(s) = load_at(fs, &legacy, epoch)? else { return Ok(None) };
    store(fs, &current, s)?;
    fs.remove_file(&legacy)?;
    Ok(Some(s))
}

/// Like [`load`], but read-only: a file under the earlier name stays.
pub fn peek(
    fs: &dyn Fs,
    dir: &Path,
    child: &str,
    epoch: u64,
) -> std::io::Result<Option<CursorState>> {
    if let Some(s) = load_at(fs, &path(dir, epoch), epoch)? {
        return Ok(Some(s));
    }
    match legacy_path(dir, child) {
        Some(legacy) => load_at(fs, &legacy, epoch),
        None => Ok(None),
    }
}

/// Removes the cursor file of attachment `epoch` of `child` (and one of
/// that epoch under the earlier name); files of other epochs stay.
/// `Ok(true)` if a file was removed.
pub fn remove_if_epoch(fs: &dyn Fs, dir: &Path, child: &str, epoch: u64) -> std::io::Result<bool> {
    let mut removed = false;
    let current = path(dir, epoch);
    if fs.exists(&current)? {
        fs.remove_file(&current)?;
        removed = true;
    }
    if let Some(legacy) = legacy_path(dir, child)
        && load_at(fs, &legacy, epoch)?.is_some()
    {
        fs.remove_file(&legacy)?;
        removed = true;
    }
    Ok(removed)
}

/// Whose a file in a parent partition directory is, if it is a cursor file
/// (or its leftover temporary file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorFileOf<'a> {
    /// `fanout@<epoch>.offset`: this attachment's.
    Epoch(u64),
    /// `fanout-<child>.offset` (the earlier name): this child's.
    LegacyChild(&'a str),
}

/// What [`CursorFileOf`] a directory entry named `name` is, if any.
pub fn file_of(name: &str) -> Option<CursorFileOf<'_>> {
    let stem = |prefix: &'static str| -> Option<&str> {
        let rest = name.strip_prefix(prefix)?;
        rest.strip_suffix(".offset").or_else(|| rest.strip_suffix(".offset.tmp"))
    };
    if let Some(epoch) = stem("fanout@") {
        return parse_epoch(epoch).map(CursorFileOf::Epoch);
    }
    let child = stem("fanout-")?;
    (!child.is_empty()).then_some(CursorFileOf::LegacyChild(child))
}

/// Stores a cursor durably (temp + fdatasync + rename).
pub fn store(fs: &dyn Fs, path: &Path, s: CursorState) -> std::io::Result<()> {
    narad_fs::write_file_atomic(fs, path, &encode(s))
}

/// Parses an attach epoch (16 lowercase hex digits).
pub fn parse_epoch(hex: &str) -> Option<u64> {
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_file_matches_golden_bytes_and_rejects_damage() {
        let s = CursorState { epoch: 0x0102_0304_0506_0708, next_offset: 42 };
        let b = encode(s);
        let golden: [u8; FILE_BYTES] = [
            b'N', b'F', b'O', b'C', 1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, //
            0, 0, 0, 0, 0, 0, 0, 42, 0xB3, 0xA5, 0xF9, 0xD0, // crc32c, checked independently
        ];
        assert_eq!(b, golden, "{:02X?}", &b[24..]);
        assert_eq!(decode(&golden), Some(s));
        for i in 0..FILE_BYTES {
            let mut bad = b;
            bad[i] ^= 0x10;
            assert_eq!(decode(&bad), None, "byte {i}");
        }
        assert_eq!(decode(&b[..27]), None);
    }

    #[test]
    fn cursor_file_names_name_their_epoch_or_legacy_child() {
        use CursorFileOf::{Epoch, LegacyChild};
        assert_eq!(file_of("fanout@00000000000000ff.offset"), Some(Epoch(0xff)));
        assert_eq!(file_of("fanout@00000000000000ff.offset.tmp"), Some(Epoch(0xff)));
        assert_eq!(file_of("fanout@ff.offset"), None);
        assert_eq!(file_of("fanout-a.b.offset"), Some(LegacyChild("a.b")));
        assert_eq!(file_of("fanout-c.offset.tmp"), Some(LegacyChild("c")));
        assert_eq!(file_of("fanout-.offset"), None);
        assert_eq!(file_of("consumer.offset"), None);
        assert_eq!(file_of("fanout-x.log"), None);
        let p = path(Path::new("/d/p00001"), 0x0102_0304_0506_0708);
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, "fanout@0102030405060708.offset");
        assert_eq!(file_of(name), Some(Epoch(0x0102_0304_0506_0708)));
    }

    #[test]
    fn any_valid_child_name_fits_the_file_name_limit() {
        let p = path(Path::new("/d"), u64::MAX);
        let tmp = format!("{}.tmp", p.file_name().unwrap().to_str().unwrap());
        assert!(tmp.len() <= 40, "{tmp}");
        assert!(legacy_path(Path::new("/d"), &"c".repeat(237)).is_some());
        assert!(legacy_path(Path::new("/d"), &"c".repeat(238)).is_none(), "never fitted");
    }

    #[test]
    fn a_cursor_file_is_removed_only_by_its_own_epoch() {
        let fs = narad_fs::SimFs::new(1);
        let d = Path::new("/d");
        fs.create_dir_all(d).unwrap();
        assert!(!remove_if_epoch(&fs, d, "kid", 7).unwrap(), "no file: nothing to remove");
        store(&fs, &path(d, 8), CursorState { epoch: 8, next_offset: 3 }).unwrap();
        assert!(!remove_if_epoch(&fs, d, "kid", 7).unwrap(), "a newer attachment's file stays");
        assert_eq!(load(&fs, d, "kid", 8).unwrap(), Some(CursorState { epoch: 8, next_offset: 3 }));
        assert!(remove_if_epoch(&fs, d, "kid", 8).unwrap());
        assert!(!fs.exists(&path(d, 8)).unwrap());
    }

    #[test]
    fn a_file_under_the_earlier_name_is_read_once_and_moved() {
        let fs = narad_fs::SimFs::new(1);
        let d = Path::new("/d");
        fs.create_dir_all(d).unwrap();
        let legacy = legacy_path(d, "kid").unwrap();
        store(&fs, &legacy, CursorState { epoch: 8, next_offset: 5 }).unwrap();
        assert_eq!(load(&fs, d, "kid", 7).unwrap(), None, "another epoch's");
        assert!(fs.exists(&legacy).unwrap());
        assert_eq!(load(&fs, d, "kid", 8).unwrap(), Some(CursorState { epoch: 8, next_offset: 5 }));
        assert!(!fs.exists(&legacy).unwrap(), "moved");
        assert_eq!(load_at(&fs, &path(d, 8), 8).unwrap().map(|s| s.next_offset), Some(5));
    }

    #[test]
    fn epochs_parse_from_hex() {
        assert_eq!(parse_epoch("0102030405060708"), Some(0x0102_0304_0506_0708));
        assert_eq!(parse_epoch("xyz"), None);
        assert_eq!(parse_epoch("010203040506070"), None);
    }
}
