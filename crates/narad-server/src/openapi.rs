//! `GET /openapi.json`: the OpenAPI 3 document of the API, generated from
//! the handlers' `#[utoipa::path]` attributes and the `ToSchema` request
//! and response types, so it cannot drift from the code. A test walks the
//! router's routes and fails if one is not in the document.
//!
//! Served without authentication, like `/healthz`.

use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::error::json_response;
use crate::routes::{children, cluster, consume, health, produce, topics, users};

/// The document.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "narad",
        description = "A WAL-first durable message broker: produce is acknowledged (202) once \
                       fsynced; consumers lease messages and ack them. Errors are \
                       `{\"error\":\"...\"}` JSON. Every /v1 route needs HTTP Basic \
                       credentials unless the server runs with --dev.",
        license(name = "Apache-2.0")
    ),
    paths(
        topics::create,
        topics::list,
        topics::get,
        topics::alter,
        topics::delete,
        produce::produce,
        produce::produce_batch,
        consume::consume,
        consume::ack,
        children::attach,
        children::list,
        children::detach,
        users::create,
        users::list,
        users::get,
        users::delete,
        users::put_grants,
        users::put_password,
        cluster::members,
        cluster::decommission,
        cluster::cancel_decommission,
        crate::routes::cluster_remove::remove,
        cluster::moves,
        cluster::start_move,
        cluster::rebalance,
        cluster::status,
        health::healthz,
        health::readyz,
        health::metrics,
        serve,
    ),
    modifiers(&BasicAuth, &Links),
    tags(
        (name = "topics", description = "Create, list, read, alter and delete topics"),
        (name = "messages", description = "Produce, consume and acknowledge"),
        (name = "users", description = "Users and grants (admins)"),
        (name = "cluster", description = "Members, decommission, partition moves and the control plane's status"),
        (name = "operations", description = "Health, readiness, metrics, this document"),
    )
)]
pub struct ApiDoc;

/// Adds the Basic scheme and requires it on every /v1 operation.
#[derive(Debug)]
struct BasicAuth;

impl Modify for BasicAuth {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        components
            .add_security_scheme("basic", SecurityScheme::Http(Http::new(HttpAuthScheme::Basic)));
        let basic = vec![utoipa::openapi::security::SecurityRequirement::new(
            "basic",
            Vec::<String>::new(),
        )];
        for (path, item) in api.paths.paths.iter_mut() {
            if !path.starts_with("/v1/") {
                continue;
            }
            for op in
                [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch]
                    .into_iter()
                    .flatten()
            {
                op.security = Some(basic.clone());
            }
        }
    }
}

/// Links from a create to the operations on what it created (by its name),
/// so clients and API fuzzers can follow them.
#[derive(Debug)]
struct Links;

impl Modify for Links {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::link::Link;
        fn targets(api: &utoipa::openapi::OpenApi, param: &str) -> Vec<String> {
            let needle = format!("{{{param}}}");
            let mut ids = Vec::new();
            for (path, item) in &api.paths.paths {
                if !path.contains(&needle) {
                    continue;
                }
                let ops = [&item.get, &item.put, &item.post, &item.delete, &item.patch];
                ids.extend(ops.into_iter().flatten().filter_map(|op| op.operation_id.clone()));
            }
            ids
        }
        let sources = [
            ("/v1/topics", "topic", "$response.body#/name"),
            ("/v1/users", "user", "$response.body#/username"),
        ];
        for (path, param, value) in sources {
            let ids = targets(api, param);
            let Some(create) = api.paths.paths.get_mut(path).and_then(|i| i.post.as_mut()) else {
                continue;
            };
            let Some(utoipa::openapi::RefOr::T(created)) =
                create.responses.responses.get_mut("201")
            else {
                continue;
            };
            for id in ids {
                let link = Link::builder().operation_id(id.clone()).parameter(param, value).build();
                created.links.insert(id, link.into());
            }
        }
    }
}

/// The error body of every JSON error: `{"error":"<message>"}`.
#[derive(Debug, Serialize, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
}

/// The JSON text of the document.
pub fn document() -> String {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    camel_case_links(&mut doc);
    optional_bodies_are_absent_not_null(&mut doc);
    doc.to_string()
}

/// utoipa documents an optional request body (`Option<T>`, the batch ack's)
/// as `oneOf: [null, T]`; the server refuses a `null` body (only objects
/// decode, `body::strict_json`): the body is `T`, and may be absent
/// (`required: false`).
fn optional_bodies_are_absent_not_null(doc: &mut serde_json::Value) {
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else { return };
    let bodies = paths
        .values_mut()
        .filter_map(|i| i.as_object_mut())
        .flat_map(|i| i.values_mut())
        .filter_map(|op| op.get_mut("requestBody"));
    for body in bodies {
        let Some(content) = body.get_mut("content").and_then(|c| c.as_object_mut()) else {
            continue;
        };
        let mut optional = false;
        for media in content.values_mut() {
            let Some(one_of) = media["schema"].get("oneOf").and_then(|o| o.as_array()) else {
                continue;
            };
            let mut not_null = one_of.iter().filter(|s| s["type"] != "null");
            if let (Some(only), None, 2) = (not_null.next(), not_null.next(), one_of.len()) {
                media["schema"] = only.clone();
                optional = true;
            }
        }
        if optional {
            body["required"] = serde_json::Value::Bool(false);
        }
    }
}

