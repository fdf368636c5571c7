//! Segment preparation (`storage.ingress_wal_prealloc`): the next segment is
//! written out in advance, off the append path, so that group commits
//! overwrite blocks that are already allocated and an `fdatasync` never
//! changes the file's size (on ext4 and XFS it then does not commit the inode
//! through the journal on the path every produce waits on).
//!
//! # The prepared file `next-segment.prep`
//!
//! ```text
//! [0, limit)            zeros
//! [limit, limit + 16)   trailer:
//!     0   8  magic "NWPREP01" (the last two bytes are the format version)
//!     8   4  limit (u32 LE): the bytes of frames the segment may hold,
//!            segment header included (the segment size)
//!     12  4  CRC32C of bytes 0..12 (u32 LE)
//! ```
//!
//! The file is written whole and fdatasynced before it counts as ready; the
//! roll renames it to `%020d.wal` and writes the segment header over the
//! first zeros, with the `PREPARED` flag set (see [`crate::frame`]). The
//! roll that seals a prepared segment cuts it to its data and syncs that
//! before the next segment exists, so a sealed segment looks exactly as it
//! always did, and only the last segment can end in a trailer.
//!
//! # Invariants
//! * A prepared file is never renamed in unless its whole content is durable.
//! * Only the last segment may carry a trailer; bytes between its last good
//!   frame and the trailer are zeros unless a write was torn.
//! * Recovery keeps a prepared last segment prepared only if its header
//!   says it was prepared and everything after the last good frame up to
//!   the trailer is zero (`recovery::prepared_tail`); any other
//!   tail is cut with the trailer (the segment becomes an ordinary appended
//!   one), so stale frames of a torn write can never be mistaken for new
//!   ones. The end of a file is never trusted alone: when a write ends the
//!   file, its last bytes are a client's payload, which may be a trailer.

use std::path::{Path, PathBuf};

use narad_fs::{FileRef, Fs, OpenMode};

/// The name of the prepared next segment inside the WAL directory.
pub const PREP_FILE_NAME: &str = "next-segment.prep";
/// The trailer's magic; its last two bytes are the format version.
pub const PREP_MAGIC: [u8; 8] = *b"NWPREP01";
/// Bytes of the trailer.
pub const PREP_TRAILER_BYTES: u64 = 16;
/// Zeros are written in runs of this many bytes.
const FILL_CHUNK_BYTES: usize = 1 << 20;
/// The fill is synced every this many bytes: one fdatasync of the whole
/// 64 MiB at the end queued so much behind the device's cache flush that a
/// group commit waiting at that moment stalled for over 100 ms.
const FILL_SYNC_BYTES: u64 = 4 << 20;

/// The trailer that ends a prepared file whose frames may fill `limit` bytes.
pub fn trailer(limit: u32) -> [u8; PREP_TRAILER_BYTES as usize] {
    let mut t = [0u8; PREP_TRAILER_BYTES as usize];
    t[0..8].copy_from_slice(&PREP_MAGIC);
    t[8..12].copy_from_slice(&limit.to_le_bytes());
    let crc = crc32c::crc32c(&t[0..12]);
    t[12..16].copy_from_slice(&crc.to_le_bytes());
    t
}

/// The write limit of `image` if it is a prepared segment: it ends in a
/// valid trailer whose limit is exactly where the trailer starts.
pub fn prepared_limit(image: &[u8]) -> Option<u64> {
    let len = image.len() as u64;
    if len < PREP_TRAILER_BYTES {
        return None;
    }
    let t = &image[(len - PREP_TRAILER_BYTES) as usize..];
    if t[0..8] != PREP_MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(t[12..16].try_into().expect("4 bytes"));
    if crc32c::crc32c(&t[0..12]) != crc {
        return None;
    }
    let limit = u64::from(u32::from_le_bytes(t[8..12].try_into().expect("4 bytes")));
    (limit == len - PREP_TRAILER_BYTES).then_some(limit)
}

/// The path of the prepared file in WAL directory `dir`.
pub fn prep_path(dir: &Path) -> PathBuf {
    dir.join(PREP_FILE_NAME)
}

/// Writes a prepared file for segments of `segment_bytes` and makes it
/// durable. Any earlier prepared file is replaced. On error the file may be
/// left behind half written; it is never renamed in, and the next attempt
/// (or the next open) replaces it.
pub fn prepare(fs: &dyn Fs, dir: &Path, segment_bytes: u64) -> std::io::Result<FileRef> {
    let limit = u32::try_from(segment_bytes).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "segment size over 4 GiB")
    })?;
    let file = fs.open(&prep_path(dir), OpenMode::CreateOrTruncate)?;
    let zeros = vec![0u8; FILL_CHUNK_BYTES.min(segment_bytes as usize)];
    let mut at = 0u64;
    while at < segment_bytes {
        let n = (segment_bytes - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
        if at.is_multiple_of(FILL_SYNC_BYTES) && at < segment_bytes {
            file.sync_data()?;
        }
    }
    file.write_all_at(&trailer(limit), segment_bytes)?;
    file.sync_data()?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailer_matches_golden_bytes() {
        let t = trailer(64 << 20);
        let golden: [u8; 16] = [
            b'N', b'W', b'P', b'R', b'E', b'P', b'0', b'1', // magic + version
            0x00, 0x00, 0x00, 0x04, // limit 64 MiB, LE
            0x35, 0x48, 0x08, 0xe1, // CRC32C of the 12 bytes before, LE
        ];
        // The CRC was computed independently (a bitwise CRC32C in Python).
        assert_eq!(t, golden);
    }

    #[test]
    fn only_a_whole_valid_trailer_at_the_limit_marks_a_prepared_image() {
        let mut image = vec![0u8; 100];
        image.extend_from_slice(&trailer(100));
        assert_eq!(prepared_limit(&image), Some(100));
        // Limit not where the trailer starts.
        let mut wrong = vec![0u8; 99];
        wrong.extend_from_slice(&trailer(100));
        assert_eq!(prepared_limit(&wrong), None);
        // Any flipped trailer byte.
        for i in 100..116 {
            let mut bad = image.clone();
            bad[i] ^= 0x40;
            assert_eq!(prepared_limit(&bad), None, "byte {i}");
        }
        assert_eq!(prepared_limit(&image[..10]), None);
        assert_eq!(prepared_limit(&[]), None);
    }
}
