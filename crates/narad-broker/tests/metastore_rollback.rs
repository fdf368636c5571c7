//! A metastore restored from an older copy behind the ingress WAL: a WAL
//! record accepted under topic incarnation X proves the metastore had
//! applied index X when it was accepted, so a WAL holding a record above
//! the metastore's applied index means the metastore lost commits. The
//! start is refused, naming both numbers and the WAL segment, instead of
//! discarding the record as one of a deleted topic. In process, on the
//! simulated file system.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use narad_broker::Broker;
use narad_broker::metrics::BrokerMetrics;
use narad_fs::{Fs, SimFs};
use narad_meta::CreateTopicRequest;
use prometheus_client::registry::Registry;

mod common;

async fn open(fs: &SimFs) -> Result<Arc<Broker>, narad_broker::BrokerError> {
    let metrics = Arc::new(BrokerMetrics::new(&mut Registry::default()));
    Broker::open(common::config(), fs.shared(), narad_clock::SystemClock::shared(), metrics).await
}

fn read(fs: &SimFs, path: &Path) -> Vec<u8> {
    narad_fs::read_small_file(fs, path, 64 << 20).unwrap()
}

async fn create(b: &Broker, name: &str) -> u64 {
    let req = CreateTopicRequest { name: name.into(), partitions: 3, ..Default::default() };
    b.create_topic(req).await.unwrap();
    b.meta().topic(name).unwrap().incarnation()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_record_newer_than_a_restored_metastore_refuses_the_start_naming_both() {
    let fs = SimFs::new(31);
    let data = common::config().data_dir;
    let meta_file = narad_meta::metastore_path(&data);
    let b = open(&fs).await.unwrap();
    create(&b, "a").await;
    b.shutdown().await.unwrap();
    drop(b);
    let old_copy = read(&fs, &meta_file);
    let inc = {
        let b = open(&fs).await.unwrap();
        let inc = create(&b, "b").await;
        b.produce("b", None, None, Bytes::from_static(b"acked")).await.unwrap();
        b.shutdown().await.unwrap();
        inc
    };
    // The older copy is restored, by an operator or a backup tool; the
    // independent applied-index record and the topic's directory did not
    // survive with it (an older build's data directory, a lost disk), so
    // only the WAL remembers the newer incarnation.
    narad_fs::write_file_atomic(&fs, &meta_file, &old_copy).unwrap();
    for p in [data.join("metastore.applied"), data.join("topics").join("b")] {
        if fs.exists(&p).unwrap() {
            if fs.list_dir(&p).is_ok() { fs.remove_dir_all(&p) } else { fs.remove_file(&p) }
                .unwrap();
        }
    }
    let err = match open(&fs).await {
        Ok(b) => {
            let _ = b.shutdown().await;
            panic!("started on a metastore older than its WAL");
        }
        Err(e) => e.to_string(),
    };
    let wal_dir = narad_wal::wal_dir(&data).display().to_string();
    assert!(err.contains(&wal_dir), "names the WAL segment: {err}");
    assert!(err.contains(&meta_file.display().to_string()), "names the metastore: {err}");
    assert!(err.contains(&format!("incarnation {inc}")), "names the record's incarnation: {err}");
    assert!(err.contains("above the metastore's applied index"), "{err}");
}
