//! Every route × every method, against a secured server, for a user with
//! no grants and for one with only some: nothing may succeed (2xx) that
//! the README's Security section does not allow, and nothing may fail with
//! a 5xx. Axum answers `HEAD` with a route's `GET` handler, so a rule table
//! that names only `GET` would let `HEAD` through unchecked.

mod common;

use common::Server;
use reqwest::Method;
use serde_json::json;

/// Every method a client can send: the standard ones and an invented one.
fn methods() -> Vec<Method> {
    vec![
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        Method::OPTIONS,
        Method::from_bytes(b"FROB").unwrap(),
    ]
}

/// Each route of the router as a concrete path (`{me}` is the caller,
/// `{other}` another user, `{node}` the server's node id), with a body that
/// would succeed where allowed.
fn routes() -> Vec<(&'static str, String)> {
    let batch = json!({"messages": [{"payload": "x"}]}).to_string();
    vec![
        ("/v1/topics", json!({"name": "zz-new"}).to_string()),
        ("/v1/topics/t", json!({"partitions": 12}).to_string()),
        ("/v1/topics/t/produce", "m".into()),
        ("/v1/topics/t/produce/batch", batch),
        ("/v1/topics/t/consume?wait=0s", String::new()),
        ("/v1/topics/t/ack?receipt_handle=0:0:1", String::new()),
        ("/v1/topics/t/children", json!({"child": "c2"}).to_string()),
        ("/v1/topics/t/children/c", String::new()),
        ("/v1/users", json!({"username": "zz", "password": "p"}).to_string()),
        ("/v1/users/{me}", String::new()),
        ("/v1/users/{other}", String::new()),
        ("/v1/users/{me}/grants", json!({"grants": [{"action": "admin"}]}).to_string()),
        ("/v1/users/{other}/grants", json!({"grants": [{"action": "admin"}]}).to_string()),
        (
            "/v1/users/{me}/password",
            json!({"current_password": "wrong", "new_password": "x"}).to_string(),
        ),
        ("/v1/users/{other}/password", json!({"new_password": "x"}).to_string()),
        ("/v1/cluster/members", String::new()),
        ("/v1/cluster/members/{node}/decommission", String::new()),
        ("/v1/cluster/members/{node}?force=true", String::new()),
        ("/v1/cluster/moves", String::new()),
        ("/v1/cluster/rebalance", String::new()),
        ("/v1/cluster/status", String::new()),
        ("/healthz", String::new()),
        ("/readyz", String::new()),
        ("/metrics", String::new()),
        ("/openapi.json", String::new()),
        ("/no/such/route", String::new()),
    ]
}

/// What the README allows any authenticated user: every GET (and so HEAD)
/// of topics, children and the cluster, reading itself, and the open
/// paths.
fn allowed_to_anyone(method: &Method, route: &str) -> bool {
    let read = *method == Method::GET || *method == Method::HEAD;
    read && matches!(
        route,
        "/v1/topics"
            | "/v1/topics/t"
            | "/v1/topics/t/children"
            | "/v1/users/{me}"
            | "/v1/cluster/members"
            | "/v1/cluster/moves"
            | "/v1/cluster/rebalance"
            | "/v1/cluster/status"
            | "/healthz"
            | "/readyz"
            | "/metrics"
            | "/openapi.json"
    )
}

fn add_user(s: &Server, name: &str, grants: serde_json::Value) {
    let body = json!({"username": name, "password": "pw", "grants": grants});
    let r = s.as_admin(Method::POST, "/v1/users").body(body.to_string()).send().unwrap();
    assert_eq!(r.status(), 201);
}

/// Walks every route × method as `user`; returns the requests that
/// succeeded without being allowed, or answered 5xx.
fn walk(s: &Server, user: &str, also_allowed: &[(Method, &str)]) -> Vec<String> {
    let mut bad = Vec::new();
    let status = s.as_admin(Method::GET, "/v1/cluster/status").send().unwrap();
    let node: serde_json::Value = serde_json::from_str(&status.text().unwrap()).unwrap();
    let node = node["node_id"].as_str().expect("node id").to_owned();
    for (route, body) in routes() {
        let path = route.replace("{me}", user).replace("{other}", "other").replace("{node}", &node);
        for m in methods() {
            let r = s.as_user(m.clone(), &path, user, "pw").body(body.clone()).send().unwrap();
            let status = r.status().as_u16();
            let allowed = allowed_to_anyone(&m, route)
                || also_allowed.iter().any(|(am, ar)| *am == m && *ar == route);
            if (200..300).contains(&status) && !allowed || status >= 500 {
                bad.push(format!("{user}: {m} {path} -> {status} {}", r.text().unwrap()));
            }
        }
    }
    bad
}

#[test]
fn no_route_and_method_succeeds_beyond_the_callers_grants() {
    let s = Server::start_secure("matrix");
    let admin = |m: Method, p: &str, b: serde_json::Value| {
        let r = s.as_admin(m, p).body(b.to_string()).send().unwrap();
        assert!(r.status().is_success(), "{p}: {}", r.status());
    };
    admin(Method::POST, "/v1/topics", json!({"name": "t"}));
    admin(Method::POST, "/v1/topics", json!({"name": "c"}));
    admin(Method::POST, "/v1/topics", json!({"name": "c2"}));
    admin(Method::POST, "/v1/topics/t/children", json!({"child": "c"}));
    // A message in t: a consume that slips through would lease it (200).
    let r = s.as_admin(Method::POST, "/v1/topics/t/produce").body("secret").send().unwrap();
    assert_eq!(r.status(), 202);
    add_user(&s, "other", json!([]));
    add_user(&s, "nobody", json!([]));
    add_user(
        &s,
        "some",
        json!([
            {"action": "produce", "patterns": ["t"]},
            {"action": "create", "patterns": ["s*"]},
            {"action": "consume", "patterns": ["c*"]},
        ]),
    );

    let mut bad = walk(&s, "nobody", &[]);
    bad.extend(walk(
        &s,
        "some",
        &[(Method::POST, "/v1/topics/t/produce"), (Method::POST, "/v1/topics/t/produce/batch")],
    ));
    assert!(bad.is_empty(), "requests beyond the caller's grants:\n{}", bad.join("\n"));

    // Nothing was leased, altered or attached by the walk: the message is
    // still there for admin to lease (beside what `some` produced).
    let mut payloads = Vec::new();
    loop {
        let r = s.as_admin(Method::GET, "/v1/topics/t/consume?max=100&wait=500ms").send().unwrap();
        if r.status() == 204 {
            break;
        }
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = serde_json::from_str(&r.text().unwrap()).unwrap();
        payloads.extend(v["messages"].as_array().unwrap().iter().map(common::payload_bytes));
    }
    assert!(payloads.iter().any(|p| p == b"secret"), "{payloads:?}");
    let t = s.as_admin(Method::GET, "/v1/topics/t").send().unwrap().text().unwrap();
    let t: serde_json::Value = serde_json::from_str(&t).unwrap();
    assert_ne!(t["partitions"], 12, "{t}");
}
