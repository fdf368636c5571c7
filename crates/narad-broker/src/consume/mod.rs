//! The consume path: per-partition consumer state.

pub mod shard;
pub mod take;
pub mod wake;
