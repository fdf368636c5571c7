//! Authentication, authorization, the users API, the failed-password
//! throttle and rate limits, against a secured server (no `--dev`).

mod common;

use common::{ADMIN_PASSWORD, Opts, Server};
use reqwest::Method;
use serde_json::{Value, json};

fn status_and_json(r: reqwest::blocking::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Creates a user as root.
fn add_user(s: &Server, name: &str, password: &str, grants: Value) -> Value {
    let body = json!({ "username": name, "password": password, "grants": grants });
    let (status, v) = status_and_json(
        s.as_admin(Method::POST, "/v1/users").body(body.to_string()).send().unwrap(),
    );
    assert_eq!(status, 201, "{v}");
    v
}

fn create_topic_as(s: &Server, user: &str, pw: &str, name: &str) -> (u16, Value) {
    let body = json!({ "name": name });
    status_and_json(
        s.as_user(Method::POST, "/v1/topics", user, pw).body(body.to_string()).send().unwrap(),
    )
}

fn produce_as(s: &Server, user: &str, pw: &str, topic: &str) -> u16 {
    let path = format!("/v1/topics/{topic}/produce");
    s.as_user(Method::POST, &path, user, pw).body("m").send().unwrap().status().as_u16()
}

#[test]
fn requests_without_valid_credentials_get_401_with_the_basic_challenge() {
    let s = Server::start_secure("auth401");
    for path in ["/v1/topics", "/v1/users", "/no/such/route"] {
        let r = s.get(path);
        assert_eq!(r.status(), 401, "{path}");
        assert_eq!(r.headers()["www-authenticate"], "Basic realm=\"narad\"");
        assert_eq!(r.text().unwrap(), "{\"error\":\"authentication required\"}\n");
    }
    let r = s.as_user(Method::GET, "/v1/topics", "admin", "wrong").send().unwrap();
    assert_eq!(r.status(), 401);
    let r = s.as_user(Method::GET, "/v1/topics", "nobody", "x").send().unwrap();
    assert_eq!(r.status(), 401);
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(s.get(path).status(), 200, "{path} is open");
    }
    assert_eq!(s.as_admin(Method::GET, "/v1/topics").send().unwrap().status(), 200);
    // Refused requests are measured like served ones: GET /v1/topics was
    // refused three times (no credentials, wrong password, unknown user).
    let metrics = s.get("/metrics").text().unwrap();
    let refused =
        "narad_http_requests_total{route=\"GET /v1/topics\",method=\"GET\",status=\"401\"} 3";
    assert!(metrics.contains(refused), "{metrics}");
    let served =
        "narad_http_requests_total{route=\"GET /v1/topics\",method=\"GET\",status=\"200\"} 1";
    assert!(metrics.contains(served), "{metrics}");
}

#[test]
fn the_root_user_is_seeded_from_the_environment_and_protected() {
    let s = Server::start_secure("root");
    let (status, users) = status_and_json(s.as_admin(Method::GET, "/v1/users").send().unwrap());
    assert_eq!(status, 200);
    assert_eq!(users[0]["username"], "admin");
    assert_eq!(users[0]["root"], true);
    assert!(users[0].get("password_hash").is_none(), "hashes never leave the server");
    let r = s.as_admin(Method::DELETE, "/v1/users/admin").send().unwrap();
    assert_eq!(r.status(), 403);
    let r = s
        .as_admin(Method::PUT, "/v1/users/admin/grants")
        .body(json!({"grants": []}).to_string())
        .send();
    assert_eq!(r.unwrap().status(), 403);
    assert!(!s.log().contains(ADMIN_PASSWORD), "a given password is never logged");
    // Root changes its own password with the current one.
    let body = json!({"current_password": "nope", "new_password": "n3w"});
    let (status, v) = status_and_json(
        s.as_admin(Method::PUT, "/v1/users/admin/password").body(body.to_string()).send().unwrap(),
    );
    assert_eq!((status, v["error"].as_str()), (403, Some("current password is incorrect")));
    let body = json!({"current_password": ADMIN_PASSWORD, "new_password": "n3w"});
    let r =
        s.as_admin(Method::PUT, "/v1/users/admin/password").body(body.to_string()).send().unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(s.as_admin(Method::GET, "/v1/topics").send().unwrap().status(), 401);
    let r = s.as_user(Method::GET, "/v1/topics", "admin", "n3w").send().unwrap();
    assert_eq!(r.status(), 200);
}

