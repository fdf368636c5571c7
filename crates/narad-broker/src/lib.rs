//! narad-broker: the data plane. Accept (validate, pick a partition, append
//! to the WAL), the dispatcher, the owner's commit, consumer leases. It
//! knows nothing of HTTP.

pub mod consume;
pub mod dispatch;
pub mod limits;
pub mod partition;
