//! openraft's own storage conformance suite (`openraft::testing::Suite`)
//! over the real pair: [`LogStore`] on `raft.redb` and [`StateMachine`]
//! over a [`MetaStore`], each build on a fresh SimFs.

use std::path::Path;
use std::sync::Arc;

use narad_clock::ManualClock;
use narad_fs::{Fs, SimFs};
use narad_meta::{MetaStore, MetaStoreOptions, TopicDefaults};
use openraft::testing::{StoreBuilder, Suite};

use super::log_store::LogStore;
use super::metrics::RaftMetrics;
use super::state_machine::StateMachine;
use super::types::{StorageError, TypeConfig};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore<TypeConfig>, StateMachine, ()> for Builder {
    async fn build(&self) -> Result<((), LogStore<TypeConfig>, StateMachine), StorageError> {
        let fs = SimFs::new(1).shared();
        let data = Path::new("/data");
        fs.create_dir_all(data).unwrap();
        let options = MetaStoreOptions {
            defaults: TopicDefaults::default(),
            clock: Arc::new(ManualClock::new(1_700_000_000_000)),
            rng_seed: Some(1),
        };
        let meta = Arc::new(MetaStore::open(&*fs, data, options).unwrap());
        let log = LogStore::open(&*fs, data).unwrap();
        Ok(((), log, StateMachine::new(meta, fs, RaftMetrics::default())))
    }
}

#[test]
fn the_log_store_and_state_machine_pass_openrafts_storage_suite() {
    Suite::test_all(Builder).unwrap();
}