#[test]
fn a_random_root_password_is_logged_once_when_none_is_given() {
    let mut s = Server::start_opts("randroot", Opts { env: Vec::new(), ..Opts::secure() });
    let log = s.log();
    let line = log.lines().find(|l| l.contains("generated password")).expect("logged at WARN");
    assert!(line.contains("WARN"), "{line}");
    let password = line.split("password=").nth(1).unwrap().split_whitespace().next().unwrap();
    let r = s.as_user(Method::GET, "/v1/topics", "admin", password).send().unwrap();
    assert_eq!(r.status(), 200);
    s.terminate();
    s.restart();
    assert_eq!(s.log().matches("generated password").count(), 1, "seeded once");
}

#[test]
fn grants_scope_produce_consume_and_create_and_owners_modify_their_topics() {
    let s = Server::start_secure("grants");
    add_user(
        &s,
        "bob",
        "bpw",
        json!([
            {"action": "produce", "patterns": ["orders*"]},
            {"action": "consume", "patterns": ["orders"]},
        ]),
    );
    add_user(&s, "alice", "apw", json!([{"action": "create", "patterns": ["al*"]}]));
    assert_eq!(create_topic_as(&s, "admin", ADMIN_PASSWORD, "orders").0, 201);
    assert_eq!(create_topic_as(&s, "admin", ADMIN_PASSWORD, "other").0, 201);

    assert_eq!(produce_as(&s, "bob", "bpw", "orders"), 202);
    let r = s.as_user(Method::POST, "/v1/topics/other/produce", "bob", "bpw").body("m").send();
    let (status, v) = status_and_json(r.unwrap());
    assert_eq!((status, v["error"].as_str()), (403, Some("produce not allowed on this topic")));
    let r = s.as_user(Method::GET, "/v1/topics/orders/consume?wait=2s", "bob", "bpw").send();
    assert_eq!(r.unwrap().status(), 200);
    let (status, v) = status_and_json(
        s.as_user(Method::GET, "/v1/topics/other/consume", "bob", "bpw").send().unwrap(),
    );
    assert_eq!((status, v["error"].as_str()), (403, Some("consume not allowed on this topic")));
    let r = s.as_user(Method::POST, "/v1/topics/other/ack?receipt_handle=0:0:1", "bob", "bpw");
    assert_eq!(r.send().unwrap().status(), 403, "ack needs consume");
    assert_eq!(s.as_user(Method::GET, "/v1/topics", "bob", "bpw").send().unwrap().status(), 200);

    let (status, v) = create_topic_as(&s, "bob", "bpw", "orders2");
    assert_eq!((status, v["error"].as_str()), (403, Some("create not allowed on this topic")));
    let (status, t) = create_topic_as(&s, "alice", "apw", "al1");
    assert_eq!((status, t["owner"].as_str()), (201, Some("alice")), "the caller owns it");
    let (status, v) =
        status_and_json(s.as_user(Method::DELETE, "/v1/topics/al1", "bob", "bpw").send().unwrap());
    assert_eq!(
        (status, v["error"].as_str()),
        (403, Some("only the topic owner or an admin may modify this topic"))
    );
    let r = s
        .as_user(Method::PATCH, "/v1/topics/al1", "alice", "apw")
        .body(json!({"partitions": 4}).to_string());
    assert_eq!(r.send().unwrap().status(), 200);
    let r = s.as_user(Method::DELETE, "/v1/topics/al1", "alice", "apw").send().unwrap();
    assert_eq!(r.status(), 204);
    let r = s.as_user(Method::DELETE, "/v1/topics/missing", "alice", "apw").send().unwrap();
    assert_eq!(r.status(), 404, "a missing topic passes the owner check");
    let body = json!({"name": "al.child", "parent": "orders"});
    let (status, v) = status_and_json(
        s.as_user(Method::POST, "/v1/topics", "alice", "apw")
            .body(body.to_string())
            .send()
            .unwrap(),
    );
    assert_eq!(
        (status, v["error"].as_str()),
        (403, Some("only the topic owner or an admin may modify this topic"))
    );
    let (status, v) =
        status_and_json(s.as_user(Method::GET, "/v1/users", "bob", "bpw").send().unwrap());
    assert_eq!((status, v["error"].as_str()), (403, Some("admin privileges required")));
}

