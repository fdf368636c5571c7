//! What a client that is not a well-behaved API client can do to a secured
//! server: invent HTTP methods (the `method` label of the HTTP metrics must
//! not take them), or be a web page of another site driving a logged-in
//! browser (cross-site requests are refused with 403). Against the real
//! binary, security on.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Server;
use reqwest::Method;
use serde_json::Value;

/// Sends one raw HTTP/1.1 request and returns the status.
fn raw_status(s: &Server, head: &str) -> u16 {
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(head.as_bytes()).unwrap();
    let mut reply = Vec::new();
    let _ = c.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    reply.get(9..12).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{reply:?}"))
}

#[test]
fn invented_http_methods_are_labelled_other_and_do_not_grow_the_metrics() {
    let s = Server::start_secure("junk-methods");
    let before = s.get("/metrics").text().unwrap().len();
    for i in 0..40 {
        let method = format!("JUNK{i}{}", "X".repeat(4096));
        for path in ["/healthz", "/v1/topics", "/no/such/route"] {
            let head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let status = raw_status(&s, &head);
            assert!((400..500).contains(&status), "{path}: {status}");
        }
    }
    let text = s.get("/metrics").text().unwrap();
    assert!(!text.contains("JUNK"), "an invented method became a label");
    assert!(
        text.contains("method=\"other\""),
        "invented methods are counted as other: {}",
        text.lines().filter(|l| l.contains("http_requests_total")).collect::<Vec<_>>().join("\n")
    );
    // 120 requests with 4 KiB methods: a few new series, not 480 KiB.
    assert!(text.len() < before + 16 * 1024, "/metrics grew from {before} to {} bytes", text.len());
}

/// Status and error of a request as root with `headers`.
fn as_root_with(
    s: &Server,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut r = s.as_admin(method, path).body(body.to_owned());
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().unwrap();
    let status = r.status().as_u16();
    let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap_or(Value::Null);
    (status, v["error"].as_str().unwrap_or_default().to_owned())
}

/// A page of another site cannot make a logged-in browser (cached Basic
/// credentials) produce, consume or change anything: whatever the browser
/// marks as cross-site (`Sec-Fetch-Site: cross-site`, or an `Origin` that
/// is not the server's) is a 403 with a clear message, even with valid
/// credentials and a `text/plain` JSON body. Same-origin browser requests
/// and programmatic clients (neither header) are untouched.
#[test]
fn requests_a_browser_marks_as_cross_site_are_refused_with_403() {
    let s = Server::start_secure("csrf");
    let own_origin = format!("http://127.0.0.1:{}", s.port);
    let cross: [&[(&str, &str)]; 4] = [
        &[("sec-fetch-site", "cross-site")],
        &[("origin", "http://evil.example")],
        &[("origin", "null")],
        &[("origin", "http://evil.example"), ("sec-fetch-site", "cross-site")],
    ];
    let form = ("content-type", "text/plain");
    for h in cross {
        let h: Vec<(&str, &str)> = h.iter().copied().chain([form]).collect();
        let (status, error) =
            as_root_with(&s, Method::POST, "/v1/topics", &h, r#"{"name":"forged"}"#);
        assert_eq!(status, 403, "{h:?}: {error}");
        assert!(error.contains("cross-site"), "{error}");
        let body = r#"{"username":"eve","password":"x","grants":[{"action":"admin"}]}"#;
        assert_eq!(as_root_with(&s, Method::POST, "/v1/users", &h, body).0, 403, "{h:?}");
        assert_eq!(as_root_with(&s, Method::GET, "/v1/topics", &h, "").0, 403, "{h:?}");
    }
    assert_eq!(s.as_admin(Method::GET, "/v1/topics/forged").send().unwrap().status(), 404);
    assert_eq!(s.as_admin(Method::GET, "/v1/users/eve").send().unwrap().status(), 404);
    // The browser on the server's own origin, and a programmatic client.
    let same: [&[(&str, &str)]; 3] = [
        &[("origin", own_origin.as_str()), ("sec-fetch-site", "same-origin")],
        &[("sec-fetch-site", "none")],
        &[],
    ];
    for (i, h) in same.into_iter().enumerate() {
        let body = format!(r#"{{"name":"t{i}"}}"#);
        let (status, error) = as_root_with(&s, Method::POST, "/v1/topics", h, &body);
        assert_eq!(status, 201, "{h:?}: {error}");
    }
    // The open paths use no credentials and stay readable by other sites.
    let r = s
        .client
        .get(s.url("/openapi.json"))
        .header("origin", "http://evil.example")
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    // A refused request is counted.
    let m = s.get("/metrics").text().unwrap();
    let refused = common::metric(&m, "narad_errors_total", &["kind=\"cross_site\""]);
    assert!(refused.is_some_and(|n| n >= 12.0), "{refused:?}");
}
