//! The replicated metastore: narad-meta's commands go through Raft
//! (openraft 0.9, `storage-v2`), carried by node RPC.
//!
//! * [`log_store`]: the log and the vote in `<data>/metastore/raft.redb`.

pub mod log_store;