#[test]
fn grant_and_password_changes_apply_at_once() {
    let s = Server::start_secure("changes");
    add_user(&s, "bob", "bpw", json!([{"action": "produce", "patterns": ["a"]}]));
    create_topic_as(&s, "admin", ADMIN_PASSWORD, "a");
    create_topic_as(&s, "admin", ADMIN_PASSWORD, "b");
    assert_eq!(produce_as(&s, "bob", "bpw", "a"), 202);
    assert_eq!(produce_as(&s, "bob", "bpw", "b"), 403);
    let grants = json!({"grants": [{"action": "produce", "patterns": ["*"]}]});
    let (status, u) = status_and_json(
        s.as_admin(Method::PUT, "/v1/users/bob/grants").body(grants.to_string()).send().unwrap(),
    );
    assert_eq!(status, 200);
    assert_eq!(u["grants"][0]["patterns"][0], "*");
    assert_eq!(produce_as(&s, "bob", "bpw", "b"), 202, "the cached credential sees the new grant");
    let body = json!({"new_password": "bpw2"});
    let r =
        s.as_admin(Method::PUT, "/v1/users/bob/password").body(body.to_string()).send().unwrap();
    assert_eq!(r.status(), 204, "admins reset passwords without the current one");
    assert_eq!(produce_as(&s, "bob", "bpw", "a"), 401, "the old password stops working at once");
    assert_eq!(produce_as(&s, "bob", "bpw2", "a"), 202);
    let body = json!({"current_password": "bpw2", "new_password": "bpw3"});
    let r = s
        .as_user(Method::PUT, "/v1/users/bob/password", "bob", "bpw2")
        .body(body.to_string())
        .send();
    assert_eq!(r.unwrap().status(), 204, "self-service with the current password");
    let r = s.as_admin(Method::DELETE, "/v1/users/bob").send().unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(produce_as(&s, "bob", "bpw3", "a"), 401, "a deleted user is gone at once");
}

#[test]
fn delegation_only_root_grants_admin_and_admins_cannot_touch_root() {
    let s = Server::start_secure("delegation");
    add_user(&s, "carol", "cpw", json!([{"action": "admin"}]));
    let carol = |m: Method, p: &str| s.as_user(m, p, "carol", "cpw");
    let body = json!({"username": "dave", "password": "d", "grants": [{"action": "admin"}]});
    let (status, v) =
        status_and_json(carol(Method::POST, "/v1/users").body(body.to_string()).send().unwrap());
    assert_eq!(
        (status, v["error"].as_str()),
        (403, Some("cannot grant permissions you do not hold"))
    );
    let body = json!({"username": "dave", "password": "d", "grants": [{"action": "produce", "patterns": ["*"]}]});
    assert_eq!(
        carol(Method::POST, "/v1/users").body(body.to_string()).send().unwrap().status(),
        201
    );
    let body = json!({"new_password": "x"});
    let r = carol(Method::PUT, "/v1/users/admin/password").body(body.to_string()).send().unwrap();
    assert_eq!(r.status(), 403, "only root changes root's password");
    assert_eq!(
        carol(Method::DELETE, "/v1/users/carol").send().unwrap().status(),
        403,
        "not yourself"
    );
    let r =
        carol(Method::PUT, "/v1/users/carol/grants").body(json!({"grants": []}).to_string()).send();
    assert_eq!(r.unwrap().status(), 403, "not your own grants");
    assert_eq!(carol(Method::GET, "/v1/users/dave").send().unwrap().status(), 200);
    assert_eq!(carol(Method::DELETE, "/v1/users/dave").send().unwrap().status(), 204);
    let (status, v) = status_and_json(carol(Method::GET, "/v1/users/dave").send().unwrap());
    assert_eq!((status, v["error"].as_str()), (404, Some("not found")));
    // A plain user reads itself but no one else.
    add_user(&s, "erin", "epw", json!([]));
    assert_eq!(
        s.as_user(Method::GET, "/v1/users/erin", "erin", "epw").send().unwrap().status(),
        200
    );
    assert_eq!(
        s.as_user(Method::GET, "/v1/users/carol", "erin", "epw").send().unwrap().status(),
        403
    );
}