/// utoipa 5.5 writes a Link's fields in snake case (`operation_id`); the
/// OpenAPI names are `operationId`, `operationRef`, `requestBody`.
fn camel_case_links(doc: &mut serde_json::Value) {
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else { return };
    let operations =
        paths.values_mut().filter_map(|i| i.as_object_mut()).flat_map(|i| i.values_mut());
    let responses = operations
        .filter_map(|op| op.get_mut("responses").and_then(|r| r.as_object_mut()))
        .flat_map(|r| r.values_mut());
    let links = responses
        .filter_map(|r| r.get_mut("links").and_then(|l| l.as_object_mut()))
        .flat_map(|l| l.values_mut())
        .filter_map(|l| l.as_object_mut());
    for link in links {
        for (from, to) in [
            ("operation_id", "operationId"),
            ("operation_ref", "operationRef"),
            ("request_body", "requestBody"),
        ] {
            if let Some(v) = link.remove(from) {
                link.insert(to.to_owned(), v);
            }
        }
    }
}

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    operation_id = "openapi",
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "This document", content_type = "application/json"))
)]
pub async fn serve() -> Response {
    json_response(StatusCode::OK, document())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use axum::body::Body;
    use axum::http::{Method, Request};
    use narad_broker::metrics::BrokerMetrics;
    use narad_broker::{Broker, BrokerConfig};
    use prometheus_client::registry::Registry;
    use tower_service::Service;

    use super::*;
    use crate::access::Security;
    use crate::config::LimitsConfig;
    use crate::http_metrics::HttpMetrics;
    use crate::ratelimit::RateLimiter;
    use crate::state::AppState;

    const METHODS: [Method; 5] =
        [Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE];

    async fn state(dir: &std::path::Path) -> crate::state::Shared {
        let mut registry = Registry::default();
        let metrics = Arc::new(BrokerMetrics::new(&mut registry));
        let http = HttpMetrics::new(&mut registry);
        let broker = Broker::open(
            BrokerConfig {
                data_dir: dir.to_path_buf(),
                node_id: "openapi-test".into(),
                advertised_addr: "127.0.0.1:1".into(),
                topic_defaults: Default::default(),
                log: Default::default(),
                wal: Default::default(),
                idle_log_eviction_ms: 0,
            },
            narad_fs::RealFs::shared(),
            narad_clock::SystemClock::shared(),
            metrics,
        )
        .await
        .unwrap();
        let security =
            Security::new(None, RateLimiter::new(LimitsConfig::default()), &mut registry);
        let any_partition = crate::consume_any::AnyPartition::new(&mut registry);
        Arc::new(AppState {
            any_partition,
            broker,
            registry,
            http,
            ready: AtomicBool::new(true),
            shutting_down: AtomicBool::new(false),
            max_consume_wait: std::time::Duration::from_millis(10),
            security,
            cluster: None,
        })
    }

    /// The paths of the router's own route table (its `Debug` output lists
    /// them as `RouteId(n): "/path"`).
    fn router_paths(router: &axum::Router) -> BTreeSet<String> {
        let text = format!("{router:?}");
        let paths: BTreeSet<String> = text
            .split("RouteId(")
            .filter_map(|rest| rest.split_once("): \"").map(|(_, p)| p))
            .filter_map(|p| p.split_once('"').map(|(path, _)| path.to_owned()))
            .filter(|p| p.starts_with('/'))
            .collect();
        assert!(paths.len() >= 10, "cannot read the router's paths from {text}");
        paths
    }

    /// Every (method, path) the router serves: its paths, and for each the
    /// methods answered neither 405 nor by the plain-text 404 fallback
    /// (which also sits in the table, as `/` and a catch-all).
    async fn served(router: &axum::Router) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for path in router_paths(router) {
            let concrete: String = path
                .split('/')
                .map(|seg| if seg.starts_with('{') { "probe" } else { seg })
                .collect::<Vec<_>>()
                .join("/");
            for m in METHODS {
                let req = Request::builder().method(m.clone()).uri(&concrete).body(Body::empty());
                let resp = router.clone().call(req.unwrap()).await.unwrap();
                let fallback = resp.status() == StatusCode::NOT_FOUND
                    && resp.headers()[axum::http::header::CONTENT_TYPE]
                        .to_str()
                        .is_ok_and(|t| t.starts_with("text/plain"));
                if resp.status() != StatusCode::METHOD_NOT_ALLOWED && !fallback {
                    out.insert((m.as_str().to_owned(), path.clone()));
                }
            }
        }
        out
    }

    fn documented() -> BTreeSet<(String, String)> {
        let api = ApiDoc::openapi();
        let mut out = BTreeSet::new();
        for (path, item) in &api.paths.paths {
            let ops = [
                ("GET", item.get.is_some()),
                ("POST", item.post.is_some()),
                ("PUT", item.put.is_some()),
                ("PATCH", item.patch.is_some()),
                ("DELETE", item.delete.is_some()),
            ];
            for (m, present) in ops {
                if present {
                    out.insert((m.to_owned(), path.clone()));
                }
            }
        }
        out
    }

    #[tokio::test]
    async fn every_route_of_the_router_is_in_the_openapi_document_and_back() {
        let dir = std::env::temp_dir().join(format!("narad-openapi-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let s = state(&dir).await;
        let router = crate::server::router(s.clone());
        let served = served(&router).await;
        let documented = documented();
        let missing: Vec<_> = served.difference(&documented).collect();
        assert!(missing.is_empty(), "routes missing from /openapi.json: {missing:?}");
        let stale: Vec<_> = documented.difference(&served).collect();
        assert!(stale.is_empty(), "documented but not served: {stale:?}");
        assert!(served.contains(&("POST".to_owned(), "/v1/topics/{topic}/produce".to_owned())));
        s.broker.shutdown().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The batch ack answer is written by hand: it must decode into the
    /// documented `AckResults` (unknown fields refused).
    #[tokio::test]
    async fn a_batch_ack_answer_has_the_documented_shape() {
        let dir = std::env::temp_dir().join(format!("narad-openapi-ack-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let s = state(&dir).await;
        let router = crate::server::router(s.clone());
        let send = |method: Method, uri: &str, body: &str| {
            let req = Request::builder().method(method).uri(uri).body(Body::from(body.to_owned()));
            router.clone().call(req.unwrap())
        };
        let created = send(Method::POST, "/v1/topics", r#"{"name":"acks"}"#).await.unwrap();
        assert_eq!(created.status(), StatusCode::CREATED);
        let body = r#"{"receipt_handles":["0:0:1","bad"]}"#;
        let r = send(Method::POST, "/v1/topics/acks/ack", body).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let bytes = http_body_util::BodyExt::collect(r.into_body()).await.unwrap().to_bytes();
        let results: crate::routes::consume::AckResults = serde_json::from_slice(&bytes).unwrap();
        let statuses: Vec<u16> = results.results.iter().map(|r| r.status).collect();
        assert_eq!(statuses, vec![410, 400], "{}", String::from_utf8_lossy(&bytes));
        assert!(results.results.iter().all(|r| r.error.is_some()));
        s.broker.shutdown().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Follows a `$ref` to its component schema.
    fn resolve<'a>(
        doc: &'a serde_json::Value,
        schema: &'a serde_json::Value,
    ) -> &'a serde_json::Value {
        match schema["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/schemas/")) {
            Some(name) => &doc["components"]["schemas"][name],
            None => schema,
        }
    }

    /// Every JSON request body is an object (the server refuses any other
    /// JSON value, `body::strict_json`), and so is each item of an array of
    /// objects in it (a batch's `messages`, a user's `grants`): the document
    /// says so, so an API fuzzer sends objects and expects a 400 otherwise.
    #[test]
    fn every_json_request_body_is_documented_as_an_object() {
        let doc: serde_json::Value = serde_json::from_str(&document()).unwrap();
        let mut bodies = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let Some(schema) = op["requestBody"]["content"]["application/json"].get("schema")
                else {
                    continue;
                };
                bodies += 1;
                let body = resolve(&doc, schema);
                assert_eq!(body["type"], "object", "{method} {path}: {body}");
                for (field, prop) in body["properties"].as_object().into_iter().flatten() {
                    let items = resolve(&doc, &prop["items"]);
                    if items.get("properties").is_some() {
                        assert_eq!(items["type"], "object", "{method} {path} {field}: {items}");
                    }
                }
            }
        }
        assert!(bodies >= 8, "{bodies} JSON request bodies documented");
    }

    #[test]
    fn the_document_is_openapi_3_and_errors_have_one_shape() {
        let doc: serde_json::Value = serde_json::from_str(&document()).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{}", doc["openapi"]);
        let body = crate::error::error_body("boom");
        let e: ErrorBody = serde_json::from_str(&body).unwrap();
        assert_eq!(e.error, "boom");
        assert!(doc["components"]["securitySchemes"]["basic"].is_object());
        let link = &doc["paths"]["/v1/topics"]["post"]["responses"]["201"]["links"]["get_topic"];
        assert_eq!(link["operationId"], "get_topic", "{link}");
        assert_eq!(link["parameters"]["topic"], "$response.body#/name");
    }
}
