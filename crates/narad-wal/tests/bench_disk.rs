//! `narad bench disk` runs with either appender driver, reports figures that
//! hang together, and removes its scratch directory. (Figures only: nothing
//! here depends on how fast the disk is.)

use narad_wal::bench::{DiskBenchOptions, Driver, run};

fn options(dir: &std::path::Path, driver: Driver) -> DiskBenchOptions {
    DiskBenchOptions {
        dir: dir.to_path_buf(),
        appenders: 8,
        record_bytes: 512,
        seconds: 0.3,
        probe_seconds: 0.1,
        driver,
        prealloc: driver == Driver::Tasks,
        runway_bytes: if driver == Driver::Threads { narad_wal::limits::RUNWAY_BYTES } else { 0 },
    }
}

#[test]
fn both_drivers_report_consistent_figures_and_clean_up() {
    for (driver, expect_threads) in [(Driver::Tasks, None), (Driver::Threads, Some(8))] {
        let dir = std::env::temp_dir().join(format!(
            "narad-wal-bench-disk-{}-{}",
            std::process::id(),
            driver.name()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let r = run(&options(&dir, driver)).unwrap();
        for (name, value) in r.fields() {
            assert!(value.is_finite() && value >= 0.0, "{driver:?}: {name} = {value}");
        }
        assert!(r.fdatasync_per_sec > 0.0 && r.dsync_mb_per_sec > 0.0, "{r:?}");
        // The serial figure is the mean of the probes on either side.
        let mean = (r.fdatasync_before_per_sec + r.fdatasync_after_per_sec) / 2.0;
        assert!(r.fdatasync_before_per_sec > 0.0 && r.fdatasync_after_per_sec > 0.0, "{r:?}");
        assert!((r.fdatasync_per_sec - mean).abs() < 1e-9 * mean, "{r:?}");
        assert!(r.wal_appends_per_sec > 0.0, "{driver:?}: no append completed: {r:?}");
        // Every append waits for its own sync, so a sync holds at most one
        // record per appender.
        assert!(
            r.wal_records_per_sync >= 1.0 && r.wal_records_per_sync <= 8.0,
            "{driver:?}: {r:?}"
        );
        assert!(r.wal_p50_us <= r.wal_p99_us && r.wal_p99_us <= r.wal_max_us, "{r:?}");
        // The ceiling is the whole-group probe times the appenders, and the
        // ratios are taken against the figures they name.
        assert!(r.group_fdatasync_per_sec > 0.0, "{r:?}");
        let ceiling = r.group_fdatasync_per_sec * 8.0;
        assert!((r.ceiling_appends_per_sec - ceiling).abs() < 1e-6 * ceiling, "{r:?}");
        let of = r.wal_appends_per_sec / r.ceiling_appends_per_sec;
        assert!((r.wal_of_ceiling - of).abs() < 1e-9 * of.max(1.0), "{r:?}");
        let vs = r.ceiling_appends_per_sec / r.fdatasync_per_sec;
        assert!((r.ceiling_vs_fdatasync - vs).abs() < 1e-9 * vs, "{r:?}");
        let mb = r.wal_appends_per_sec * 512.0 / 1e6;
        assert!((r.wal_mb_per_sec - mb).abs() < 1e-6 * mb.max(1.0), "{r:?}");
        match expect_threads {
            Some(n) => assert_eq!(r.appender_os_threads, n),
            None => assert!(r.appender_os_threads >= 1),
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "{driver:?}: scratch left behind: {left:?}");
        std::fs::remove_dir(&dir).unwrap();
    }
}
