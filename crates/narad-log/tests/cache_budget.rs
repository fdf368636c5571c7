//! The decoded-frame caches of every log in a process share one budget:
//! many busy partitions cannot each hold a full cache.
//! (Its own test binary: the budget is process-wide.)

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{T0, read_all, recs};
use narad_clock::ManualClock;
use narad_fs::SimFs;
use narad_log::{LogConfig, PartitionLog, process_cache_bytes, set_process_cache_budget};

#[test]
fn every_log_cache_together_stays_within_the_process_budget() {
    let budget = 64 << 10;
    set_process_cache_budget(budget);
    let fs = SimFs::new(1);
    let clock = ManualClock::new(T0);
    let config = LogConfig { cache_bytes: 48 << 10, ..LogConfig::default() };
    let mut logs = Vec::new();
    for p in 0..8 {
        let dir = PathBuf::from(format!("/data/topics/t/p{p:05}"));
        let log = PartitionLog::open(fs.shared(), dir, config.clone(), Arc::new(clock.clone()))
            .expect("open");
        for round in 0..4 {
            log.commit(recs(&format!("p{p}r{round}"), 40)).expect("commit");
            assert!(process_cache_bytes() <= budget, "over budget after a commit");
        }
        assert_eq!(read_all(&log).len(), 160, "reads beyond the cache come from disk");
        assert!(process_cache_bytes() <= budget, "over budget after reads");
        logs.push(log);
    }
    assert!(process_cache_bytes() > 0, "the caches are used");
    drop(logs);
    assert_eq!(process_cache_bytes(), 0, "a closed log returns its share");
}
