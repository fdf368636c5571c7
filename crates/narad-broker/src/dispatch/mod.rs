//! The produce dispatcher: moves durable WAL records to their partitions'
//! owners. [`core`] decides; the driver reads the WAL and runs commits.

pub mod core;
pub mod driver;
pub mod resolve;
