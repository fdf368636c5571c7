//! Cross-site request forgery: a request that a browser marks as sent by
//! another site is refused with 403 before authentication, so a web page
//! cannot make a logged-in browser (cached Basic credentials) produce,
//! consume, ack or change anything.
//!
//! The marks (browsers add them; a page's script cannot remove them):
//! `Sec-Fetch-Site: cross-site`, or an `Origin` header that is not the
//! server's own origin (its host and port, as the request's `Host` names
//! them). Programmatic clients (curl, the Go client, the CLI) send neither
//! and are never refused. The open paths (`/healthz`, `/readyz`,
//! `/metrics`, `/openapi.json`) use no credentials and are exempt, so a
//! dashboard or API viewer on another origin may read them.
//!
//! Narad 3.1 instead refuses form-like content types without an
//! `X-Narad-Client` header (415); that refuses Narad v2-era bodiless acks
//! and every `curl -d` example, so narad does not copy it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, Uri, header};
use tracing::warn;

use crate::access::{EXEMPT_PATHS, forbidden};
use crate::error::ApiError;

/// The 403 text of a refused cross-site request.
pub const CROSS_SITE_DENIED: &str = "cross-site request refused: a browser marked this request as sent by another site \
     (Sec-Fetch-Site or Origin); clients that are not browsers send neither header";

/// At most one log line per this many seconds (a page can send many).
const LOG_EVERY_SECS: u64 = 10;

/// Second of the last log line, and refusals not logged since.
static LAST_LOG: AtomicU64 = AtomicU64::new(0);
static UNLOGGED: AtomicU64 = AtomicU64::new(0);

/// Why a request counts as cross-site, if it does. `host` is the request's
/// `Host` header, or its URI's authority (HTTP/2 has `:authority` instead).
pub fn cross_site(path: &str, host: Option<&str>, headers: &HeaderMap) -> Option<&'static str> {
    cross_site_with(path, || host, headers)
}

/// `Sec-Fetch-Site`, parsed once.
const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// [`cross_site`], asking for the host only when the request has an
/// `Origin` (most requests have neither header; a produce pays for two
/// header lookups, not four).
fn cross_site_with<'h>(
    path: &str,
    host: impl FnOnce() -> Option<&'h str>,
    headers: &HeaderMap,
) -> Option<&'static str> {
    let site = headers.get(SEC_FETCH_SITE).map(|v| v.as_bytes());
    let cross = site.is_some_and(|s| s.eq_ignore_ascii_case(b"cross-site"));
    let origin = headers.get(header::ORIGIN);
    if !cross && origin.is_none() {
        return None;
    }
    if EXEMPT_PATHS.contains(&path) {
        return None;
    }
    if cross {
        return Some("sec-fetch-site");
    }
    match (origin?.to_str().ok().and_then(origin_authority), host()) {
        (Some(o), Some(h)) if same_authority(&o, h) => None,
        _ => Some("origin"),
    }
}

/// The refusal of a cross-site request (and its metric and rate-limited
/// log line), or `None` for any other request.
pub fn refusal(req: &Request, metrics: &narad_broker::metrics::BrokerMetrics) -> Option<ApiError> {
    refusal_of(req.uri(), req.headers(), metrics)
}

/// [`refusal`] of a request given by its URI and headers.
pub fn refusal_of(
    uri: &Uri,
    headers: &HeaderMap,
    metrics: &narad_broker::metrics::BrokerMetrics,
) -> Option<ApiError> {
    let host = || match headers.get(header::HOST) {
        Some(h) => h.to_str().ok(),
        None => uri.authority().map(|a| a.as_str()),
    };
    let why = cross_site_with(uri.path(), host, headers)?;
    metrics.error("http", "cross_site");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let last = LAST_LOG.load(Ordering::Relaxed);
    if now >= last + LOG_EVERY_SECS
        && LAST_LOG.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    {
        let suppressed = UNLOGGED.swap(0, Ordering::Relaxed);
        warn!(mark = why, suppressed, "cross-site request refused");
    } else {
        UNLOGGED.fetch_add(1, Ordering::Relaxed);
    }
    Some(forbidden(CROSS_SITE_DENIED))
}

