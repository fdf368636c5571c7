//! The fan-out cursor file: how far one child's cursor on one parent
//! partition got.
//!
//! # File `fanout-<child>.offset` in the parent partition's directory
//! (28 bytes, big-endian)
//! ```text
//! 0 magic "NFOC" | 4 version u8 = 1 | 5 reserved (3 bytes, zero)
//! 8 attach epoch u64 | 16 next parent offset u64 | 24 crc32c u32 over [0, 24)
//! ```
//! Written by temp + fdatasync + rename, only after every child commit of
//! the records below `next` is durable, so a crash makes the cursor re-send
//! (duplicates), never skip (loss). A file of another epoch belongs to an
//! earlier attachment of the child and is ignored (then replaced).

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

/// The cursor file of `child` in a parent partition directory.
pub fn path(partition_dir: &Path, child: &str) -> PathBuf {
    partition_dir.join(format!("fanout-{child}.offset"))
}

/// Reads a cursor file: `Ok(None)` if missing, unreadable as a cursor file,
/// or of another epoch.
pub fn load(fs: &dyn Fs, path: &Path, epoch: u64) -> std::io::Result<Option<CursorState>> {
    if !fs.exists(path)? {
        return Ok(None);
    }
    let b = narad_fs::read_small_file(fs, path, 64)?;
    Ok(decode(&b).filter(|s| s.epoch == epoch))
}

/// Removes the cursor file at `path` if it belongs to attachment `epoch`
/// (a file of another epoch belongs to a newer attachment of the same
/// child and stays). `Ok(true)` if a file was removed.
pub fn remove_if_epoch(fs: &dyn Fs, path: &Path, epoch: u64) -> std::io::Result<bool> {
    if load(fs, path, epoch)?.is_none() {
        return Ok(false);
    }
    fs.remove_file(path)?;
    Ok(true)
}

/// The child a file in a parent partition directory is the cursor file
/// (or the leftover temporary file) of, if it is one.
pub fn child_of_file_name(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("fanout-")?;
    let child = rest.strip_suffix(".offset").or_else(|| rest.strip_suffix(".offset.tmp"))?;
    (!child.is_empty()).then_some(child)
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
    fn cursor_file_names_name_their_child() {
        assert_eq!(child_of_file_name("fanout-a.b.offset"), Some("a.b"));
        assert_eq!(child_of_file_name("fanout-c.offset.tmp"), Some("c"));
        assert_eq!(child_of_file_name("fanout-.offset"), None);
        assert_eq!(child_of_file_name("consumer.offset"), None);
        assert_eq!(child_of_file_name("fanout-x.log"), None);
        let p = path(Path::new("/d/p00001"), "kid");
        assert_eq!(child_of_file_name(p.file_name().unwrap().to_str().unwrap()), Some("kid"));
    }

    #[test]
    fn a_cursor_file_is_removed_only_by_its_own_epoch() {
        let fs = narad_fs::SimFs::new(1);
        fs.create_dir_all(Path::new("/d")).unwrap();
        let p = path(Path::new("/d"), "kid");
        assert!(!remove_if_epoch(&fs, &p, 7).unwrap(), "no file: nothing to remove");
        store(&fs, &p, CursorState { epoch: 8, next_offset: 3 }).unwrap();
        assert!(!remove_if_epoch(&fs, &p, 7).unwrap(), "a newer attachment's file stays");
        assert_eq!(load(&fs, &p, 8).unwrap(), Some(CursorState { epoch: 8, next_offset: 3 }));
        assert!(remove_if_epoch(&fs, &p, 8).unwrap());
        assert!(!fs.exists(&p).unwrap());
    }

    #[test]
    fn epochs_parse_from_hex() {
        assert_eq!(parse_epoch("0102030405060708"), Some(0x0102_0304_0506_0708));
        assert_eq!(parse_epoch("xyz"), None);
        assert_eq!(parse_epoch("010203040506070"), None);
    }
}
