//! Every bound the metastore enforces, in one place. Relations between them
//! are checked at compile time at the bottom of this file.

use std::time::Duration;

/// The longest topic name, in bytes (`^[A-Za-z0-9._-]{1,255}$`).
pub const TOPIC_NAME_LEN_MAX: usize = 255;

/// The longest username, in bytes (`^[A-Za-z0-9._-]{1,64}$`).
pub const USERNAME_LEN_MAX: usize = 64;

/// The longest grant pattern before its optional trailing `*`.
pub const PATTERN_LEN_MAX: usize = 255;

/// The fewest partitions a topic may have.
pub const PARTITIONS_MIN: u32 = 3;

/// The shortest non-zero retention: one hour. Zero means keep forever.
pub const RETENTION_MS_MIN: u64 = 60 * 60 * 1000;

/// The longest fan-out delay of a child topic: one year.
pub const FANOUT_DELAY_MS_MAX: u64 = 365 * 24 * 60 * 60 * 1000;

/// The most children one parent topic may fan out to.
pub const CHILDREN_PER_PARENT_MAX: usize = 108;

/// Hex digits of an attach epoch (8 random bytes).
pub const ATTACH_EPOCH_HEX_LEN: usize = 16;

/// Topics per page of a listing when the caller gives no limit.
pub const LIST_LIMIT_DEFAULT: usize = 100;

/// The largest page of a listing; larger limits are clamped to it.
pub const LIST_LIMIT_MAX: usize = 1000;

const _: () = assert!(LIST_LIMIT_DEFAULT <= LIST_LIMIT_MAX);
const _: () = assert!(FANOUT_DELAY_MS_MAX == 31_536_000_000);
const _: () = assert!(RETENTION_MS_MIN == 3_600_000);
const _: () = assert!(ATTACH_EPOCH_HEX_LEN == 2 * 8);

/// At most this many partition moves in flight cluster-wide (SPEC §7.3):
/// the rebalance planner plans no more.
pub const MAX_MOVES_IN_FLIGHT: usize = 8;

/// A partition move's freeze of its source lasts this long unless the
/// mover renews it (PrepareHandoff again): past it, the source asks the
/// metastore to abort the move (a compare and set that fails if the move
/// completed), and never opens the partition on its own (SPEC §7.3).
pub const MOVE_FREEZE_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// A move copies segments in chunks of at most this many bytes (node RPC
/// 23).
pub const MOVE_CHUNK_BYTES: u64 = 1 << 20;

/// A move freezes its source once its copy is within this many bytes of
/// the source's high watermark...
pub const MOVE_CATCH_UP_BYTES: u64 = 4 << 20;

/// ...or after this many copy rounds, whichever comes first.
pub const MOVE_MAX_ROUNDS: u32 = 20;

/// A move whose source has been dead this long is force-promoted when the
/// destination's copy reached the source's last known high watermark, and
/// aborted otherwise.
pub const MOVE_FORCE_PROMOTE_AFTER: std::time::Duration = std::time::Duration::from_secs(120);

/// A member silent for more than this (whole seconds, by the observer's wall
/// clock) is dead: the cluster controller marks it so (SPEC §7.2), and
/// placement leaves it out of the ring at once
/// ([`crate::placement::alive_ring`]).
pub const MEMBER_DEAD_AFTER: Duration = Duration::from_secs(30);
