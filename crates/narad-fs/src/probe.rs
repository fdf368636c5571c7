//! The disk probes the benchmarks share (`narad bench disk`, `narad bench
//! log`): how many serial write + fdatasync rounds a file takes per second.
//! Figures, not assertions.

use std::io;
use std::path::Path;
use std::time::Instant;

use crate::{Fs, OpenMode};

/// Serial writes of `block` bytes per second, each followed by fdatasync,
/// to a scratch file at `path` (created, then removed). Without
/// `prezeroed` each write appends, growing the file; with it the file is
/// first filled with 16 MiB (at least one block) of synced zeros and the
/// writes cycle over them, so no fdatasync changes the file's size (as in a
/// prepared WAL segment or the partition log's zero runway).
pub fn append_sync_per_sec(
    fs: &dyn Fs,
    path: &Path,
    block: usize,
    seconds: f64,
    prezeroed: bool,
) -> io::Result<f64> {
    let f = fs.open(path, OpenMode::CreateOrTruncate)?;
    let data = vec![0xA5u8; block];
    let slots = ((16u64 << 20) / block as u64).max(1);
    if prezeroed {
        let zeros = vec![0u8; block];
        for i in 0..slots {
            f.write_all_at(&zeros, i * block as u64)?;
        }
        f.sync_data()?;
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        let slot = if prezeroed { n % slots } else { n };
        f.write_all_at(&data, slot * block as u64)?;
        f.sync_data()?;
        n += 1;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    drop(f);
    fs.remove_file(path)?;
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimFs;

    #[test]
    fn probes_append_or_cycle_over_zeros_and_remove_their_file() {
        let fs = SimFs::new(1);
        let path = Path::new("/probe");
        for prezeroed in [false, true] {
            let rate = append_sync_per_sec(&fs, path, 4096, 0.02, prezeroed).unwrap();
            assert!(rate > 0.0);
            assert!(!fs.exists(path).unwrap(), "the scratch file is removed");
        }
    }
}