#[test]
fn users_api_validates_its_input() {
    let s = Server::start_secure("usersapi");
    let u = add_user(&s, "bob", "pw", json!([{"action": "consume", "patterns": ["x*"]}]));
    assert_eq!(u["username"], "bob");
    assert!(u["created_at_ms"].as_i64().unwrap() > 1_600_000_000_000);
    assert!(u.get("password").is_none() && u.get("password_hash").is_none());
    let post = |body: Value| {
        status_and_json(
            s.as_admin(Method::POST, "/v1/users").body(body.to_string()).send().unwrap(),
        )
    };
    assert_eq!(post(json!({"username": "bob", "password": "p"})).0, 409);
    assert_eq!(post(json!({"username": "b b", "password": "p"})).0, 400);
    assert_eq!(post(json!({"username": "c", "password": ""})).0, 400);
    assert_eq!(post(json!({"username": "c", "password": "p", "grants": [{"action": "admin", "patterns": ["x"]}]})).0, 400);
    assert_eq!(
        post(json!({"username": "c", "password": "p", "grants": [{"action": "produce"}]})).0,
        400
    );
    assert_eq!(post(json!({"username": "c", "password": "p", "grants": [{"action": "read", "patterns": ["x"]}]})).0, 400);
    let (status, v) = post(json!({"username": "c", "password": "p", "extra": 1}));
    assert_eq!(
        (status, v["error"].as_str()),
        (400, Some("invalid json: json: unknown field \"extra\""))
    );
    let (status, list) = status_and_json(s.as_admin(Method::GET, "/v1/users").send().unwrap());
    assert_eq!(status, 200);
    let names: Vec<&str> =
        list.as_array().unwrap().iter().map(|u| u["username"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["admin", "bob"]);
}

#[test]
fn failed_passwords_are_throttled_per_username_with_429() {
    let s = Server::start_secure("throttle");
    add_user(&s, "bob", "right", json!([]));
    for i in 0..5 {
        let r = s.as_user(Method::GET, "/v1/topics", "bob", &format!("wrong{i}")).send().unwrap();
        assert_eq!(r.status(), 401, "attempt {i}");
    }
    for pw in ["wrong9", "right"] {
        let r = s.as_user(Method::GET, "/v1/topics", "bob", pw).send().unwrap();
        assert_eq!(r.status(), 429, "{pw}: throttled before any verify");
        let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=12).contains(&retry), "{retry}");
        assert_eq!(r.text().unwrap(), "{\"error\":\"too many failed authentication attempts\"}\n");
    }
    let r = s.as_admin(Method::GET, "/v1/topics").send().unwrap();
    assert_eq!(r.status(), 200, "other users are not throttled");
    let metrics = s.get("/metrics").text().unwrap();
    assert!(
        metrics.contains("narad_throttled_requests_total{reason=\"auth_failures\"} 2"),
        "{metrics}"
    );
}

