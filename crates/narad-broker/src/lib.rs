//! narad-broker: the data plane. Accept (validate, pick a partition, append
//! to the WAL), the dispatcher, the owner's commit, consumer leases. It
//! knows nothing of HTTP.

mod broker;
pub mod consume;
pub mod dispatch;
mod error;
pub mod fanout;
pub mod fence;
pub mod limits;
mod log_gate;
pub mod metrics;
pub mod owner;
pub mod ownership;
pub mod partition;
/// Placement lives with the metastore state it is a function of.
pub use narad_meta::placement;
mod start_check;
#[cfg(test)]
mod test_support;
pub mod topics;

pub use broker::{
    AckAction, Broker, BrokerConfig, Delivered, FrozenSource, MoveListing, PartitionStats,
    ProduceRecord, Registration, Routing, move_steps,
};
pub use error::BrokerError;
pub use fanout::ChildLag;
