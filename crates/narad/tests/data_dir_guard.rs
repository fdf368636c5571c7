//! The data directory belongs to one process and one metastore history:
//! a second server on it, a missing metastore beside data, and a metastore
//! rolled back to an older copy all stop the start, naming what disagrees,
//! and delete nothing.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Server;

/// Starts `narad serve --dev` on `data_dir` and waits (at most 30 s) for it
/// to exit; returns its exit code and log. A server that keeps running is
/// killed and reported as `None`.
fn start_expecting_exit(data_dir: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["serve", "--dev", "--addr", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .env("NARAD_LOG_LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start narad");
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (code.or(if out.status.success() { Some(0) } else { None }), stderr)
}

#[test]
fn a_second_server_on_the_same_data_dir_exits_naming_it_while_the_first_keeps_working() {
    let s = Server::start("lock");
    s.create_topic(r#"{"name":"t"}"#);
    assert_eq!(s.produce("t", "", b"before"), 202);
    let (code, log) = start_expecting_exit(&s.data_dir);
    assert!(
        matches!(code, Some(c) if c != 0),
        "second server must exit non-zero ({code:?}): {log}"
    );
    let dir = s.data_dir.display().to_string();
    assert!(log.contains(&dir) && log.contains("in use"), "the error names the data dir: {log}");
    assert!(log.contains("pid"), "the error names the holder's pid: {log}");
    assert_eq!(s.produce("t", "", b"after"), 202);
    let mut got = s.drain("t");
    got.sort();
    assert_eq!(got, vec![b"after".to_vec(), b"before".to_vec()]);
}

#[test]
fn a_missing_metastore_beside_data_refuses_to_start_and_deletes_nothing() {
    let mut s = Server::start("nometa");
    s.create_topic(r#"{"name":"t"}"#);
    assert_eq!(s.produce("t", "", b"acked"), 202);
    assert!(s.terminate().success());
    let meta = s.data_dir.join("metastore").join("fsm.redb");
    std::fs::remove_file(&meta).unwrap();
    let (code, log) = start_expecting_exit(&s.data_dir);
    assert!(matches!(code, Some(c) if c != 0), "must refuse to start ({code:?}): {log}");
    assert!(log.contains(&meta.display().to_string()), "the error names the file: {log}");
    assert!(s.data_dir.join("topics").join("t").exists(), "the topic's files are kept");
    assert!(!meta.exists(), "no empty metastore was created in its place");
}

#[test]
fn an_older_metastore_copy_refuses_to_start() {
    let mut s = Server::start("rollback");
    s.create_topic(r#"{"name":"a"}"#);
    assert!(s.terminate().success());
    let meta = s.data_dir.join("metastore").join("fsm.redb");
    let backup = s.root().join("fsm.redb.old");
    std::fs::copy(&meta, &backup).unwrap();
    s.restart();
    s.create_topic(r#"{"name":"b"}"#);
    assert_eq!(s.produce("b", "", b"acked"), 202);
    assert!(s.terminate().success());
    std::fs::copy(&backup, &meta).unwrap();
    let (code, log) = start_expecting_exit(&s.data_dir);
    assert!(matches!(code, Some(c) if c != 0), "must refuse to start ({code:?}): {log}");
    assert!(log.contains(&meta.display().to_string()), "the error names the file: {log}");
    assert!(log.contains("applied index"), "the error says what disagrees: {log}");
    assert!(s.data_dir.join("topics").join("b").exists(), "the newer topic's files are kept");
    // Without the applied-index record (a data directory of an older
    // build), the newer topic's incarnation marker still gives it away.
    std::fs::remove_file(s.data_dir.join("metastore.applied")).unwrap();
    let (code, log) = start_expecting_exit(&s.data_dir);
    assert!(matches!(code, Some(c) if c != 0), "must refuse to start ({code:?}): {log}");
    let marker = s.data_dir.join("topics").join("b").join("incarnation");
    assert!(log.contains(&marker.display().to_string()), "the error names the marker: {log}");
    assert!(log.contains("above the metastore's applied index"), "{log}");
    assert!(s.data_dir.join("topics").join("b").exists(), "the newer topic's files are kept");
}
