//! narad-wal: the ingress write-ahead log.
//!
//! A produce is acknowledged (`202`) once its record is fdatasynced here;
//! the dispatcher then reads it back ([`Wal::reader`]) and commits it to its
//! partition's owner, and the checkpoint ([`Wal::store_checkpoint`]) records
//! how far that got, so the WAL can compact behind it.
//!
//! Module map:
//! * [`record`]: the record formats (1 and 2) inside a frame.
//! * [`frame`]: frame and segment-header layout.
//! * [`checkpoint`]: the checkpoint file.
//! * `stage`, `group`: group commit (staging buffers, shared completion).
//! * `wal`: open/recovery, append, sync thread, checkpoint and compaction.
//! * [`recovery`]: the scan and the damage decision table.
//! * `reader`: reading for the dispatcher; `tail`: the latest durable
//!   chunks, kept in memory so that reading at the frontier is not a read
//!   of the file.
//! * [`limits`]: every bound.
//! * [`bench`]: `narad bench disk`.

pub mod bench;
pub mod checkpoint;
mod error;
pub mod frame;
mod group;
pub mod limits;
pub mod prep;
mod reader;
pub mod record;
pub mod recovery;
mod segment;
mod stage;
mod tail;
mod wal;

pub use error::WalError;
pub use group::Pending;
pub use reader::{WalEntry, WalReader};
pub use record::{RecordError, RecordRef, WalRecord};
pub use wal::{DurableListener, NewestIncarnation, Wal, WalOptions, WalStats, runway_group_max};

/// The WAL directory inside a data directory: `<data>/ingress/produce`.
pub fn wal_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("ingress").join("produce")
}
