//! Fixtures shared by this crate's unit tests.

use std::path::Path;
use std::sync::Arc;

use narad_clock::ManualClock;
use narad_fs::SimFs;
use narad_meta::{MetaStore, MetaStoreOptions, TopicDefaults};

/// A metastore on a fresh simulated disk, with a fixed clock and seed.
pub(crate) fn sim_store() -> MetaStore {
    let options = MetaStoreOptions {
        defaults: TopicDefaults::default(),
        clock: Arc::new(ManualClock::new(1_700_000_000_000)),
        rng_seed: Some(3),
    };
    MetaStore::open(&SimFs::new(1), Path::new("/d"), options).unwrap()
}
