//! Every route that takes a JSON object refuses any other JSON value — an
//! array (serde would read it as the struct's field values, in order), a
//! bare string, a number, a boolean, `null` — with 400 and the route's
//! `invalid json` message, and creates or changes nothing; nested objects
//! (each message of a batch, each grant) likewise. Against the real binary,
//! security on (the users routes need it).

mod common;

use common::{ADMIN_PASSWORD, Server};
use reqwest::Method;
use serde_json::{Value, json};

/// Status and parsed body of a request as root.
fn send(s: &Server, method: Method, path: &str, body: &str) -> (u16, Value) {
    let r = s.as_admin(method, path).body(body.to_owned()).send().unwrap();
    let status = r.status().as_u16();
    let text = r.text().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Asserts that every one of `bodies` is a 400 `invalid json: ...` on
/// `method path`.
fn refuses(s: &Server, method: Method, path: &str, bodies: &[&str]) {
    for body in bodies {
        let (status, v) = send(s, method.clone(), path, body);
        let error = v["error"].as_str().unwrap_or_default();
        assert!(
            status == 400 && error.starts_with("invalid json"),
            "{method} {path} with {body}: {status} {v}"
        );
    }
}

/// The bodies every object route must refuse besides its own
/// field-values array.
const NOT_OBJECTS: [&str; 5] = [r#""orders-x""#, "null", "7", "true", "[]"];

fn with_not_objects<'a>(own: &[&'a str]) -> Vec<&'a str> {
    own.iter().copied().chain(NOT_OBJECTS).collect()
}

fn get(s: &Server, path: &str) -> Value {
    let (status, v) = send(s, Method::GET, path, "");
    assert_eq!(status, 200, "GET {path}: {v}");
    v
}

