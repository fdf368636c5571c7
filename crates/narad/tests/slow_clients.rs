//! Slow and hostile clients (SPEC §1.1, issue 6 §5): hundreds of
//! connections dripping a request head byte by byte do not starve normal
//! clients and are closed once `http.read_timeout` passes; idle
//! connections are closed after `http.idle_timeout`; a body slower than the
//! read timeout is answered 408; oversized heads (431) and bodies (413)
//! are refused before the server has taken them in.
//!
//! The server runs with short timeouts (read 1 s, idle 2 s) so the test
//! takes seconds. Timing assertions are one-sided where they can be (a
//! connection is never closed *before* its deadline) and generous where
//! they cannot (closed within many seconds after it).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Opts, Server};

const READ_TIMEOUT: Duration = Duration::from_secs(1);
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
/// Far more than any deadline here: what "promptly" and "eventually" mean.
const GENEROUS: Duration = Duration::from_secs(15);
/// Connections that drip their request head.
const SLOW_CLIENTS: usize = 500;
/// The gap between two bytes of a dripping head: its ~90 bytes would take
/// over 20 s, far past the read timeout.
const DRIP_EVERY: Duration = Duration::from_millis(250);

fn server(name: &str) -> Server {
    Server::start_opts(
        name,
        Opts::dev()
            .env("NARAD_HTTP_READ_TIMEOUT", "1s")
            .env("NARAD_HTTP_IDLE_TIMEOUT", "2s")
            .env("NARAD_HTTP_WRITE_TIMEOUT", "4s")
            .env("NARAD_HTTP_MAX_CONSUME_WAIT", "1s"),
    )
}

fn connect(s: &Server) -> TcpStream {
    let c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    c.set_read_timeout(Some(GENEROUS)).unwrap();
    c
}

/// Reads until the server closes the connection (EOF or reset); returns
/// what it sent first. Panics if the connection is still open after
/// [`GENEROUS`].
fn read_until_closed(c: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                return got;
            }
            Err(e) => panic!("connection still open after {GENEROUS:?} ({e})"),
        }
    }
}

/// One dripping connection.
struct Slow {
    conn: TcpStream,
    sent: usize,
    first_byte_at: Instant,
    closed_after: Option<Duration>,
}

