//! One module per resource; each handler parses, calls the broker, encodes.

pub mod children;
pub mod cluster;
pub mod cluster_remove;
pub mod consume;
pub mod health;
pub mod produce;
pub mod topics;
pub mod users;