#[test]
fn a_rate_limited_producer_gets_429_and_others_keep_their_own_budget() {
    let root = common::temp_dir("ratelimit-cfg");
    let cfg = root.join("limits.toml");
    std::fs::write(
        &cfg,
        "[limits]\nproduce_rate = 0.01\nproduce_burst = 2\n[limits.users.vip]\nproduce_rate = 0\n",
    )
    .unwrap();
    let s =
        Server::start_opts("ratelimit", Opts::secure().args(&["--config", cfg.to_str().unwrap()]));
    add_user(&s, "bob", "b", json!([{"action": "produce", "patterns": ["*"]}]));
    add_user(&s, "vip", "v", json!([{"action": "produce", "patterns": ["*"]}]));
    create_topic_as(&s, "admin", ADMIN_PASSWORD, "t");
    assert_eq!(produce_as(&s, "bob", "b", "t"), 202);
    assert_eq!(produce_as(&s, "bob", "b", "t"), 202);
    let r = s.as_user(Method::POST, "/v1/topics/t/produce", "bob", "b").body("m").send().unwrap();
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1, "{retry}");
    assert_eq!(r.text().unwrap(), "{\"error\":\"rate limit exceeded: produce\"}\n");
    let batch = json!({"messages": [{"payload": "x"}]});
    let r = s
        .as_user(Method::POST, "/v1/topics/t/produce/batch", "bob", "b")
        .body(batch.to_string())
        .send();
    assert_eq!(r.unwrap().status(), 429, "batch produce shares the budget");
    for _ in 0..5 {
        assert_eq!(produce_as(&s, "vip", "v", "t"), 202, "an override of 0 is unlimited");
    }
    assert_eq!(produce_as(&s, "admin", ADMIN_PASSWORD, "t"), 202, "budgets are per user");
    let r = s.as_user(Method::GET, "/v1/topics/t/consume", "bob", "b").send().unwrap();
    assert_eq!(r.status(), 403, "consume is limited separately (and bob may not)");
    let metrics = s.get("/metrics").text().unwrap();
    assert!(
        metrics.contains("narad_throttled_requests_total{reason=\"produce_rate\"} 2"),
        "{metrics}"
    );
}

