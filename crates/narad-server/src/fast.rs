//! What a connection serves: the router, and in front of it the produce
//! fast path.
//!
//! A single produce (`POST /v1/topics/{topic}/produce` whose topic segment
//! is a plain topic name) is answered here without the router: the same
//! measurement ([`crate::http_metrics`]), cross-site check
//! ([`crate::csrf`]), access checks ([`crate::access::admit_produce`]) and
//! handler ([`crate::routes::produce::produce_to`]) as through it, in the
//! same order, with the same answers. What the fast path saves is the
//! router's per-request work (route lookup, path parameters and matched
//! path in the request's extensions, the middleware's boxed futures, the
//! header map the handler's extractor clones): about a quarter of the
//! instructions of a durable produce, by callgrind. Every other request,
//! and a produce whose topic segment is anything else (percent-encoded,
//! empty, not a valid name), goes through the router as before.

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Method, Request, Version, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tower_service::Service;

use crate::state::Shared;

/// The application a connection serves.
#[derive(Debug, Clone)]
pub struct App {
    router: Router,
    /// The state the fast path uses (`None`: every request to the router).
    state: Option<Shared>,
}

impl App {
    /// `router`, with the produce fast path on `state` in front of it.
    pub fn new(router: Router, state: Shared) -> App {
        App { router, state: Some(state) }
    }

    /// The answer to `req`, which came from `peer`.
    pub fn answer<B>(
        &self,
        req: Request<B>,
        peer: SocketAddr,
    ) -> impl Future<Output = Response> + Send + use<B>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        let topic_len = match &self.state {
            Some(_) if *req.method() == Method::POST => {
                produce_topic(req.uri().path()).map(str::len)
            }
            _ => None,
        };
        let route = match (&self.state, topic_len) {
            (Some(s), Some(len)) => Route::Fast(s.clone(), len),
            _ => Route::Router(self.router.clone()),
        };
        async move {
            match route {
                Route::Fast(s, topic_len) => produce(s, req, topic_len, peer).await,
                Route::Router(mut router) => {
                    let mut req = req.map(Body::new);
                    // The peer's address: the failed-password throttle is per
                    // address.
                    req.extensions_mut().insert(ConnectInfo(peer));
                    match router.call(req).await {
                        Ok(r) => r,
                        Err(e) => match e {},
                    }
                }
            }
        }
    }
}

/// Where a request goes.
enum Route {
    /// The fast path, with the length of the path's topic segment.
    Fast(Shared, usize),
    Router(Router),
}

/// The topic of a single produce's path, if the fast path can take it as
/// written: `/v1/topics/{topic}/produce` with a topic segment of 1 to 255
/// of the characters a topic name may have (so it needs no decoding).
pub fn produce_topic(path: &str) -> Option<&str> {
    let topic = path.strip_prefix(TOPICS_PREFIX)?.strip_suffix("/produce")?;
    let plain = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    (!topic.is_empty() && topic.len() <= 255 && topic.bytes().all(|b| plain(&b))).then_some(topic)
}

const TOPICS_PREFIX: &str = "/v1/topics/";

/// A single produce (its path's topic segment, checked by
/// [`produce_topic`], is `topic_len` bytes long), answered as the router
/// would: measured, checked for cross-site marks, then for access, then
/// handled.
async fn produce<B>(s: Shared, req: Request<B>, topic_len: usize, peer: SocketAddr) -> Response
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let (parts, body) = req.into_parts();
    let measure = s.http.begin_produce(&parts.headers);
    let mut resp = match crate::csrf::refusal_of(&parts.uri, &parts.headers, s.broker.metrics()) {
        Some(refused) => refused.into_response(),
        None => {
            let at = TOPICS_PREFIX.len();
            let topic = &parts.uri.path()[at..at + topic_len];
            let admitted = if crate::access::is_open(&s) {
                Ok(())
            } else {
                crate::access::admit_produce(&s, topic, &parts.headers, peer.ip()).await.map(drop)
            };
            match admitted {
                Err(refused) => refused,
                Ok(()) => crate::routes::produce::produce_to(
                    &s,
                    topic,
                    parts.uri.query(),
                    &parts.headers,
                    body,
                )
                .await
                .unwrap_or_else(IntoResponse::into_response),
            }
        }
    };
    s.http.finish(measure, &resp, s.broker.metrics());
    if parts.version == Version::HTTP_2 {
        set_content_length(&mut resp);
    }
    resp
}

/// What the router adds to every answer (after the measurement): a
/// `Content-Length` when the body's size is known and none is set. Over
/// HTTP/1 hyper writes the same header line in the same place itself (the
/// last header before `date`, for any answer to a `POST`), so only HTTP/2
/// answers need it added.
fn set_content_length(resp: &mut Response) {
    if resp.headers().contains_key(header::CONTENT_LENGTH) {
        return;
    }
    if let Some(size) = http_body::Body::size_hint(resp.body()).exact() {
        let value = match size {
            0 => HeaderValue::from_static("0"),
            n => HeaderValue::from(n),
        };
        resp.headers_mut().insert(header::CONTENT_LENGTH, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn produce_topic_takes_plain_names_only() {
        assert_eq!(produce_topic("/v1/topics/orders/produce"), Some("orders"));
        assert_eq!(produce_topic("/v1/topics/a.b_c-9/produce"), Some("a.b_c-9"));
        for other in [
            "/v1/topics//produce",
            "/v1/topics/a/b/produce",
            "/v1/topics/a%2Fb/produce",
            "/v1/topics/%61/produce",
            "/v1/topics/a/produce/",
            "/v1/topics/a/produce/batch",
            "/v1/topics/a/consume",
            "/v1/topics/a b/produce",
            "/v1/topicsx/a/produce",
        ] {
            assert_eq!(produce_topic(other), None, "{other}");
        }
        let long = format!("/v1/topics/{}/produce", "a".repeat(256));
        assert_eq!(produce_topic(&long), None);
        let max = format!("/v1/topics/{}/produce", "a".repeat(255));
        assert!(produce_topic(&max).is_some());
    }
}