/// Drips one more byte into every open connection each [`DRIP_EVERY`] and
/// notes when the server closes each; returns once all are closed (or
/// after [`GENEROUS`]).
fn drip_until_closed(mut slow: Vec<Slow>, head: &'static [u8]) -> Vec<Slow> {
    let give_up = Instant::now() + GENEROUS;
    let mut next_drip = Instant::now() + DRIP_EVERY;
    while slow.iter().any(|c| c.closed_after.is_none()) && Instant::now() < give_up {
        let drip = Instant::now() >= next_drip;
        if drip {
            next_drip += DRIP_EVERY;
        }
        for c in slow.iter_mut().filter(|c| c.closed_after.is_none()) {
            let mut buf = [0u8; 256];
            let closed = match c.conn.read(&mut buf) {
                Ok(_) => true, // EOF, or an answer to a head that never completed
                Err(e) if e.kind() == ErrorKind::WouldBlock => false,
                Err(_) => true,
            };
            let closed = closed
                || (drip && c.sent < head.len() && {
                    let wrote = c.conn.write(&head[c.sent..c.sent + 1]);
                    c.sent += 1;
                    wrote.is_err()
                });
            if closed {
                c.closed_after = Some(c.first_byte_at.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    slow
}

#[test]
fn slow_header_clients_do_not_starve_normal_clients_and_are_closed_after_the_read_timeout() {
    let s = server("slow-heads");
    s.create_topic(r#"{"name":"busy"}"#);
    const HEAD: &[u8] =
        b"POST /v1/topics/busy/produce HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4\r\n\r\nslow";
    let slow: Vec<Slow> = (0..SLOW_CLIENTS)
        .map(|_| {
            let mut conn = connect(&s);
            conn.write_all(&HEAD[..1]).unwrap();
            conn.set_nonblocking(true).unwrap();
            Slow { conn, sent: 1, first_byte_at: Instant::now(), closed_after: None }
        })
        .collect();
    let dripper = std::thread::spawn(move || drip_until_closed(slow, HEAD));

    // Normal clients, each request on a new connection, while the slow ones
    // are open (their read deadline has not passed yet).
    let fresh = reqwest::blocking::Client::builder()
        .timeout(GENEROUS)
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut rounds = 0;
    let started = Instant::now();
    while started.elapsed() < READ_TIMEOUT / 2 || rounds < 5 {
        let t = Instant::now();
        let r = fresh.post(s.url("/v1/topics/busy/produce")).body(format!("m{rounds}")).send();
        assert_eq!(r.unwrap().status(), 202, "a normal produce succeeds");
        let r = fresh.get(s.url("/v1/topics/busy/consume?wait=1s")).send().unwrap();
        assert_eq!(r.status(), 200, "a normal consume succeeds");
        let m: serde_json::Value = serde_json::from_str(&r.text().unwrap()).unwrap();
        let handle = m["receipt_handle"].as_str().unwrap();
        let r = fresh.post(s.url(&format!("/v1/topics/busy/ack?receipt_handle={handle}")));
        assert_eq!(r.send().unwrap().status(), 204, "a normal ack succeeds");
        assert!(t.elapsed() < GENEROUS, "a produce-consume-ack round took {:?}", t.elapsed());
        rounds += 1;
    }

    let slow = dripper.join().unwrap();
    let open = slow.iter().filter(|c| c.closed_after.is_none()).count();
    assert_eq!(open, 0, "{open} of {SLOW_CLIENTS} dripping connections still open");
    for c in &slow {
        let after = c.closed_after.unwrap();
        assert!(after >= READ_TIMEOUT * 9 / 10, "closed {after:?} after its first byte");
        assert!(c.sent < HEAD.len(), "a head completed: the drip was too fast");
    }
    assert_eq!(s.get("/healthz").status(), 200);
    assert_eq!(s.drain("busy"), Vec::<Vec<u8>>::new(), "no dripped request was served");
}

#[test]
fn idle_connections_are_kept_until_the_idle_timeout_then_closed() {
    let s = server("idle");
    let get = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let silent_since = Instant::now();
    let mut silent = connect(&s);

    let mut kept = connect(&s);
    let mut buf = [0u8; 1024];
    kept.write_all(get).unwrap();
    let n = kept.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    std::thread::sleep(IDLE_TIMEOUT / 4);
    kept.write_all(get).unwrap();
    let n = kept.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "reused before the idle timeout");
    let idle_since = Instant::now();
    assert_eq!(read_until_closed(&mut kept), b"", "closed without a word");
    let after = idle_since.elapsed();
    assert!(after >= IDLE_TIMEOUT * 3 / 4, "closed {after:?} after its last response");

    assert_eq!(read_until_closed(&mut silent), b"");
    let after = silent_since.elapsed();
    assert!(after >= IDLE_TIMEOUT * 3 / 4, "a silent connection closed after {after:?}");
}

#[test]
fn a_body_slower_than_the_read_timeout_is_answered_408() {
    let s = server("slow-body");
    s.create_topic(r#"{"name":"t"}"#);
    let mut c = connect(&s);
    let sent_at = Instant::now();
    c.write_all(b"POST /v1/topics/t/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        .unwrap();
    c.write_all(b"only ten..").unwrap();
    let reply = String::from_utf8_lossy(&read_until_closed(&mut c)).into_owned();
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("request body not received in time"), "{reply}");
    assert!(sent_at.elapsed() >= READ_TIMEOUT * 9 / 10);
    assert_eq!(s.drain("t"), Vec::<Vec<u8>>::new(), "nothing was produced");
}

/// Writes `head` then `filler` bytes in 64 KiB pieces until `total` bytes
/// went out or the server stops taking them; returns the bytes written.
fn push_until_refused(c: &mut TcpStream, head: &[u8], filler: u8, total: usize) -> usize {
    c.set_write_timeout(Some(GENEROUS)).unwrap();
    let mut written = match c.write_all(head) {
        Ok(()) => head.len(),
        Err(_) => return 0,
    };
    let chunk = vec![filler; 64 << 10];
    while written < total {
        match c.write(&chunk) {
            Ok(n) => written += n,
            Err(_) => break,
        }
    }
    written
}

/// 32 MiB: far more than socket buffers hold, so a server that buffered
/// it all would have to read it all.
const HUGE: usize = 32 << 20;

#[test]
fn an_oversized_head_is_refused_with_431_before_it_is_buffered() {
    let s = server("big-head");
    let mut c = connect(&s);
    let written =
        push_until_refused(&mut c, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ", b'a', HUGE);
    assert!(written < HUGE, "the server took in a {written}-byte head");
    let reply = read_until_closed(&mut c);
    assert!(
        reply.is_empty() || reply.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    // A head of 100 KiB, whole in the socket buffers: 431 (or a reset
    // racing it, when the server closes with bytes unread).
    let mut c = connect(&s);
    let head =
        format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "b".repeat(100 << 10));
    let _ = c.write_all(head.as_bytes());
    let reply = read_until_closed(&mut c);
    assert!(reply.is_empty() || reply.starts_with(b"HTTP/1.1 431"));
    // The bound is not too tight: a 32 KiB header is fine.
    let r = s.client.get(s.url("/healthz")).header("X-Fine", "c".repeat(32 << 10)).send().unwrap();
    assert_eq!(r.status(), 200);
}

#[test]
fn an_oversized_body_is_refused_with_413_before_it_is_buffered() {
    let s = server("big-body");
    s.create_topic(r#"{"name":"t"}"#);
    // Declared too large: 413 before a byte of the body is sent.
    let mut c = connect(&s);
    c.write_all(
        b"POST /v1/topics/t/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n",
    )
    .unwrap();
    let reply = String::from_utf8_lossy(&read_until_closed(&mut c)).into_owned();
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("request body too large"), "{reply}");
    // Chunked, no length: refused once past the 1 MiB cap, long before the
    // 32 MiB the client tries to send.
    let mut c = connect(&s);
    let mut head =
        b"POST /v1/topics/t/produce HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    head.extend_from_slice(b"2000000\r\n"); // one 32 MiB chunk
    let written = push_until_refused(&mut c, &head, b'z', HUGE);
    assert!(written < HUGE, "the server took in {written} body bytes");
    let reply = read_until_closed(&mut c);
    assert!(
        reply.is_empty() || reply.starts_with(b"HTTP/1.1 413"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    assert_eq!(s.drain("t"), Vec::<Vec<u8>>::new(), "nothing was produced");
}