#[test]
fn dev_mode_has_security_off_and_topics_have_no_owner() {
    let s = Server::start("devmode");
    let t = s.create_topic(r#"{"name":"t"}"#);
    assert!(t.get("owner").is_none(), "{t}");
    let r = s.post("/v1/users", r#"{"username":"u","password":"p"}"#);
    assert_eq!(r.status(), 201, "the users API works without security");
    assert!(!s.log().contains("seeded the root user"));
}

/// A client whose connections come from `source` (a loopback address).
fn client_from(source: &str) -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .local_address(source.parse::<std::net::IpAddr>().unwrap())
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .unwrap()
}

#[test]
fn parallel_wrong_guesses_cannot_outrun_the_failed_password_throttle() {
    let s = Server::start_secure("parallelguess");
    add_user(&s, "bob", "right", json!([]));
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..41)
            .map(|i| {
                let s = &s;
                scope.spawn(move || {
                    let pw = if i == 20 { "right".to_owned() } else { format!("wrong{i}") };
                    let r = s.as_user(Method::GET, "/v1/topics", "bob", &pw).send().unwrap();
                    r.status().as_u16()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let verified = statuses.iter().filter(|&&st| st != 429).count();
    assert!(verified <= 5, "only the burst of 5 is verified: {statuses:?}");
    assert!(statuses.iter().all(|st| [200, 401, 429].contains(st)), "{statuses:?}");
}

#[test]
fn a_pool_logging_in_at_once_with_the_right_password_is_never_throttled() {
    // Tokens are taken before the verify, so 24 first logins of one
    // credential sent at once would spend the burst of 5 and get 429s;
    // identical credentials share one verify instead.
    let s = Server::start_secure("poollogin");
    add_user(&s, "carol", "right", json!([]));
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..24)
            .map(|_| {
                let s = &s;
                scope.spawn(move || {
                    s.as_user(Method::GET, "/v1/topics", "carol", "right")
                        .send()
                        .unwrap()
                        .status()
                        .as_u16()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(statuses.iter().all(|&st| st == 200), "{statuses:?}");
}

#[test]
fn attaching_a_child_needs_the_childs_owner_or_an_admin_too() {
    let s = Server::start_secure("attachowner");
    add_user(&s, "alice", "apw", json!([{"action": "create", "patterns": ["al*"]}]));
    add_user(&s, "bob", "bpw", json!([{"action": "create", "patterns": ["bob*"]}]));
    assert_eq!(create_topic_as(&s, "alice", "apw", "al.p").0, 201);
    assert_eq!(create_topic_as(&s, "alice", "apw", "al.c").0, 201);
    assert_eq!(create_topic_as(&s, "bob", "bpw", "bob.t1").0, 201);
    assert_eq!(create_topic_as(&s, "admin", ADMIN_PASSWORD, "orders").0, 201);
    let attach = |user: &str, pw: &str, child: &str| {
        let body = json!({"child": child, "delay_ms": 60000});
        let r = s.as_user(Method::POST, "/v1/topics/al.p/children", user, pw);
        status_and_json(r.body(body.to_string()).send().unwrap())
    };
    for child in ["orders", "bob.t1"] {
        let (status, v) = attach("alice", "apw", child);
        assert_eq!(
            (status, v["error"].as_str()),
            (403, Some("only the topic owner or an admin may modify this topic")),
            "{child}"
        );
    }
    assert_eq!(produce_as(&s, "admin", ADMIN_PASSWORD, "orders"), 202, "orders is no child");
    assert_eq!(attach("alice", "apw", "al.c").0, 200, "both hers");
    assert_eq!(attach("admin", ADMIN_PASSWORD, "bob.t1").0, 200, "an admin may");
    // A missing child is still a 404 (not a 403 that would hide it).
    assert_eq!(attach("alice", "apw", "al.missing").0, 404);
    // Create-with-parent: the new child is the caller's; the parent must be too.
    let body = json!({"name": "al.c2", "parent": "orders"});
    let r = s.as_user(Method::POST, "/v1/topics", "alice", "apw").body(body.to_string());
    assert_eq!(r.send().unwrap().status(), 403);
    let body = json!({"name": "al.c3", "parent": "al.p"});
    let r = s.as_user(Method::POST, "/v1/topics", "alice", "apw").body(body.to_string());
    assert_eq!(r.send().unwrap().status(), 201);
}

#[test]
fn strangers_guessing_and_other_users_changes_do_not_lock_out_admin() {
    let s = Server::start_secure("lockout");
    add_user(&s, "low", "lpw", json!([]));
    let stranger = client_from("127.0.0.2");
    let guess = |c: &reqwest::blocking::Client, user: &str, pw: &str| {
        let r = c.get(s.url("/v1/topics")).basic_auth(user, Some(pw)).send().unwrap();
        r.status().as_u16()
    };
    // A stranger on another address exhausts its budget for `admin`...
    let from_stranger: Vec<u16> =
        (0..8).map(|i| guess(&stranger, "admin", &format!("w{i}"))).collect();
    assert_eq!(from_stranger.last(), Some(&429), "{from_stranger:?}");
    // ... and the operator, never signed in yet, still gets in from its own.
    assert_eq!(guess(&s.client, "admin", ADMIN_PASSWORD), 200, "per-address budget");
    // Guessing from the operator's own address: a credential that verified
    // keeps working, also after another user's password change.
    let local: Vec<u16> = (0..8).map(|i| guess(&s.client, "admin", &format!("w{i}"))).collect();
    assert_eq!(local.last(), Some(&429), "{local:?}");
    let body = json!({"current_password": "lpw", "new_password": "lpw2"});
    let r = s.as_user(Method::PUT, "/v1/users/low/password", "low", "lpw").body(body.to_string());
    assert_eq!(r.send().unwrap().status(), 204);
    assert_eq!(guess(&s.client, "admin", ADMIN_PASSWORD), 200, "verified credential kept");
    assert_eq!(guess(&s.client, "admin", "w-again"), 429, "guesses still throttled");
}

#[test]
fn the_current_password_check_is_throttled_like_a_login() {
    let s = Server::start_secure("currentpw");
    add_user(&s, "bob", "bpw", json!([]));
    let change = |current: &str| {
        let body = json!({"current_password": current, "new_password": "new"});
        let r = s.as_user(Method::PUT, "/v1/users/bob/password", "bob", "bpw");
        r.body(body.to_string()).send().unwrap().status().as_u16()
    };
    let statuses: Vec<u16> = (0..8).map(|i| change(&format!("wrong{i}"))).collect();
    assert_eq!(&statuses[..5], &[403; 5], "{statuses:?}");
    assert_eq!(statuses[7], 429, "{statuses:?}");
    assert_eq!(change("bpw"), 429, "throttled before any verify");
    assert_eq!(s.as_user(Method::GET, "/v1/topics", "bob", "bpw").send().unwrap().status(), 200);
}

#[test]
fn overlong_usernames_are_refused_unverified_and_not_logged_in_full() {
    let s = Server::start_secure("longname");
    let long = "n".repeat(45_000);
    for _ in 0..3 {
        let r = s.as_user(Method::GET, "/v1/topics", &long, "x").send().unwrap();
        assert_eq!(r.status(), 401);
    }
    let log = s.log();
    assert!(!log.contains(&"n".repeat(100)), "the name is not logged in full");
    assert!(log.len() < 20_000, "{} bytes of log", log.len());
}

#[test]
fn passwords_over_72_bytes_are_refused() {
    let s = Server::start_secure("longpw");
    let p72 = "p".repeat(72);
    let p73 = "p".repeat(73);
    let create = |name: &str, pw: &str| {
        let body = json!({"username": name, "password": pw});
        status_and_json(
            s.as_admin(Method::POST, "/v1/users").body(body.to_string()).send().unwrap(),
        )
    };
    let (status, v) = create("long", &p73);
    assert_eq!((status, v["error"].as_str()), (400, Some("password longer than 72 bytes")));
    assert_eq!(create("edge", &p72).0, 201);
    let ok = s.as_user(Method::GET, "/v1/topics", "edge", &p72).send().unwrap();
    assert_eq!(ok.status(), 200);
    let longer = format!("{p72}x");
    let r = s.as_user(Method::GET, "/v1/topics", "edge", &longer).send().unwrap();
    assert_eq!(r.status(), 401, "a 72-byte prefix is not the password");
    let body = json!({"new_password": p73});
    let (status, v) = status_and_json(
        s.as_admin(Method::PUT, "/v1/users/edge/password").body(body.to_string()).send().unwrap(),
    );
    assert_eq!((status, v["error"].as_str()), (400, Some("password longer than 72 bytes")));
}

#[test]
fn a_user_who_owns_topics_cannot_be_deleted() {
    let s = Server::start_secure("ownerdelete");
    add_user(&s, "alice", "apw", json!([{"action": "create", "patterns": ["al*"]}]));
    assert_eq!(create_topic_as(&s, "alice", "apw", "al1").0, 201);
    let (status, v) =
        status_and_json(s.as_admin(Method::DELETE, "/v1/users/alice").send().unwrap());
    assert_eq!(status, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("al1"), "{v}");
    assert_eq!(s.as_admin(Method::DELETE, "/v1/topics/al1").send().unwrap().status(), 204);
    assert_eq!(s.as_admin(Method::DELETE, "/v1/users/alice").send().unwrap().status(), 204);
    // A new alice owns nothing of the old one's.
    add_user(&s, "alice", "apw2", json!([]));
    assert_eq!(create_topic_as(&s, "admin", ADMIN_PASSWORD, "al1").0, 201);
    let r = s.as_user(Method::DELETE, "/v1/topics/al1", "alice", "apw2").send().unwrap();
    assert_eq!(r.status(), 403);
}
