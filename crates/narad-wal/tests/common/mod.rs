//! Helpers shared by the WAL's integration tests.

use std::path::PathBuf;

use narad_wal::WalOptions;

/// Small segments, so tests roll and compact cheaply.
pub fn small() -> WalOptions {
    WalOptions {
        segment_bytes: 16 << 10,
        max_record_bytes: 4 << 10,
        rotate_dispatched_active_bytes: 4 << 10,
        ..WalOptions::default()
    }
}

/// The WAL directory on the simulated disk.
pub fn dir() -> PathBuf {
    PathBuf::from("/data/ingress/produce")
}