/// `host[:port]` of an `Origin` (`scheme://host[:port]`), lowercased, with
/// the scheme's default port made explicit; `None` for `null` or anything
/// that is not an origin.
fn origin_authority(origin: &str) -> Option<String> {
    let (scheme, rest) = origin.split_once("://")?;
    let port = match scheme.to_ascii_lowercase().as_str() {
        "http" => "80",
        "https" => "443",
        _ => return None,
    };
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return None;
    }
    Some(with_port(&rest.to_ascii_lowercase(), port))
}

/// `authority` with `default` appended when it names no port (an IPv6
/// literal's own colons are inside its brackets).
fn with_port(authority: &str, default: &str) -> String {
    let has_port = match authority.rfind(':') {
        None => false,
        Some(i) => !authority.starts_with('[') || authority[..i].ends_with(']'),
    };
    if has_port { authority.to_owned() } else { format!("{authority}:{default}") }
}

/// Whether the origin's authority is the request's `Host`. The `Host`
/// carries no scheme: without a port it is compared under both defaults.
fn same_authority(origin: &str, host: &str) -> bool {
    let host = host.trim().to_ascii_lowercase();
    [with_port(&host, "80"), with_port(&host, "443")].iter().any(|h| *h == origin)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    /// As for an HTTP/1.1 request: the host from the `Host` header.
    fn cross(path: &str, h: &HeaderMap) -> Option<&'static str> {
        cross_site(path, h.get(header::HOST).and_then(|v| v.to_str().ok()), h)
    }

    #[test]
    fn only_requests_a_browser_marks_as_from_another_site_are_cross_site() {
        let p = "/v1/topics";
        let host = ("host", "127.0.0.1:7942");
        // Programmatic clients: neither header.
        assert_eq!(cross(p, &headers(&[host])), None);
        assert_eq!(cross(p, &headers(&[])), None);
        // Same origin, same site, typed into the address bar.
        for site in ["same-origin", "same-site", "none"] {
            assert_eq!(cross(p, &headers(&[host, ("sec-fetch-site", site)])), None);
        }
        assert_eq!(cross(p, &headers(&[host, ("origin", "http://127.0.0.1:7942")])), None);
        assert_eq!(cross(p, &headers(&[host, ("origin", "HTTPS://127.0.0.1:7942")])), None);
        let h = headers(&[("host", "narad.example"), ("origin", "https://narad.example")]);
        assert_eq!(cross(p, &h), None);
        let h = headers(&[("host", "[::1]:7942"), ("origin", "http://[::1]:7942")]);
        assert_eq!(cross(p, &h), None);
        let h = headers(&[("host", "[::1]"), ("origin", "http://[::1]")]);
        assert_eq!(cross(p, &h), None);
        // Cross-site.
        let marked = [
            headers(&[host, ("sec-fetch-site", "cross-site")]),
            headers(&[host, ("sec-fetch-site", "cross-site"), ("origin", "http://127.0.0.1:7942")]),
            headers(&[host, ("origin", "http://evil.example")]),
            headers(&[host, ("origin", "http://127.0.0.1:7943")]),
            headers(&[host, ("origin", "http://127.0.0.1")]),
            headers(&[host, ("origin", "null")]),
            headers(&[host, ("origin", "file://")]),
            headers(&[host, ("origin", "http://127.0.0.1:7942@evil.example")]),
            headers(&[("origin", "http://127.0.0.1:7942")]),
            headers(&[("host", "[::1]:7942"), ("origin", "http://[::1]:7943")]),
        ];
        for h in marked {
            assert!(cross(p, &h).is_some(), "{h:?}");
        }
        // HTTP/2: no `Host`, the authority of the URI.
        let h = headers(&[("origin", "https://127.0.0.1:7942")]);
        assert_eq!(cross_site(p, Some("127.0.0.1:7942"), &h), None);
        assert!(cross_site(p, Some("127.0.0.1:7943"), &h).is_some());
        // The open paths are exempt.
        let h = headers(&[host, ("sec-fetch-site", "cross-site")]);
        assert_eq!(cross("/openapi.json", &h), None);
    }
}
