//! The connection limit (`http.max_connections`): idle sockets cannot take
//! the descriptors the data plane needs, connections over the limit wait
//! for a free slot (in the kernel's listen backlog), and the ones already
//! open keep working.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Opts, Server};

/// A label-less metric's value.
fn gauge(s: &Server, name: &str) -> Option<f64> {
    common::metric(&s.get("/metrics").text().ok()?, &format!("{name} "), &[])
}

/// The base sequence numbers of the ingress WAL's segments.
fn wal_segments(s: &Server) -> Vec<u64> {
    let dir = s.data_dir.join("ingress").join("produce");
    let mut out: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".wal")?.parse().ok()
        })
        .collect();
    out.sort();
    out
}

#[test]
fn idle_connections_under_a_low_file_limit_do_not_latch_the_wal() {
    let mut s = Server::start_opts("fdlimit", Opts { nofile: Some(128), ..Opts::dev() });
    s.create_topic(r#"{"name":"fd"}"#);
    // The test's own keep-alive connection, opened before the flood, and
    // every partition's log open (its files are the data plane's too).
    for p in 0..3 {
        assert_eq!(s.produce("fd", &format!("partition={p}"), b"warm"), 202);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while gauge(&s, "narad_open_partition_logs") != Some(3.0) {
        assert!(Instant::now() < deadline, "partitions not opened");
        std::thread::sleep(Duration::from_millis(50));
    }
    // 2 MiB of records: once they are dispatched (within about a second)
    // the WAL rotates its active segment (over 1 MiB), which creates a
    // file: it needs a descriptor. Meanwhile idle sockets flood the server.
    let big = vec![b'x'; 512 << 10];
    for _ in 0..4 {
        assert_eq!(s.produce("fd", "partition=0", &big), 202);
    }
    let addr = format!("127.0.0.1:{}", s.port);
    let idle: Vec<TcpStream> = (0..200).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut rotated = false;
    while !rotated && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        rotated = wal_segments(&s).iter().any(|&base| base != 0);
    }
    drop(idle);
    assert_eq!(gauge(&s, "narad_ingress_wal_failed"), Some(0.0), "log:\n{}", s.log());
    assert!(rotated, "the WAL never rotated its segment; log:\n{}", s.log());
    assert!(gauge(&s, "narad_http_connections_waited_total").unwrap() >= 1.0);
    // A new connection is served again, and produce works.
    let fresh = reqwest::blocking::Client::new();
    let r = fresh.post(s.url("/v1/topics/fd/produce")).body("after").send().unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(fresh.get(s.url("/readyz")).send().unwrap().status(), 200);
    s.kill9();
}

#[test]
fn a_connection_over_the_limit_waits_while_open_ones_keep_working() {
    let mut s = Server::start_opts("connlimit", Opts::dev().args(&["--max-connections", "4"]));
    let addr = format!("127.0.0.1:{}", s.port);
    // With the test client's own connection, these reach the limit.
    let idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let url = s.url("/healthz");
    let waiting = std::thread::spawn(move || {
        let c = reqwest::blocking::Client::builder().timeout(Duration::from_secs(20)).build();
        c.unwrap().get(url).send().map(|r| r.status().as_u16())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiting.is_finished(), "a connection over the limit was served");
    // The connection the test client already had is still served.
    assert_eq!(s.get("/healthz").status(), 200);
    drop(idle);
    assert_eq!(waiting.join().unwrap().unwrap(), 200);
    assert!(gauge(&s, "narad_http_connections_waited_total").unwrap() >= 1.0);
    let open = gauge(&s, "narad_http_connections_open").unwrap();
    assert!((1.0..=4.0).contains(&open), "{open}");
    assert!(s.log().contains("connection limit reached"), "{}", s.log());
    s.kill9();
}