#[test]
fn topic_create_refuses_bodies_that_are_not_objects_and_creates_nothing() {
    let s = Server::start_secure("strict-create");
    refuses(
        &s,
        Method::POST,
        "/v1/topics",
        &with_not_objects(&[r#"["orders-x"]"#, r#"["orders-x", 3]"#]),
    );
    let (status, _) = send(&s, Method::GET, "/v1/topics/orders-x", "");
    assert_eq!(status, 404, "no topic was created");
    assert_eq!(send(&s, Method::POST, "/v1/topics", r#"{"name":"orders-x"}"#).0, 201);
}

#[test]
fn topic_patch_refuses_bodies_that_are_not_objects_and_changes_nothing() {
    let s = Server::start_secure("strict-patch");
    assert_eq!(send(&s, Method::POST, "/v1/topics", r#"{"name":"t"}"#).0, 201);
    let before = get(&s, "/v1/topics/t");
    refuses(&s, Method::PATCH, "/v1/topics/t", &with_not_objects(&["[6]", "[6, 7200000]"]));
    let after = get(&s, "/v1/topics/t");
    assert_eq!(before["partitions"], after["partitions"]);
    assert_eq!(before["retention_ms"], after["retention_ms"]);
}

#[test]
fn batch_produce_refuses_bodies_and_messages_that_are_not_objects_and_accepts_nothing() {
    let s = Server::start_secure("strict-batch");
    assert_eq!(send(&s, Method::POST, "/v1/topics", r#"{"name":"t"}"#).0, 201);
    let path = "/v1/topics/t/produce/batch";
    let mut bodies = with_not_objects(&[r#"[[{"payload":1}]]"#]);
    // Each element of `messages` too: field values in declaration order
    // (key, key_encoding, payload), or any other non-object.
    bodies.extend([
        r#"{"messages":[["k", null, {"a":1}]]}"#,
        r#"{"messages":[{"payload":1}, ["k", null, 2]]}"#,
        r#"{"messages":["x"]}"#,
        r#"{"messages":[null]}"#,
    ]);
    refuses(&s, Method::POST, path, &bodies);
    let (status, _) = send(&s, Method::GET, "/v1/topics/t/consume?wait=200ms", "");
    assert_eq!(status, 204, "nothing was accepted");
    assert_eq!(send(&s, Method::POST, path, r#"{"messages":[{"payload":1}]}"#).0, 202);
}

#[test]
fn batch_ack_refuses_bodies_that_are_not_objects_and_acks_nothing() {
    let s = Server::start_secure("strict-ack");
    assert_eq!(send(&s, Method::POST, "/v1/topics", r#"{"name":"t"}"#).0, 201);
    assert_eq!(send(&s, Method::POST, "/v1/topics/t/produce", "m").0, 202);
    let (status, m) = send(&s, Method::GET, "/v1/topics/t/consume?wait=5s", "");
    assert_eq!(status, 200, "{m}");
    let handle = m["receipt_handle"].as_str().unwrap().to_owned();
    let array = json!([[handle]]).to_string();
    refuses(&s, Method::POST, "/v1/topics/t/ack", &with_not_objects(&[&array]));
    // The lease is still held: a real ack of it succeeds.
    let (status, v) = send(
        &s,
        Method::POST,
        "/v1/topics/t/ack",
        &json!({ "receipt_handles": [handle] }).to_string(),
    );
    assert_eq!((status, &v["results"][0]["status"]), (200, &json!(204)), "{v}");
}

#[test]
fn attach_refuses_bodies_that_are_not_objects_and_attaches_nothing() {
    let s = Server::start_secure("strict-attach");
    for name in ["p", "c"] {
        assert_eq!(
            send(&s, Method::POST, "/v1/topics", &json!({ "name": name }).to_string()).0,
            201
        );
    }
    refuses(
        &s,
        Method::POST,
        "/v1/topics/p/children",
        &with_not_objects(&[r#"["c"]"#, r#"["c", 0]"#]),
    );
    let v = get(&s, "/v1/topics/p/children");
    assert_eq!(v["children"], json!([]), "nothing attached: {v}");
}

#[test]
fn user_create_refuses_bodies_that_are_not_objects_and_creates_nobody() {
    let s = Server::start_secure("strict-users");
    refuses(
        &s,
        Method::POST,
        "/v1/users",
        &with_not_objects(&[
            r#"["bob", "pw"]"#,
            r#"["bob", "pw", [{"action":"produce","patterns":["*"]}]]"#,
            r#"{"username":"bob","password":"pw","grants":[["produce", ["*"]]]}"#,
        ]),
    );
    assert_eq!(send(&s, Method::GET, "/v1/users/bob", "").0, 404, "nobody was created");
}

#[test]
fn user_grants_refuse_bodies_that_are_not_objects_and_change_nothing() {
    let s = Server::start_secure("strict-grants");
    let create =
        json!({"username":"bob","password":"pw","grants":[{"action":"consume","patterns":["a"]}]});
    assert_eq!(send(&s, Method::POST, "/v1/users", &create.to_string()).0, 201);
    let before = get(&s, "/v1/users/bob")["grants"].clone();
    refuses(
        &s,
        Method::PUT,
        "/v1/users/bob/grants",
        &with_not_objects(&[
            r#"[[{"action":"produce","patterns":["*"]}]]"#,
            r#"{"grants":[["produce", ["*"]]]}"#,
        ]),
    );
    assert_eq!(get(&s, "/v1/users/bob")["grants"], before);
}

#[test]
fn user_password_refuses_bodies_that_are_not_objects_and_changes_nothing() {
    let s = Server::start_secure("strict-password");
    let body = format!(r#"["{ADMIN_PASSWORD}", "taken-over"]"#);
    refuses(&s, Method::PUT, "/v1/users/admin/password", &with_not_objects(&[&body]));
    // The password did not change.
    let r = s.as_user(Method::GET, "/v1/topics", "admin", "taken-over").send().unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(send(&s, Method::GET, "/v1/topics", "").0, 200);
}
