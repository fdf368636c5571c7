//! The load generator's HTTP client: one HTTP/1.1 keep-alive connection per
//! simulated client, driven by hyper's connection API directly.
//!
//! No pool, no redirects, no TLS, no body streaming: each worker owns one
//! connection and sends one request at a time on it (as wrk does), so 64
//! clients cost 64 sockets and 64 small tasks. A connection that fails is
//! dropped and dialled again on the next request.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Where requests go: address, `Host` header, path prefix, credentials.
#[derive(Debug, Clone)]
pub struct Target {
    /// The resolved server address.
    pub addr: SocketAddr,
    host: HeaderValue,
    /// Path prefix from the URL (`""` for `http://host:port`).
    prefix: String,
    auth: Option<HeaderValue>,
}

/// Splits `http://host[:port][/prefix]` into host, port and prefix.
pub fn parse_url(url: &str) -> Result<(String, u16, String), String> {
    let rest = if let Some(r) = url.strip_prefix("http://") {
        r
    } else if url.starts_with("https://") {
        return Err(format!(
            "{url}: the load generator speaks plain HTTP only (terminate TLS in front of it)"
        ));
    } else {
        return Err(format!("{url}: expected http://HOST[:PORT]"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(format!("{url}: no host"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let end = v6.find(']').ok_or_else(|| format!("{url}: unterminated [ipv6]"))?;
        let host = &v6[..end];
        let port = match &v6[end + 1..] {
            "" => 80,
            p => p
                .strip_prefix(':')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("{url}: invalid port"))?,
        };
        (host.to_owned(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().map_err(|_| format!("{url}: invalid port"))?),
            None => (authority.to_owned(), 80),
        }
    };
    Ok((host, port, path.to_owned()))
}

/// The `Authorization: Basic ...` value for `user:password`.
pub fn basic_auth(user: &str, password: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let raw = format!("{user}:{password}");
    let b = raw.as_bytes();
    let mut out = String::from("Basic ");
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 { T[(n >> 6) as usize & 63] as char } else { '=' });
        out.push(if chunk.len() > 2 { T[n as usize & 63] as char } else { '=' });
    }
    out
}

impl Target {
    /// Resolves `url`; `credentials` adds HTTP Basic auth to every request.
    pub async fn resolve(url: &str, credentials: Option<(&str, &str)>) -> Result<Target, String> {
        let (host, port, prefix) = parse_url(url)?;
        let addr = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("{url}: cannot resolve {host}: {e}"))?
            .next()
            .ok_or_else(|| format!("{url}: {host} has no address"))?;
        let host_header =
            if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        let auth = credentials
            .map(|(u, p)| HeaderValue::from_str(&basic_auth(u, p)))
            .transpose()
            .map_err(|e| format!("credentials: {e}"))?;
        Ok(Target {
            addr,
            host: HeaderValue::from_str(&host_header).map_err(|e| format!("{url}: {e}"))?,
            prefix,
            auth,
        })
    }

    /// Resolves a comma-separated list of URLs (the nodes of a cluster:
    /// clients are spread over them in turn).
    pub async fn resolve_all(
        urls: &str,
        credentials: Option<(&str, &str)>,
    ) -> Result<Vec<Target>, String> {
        let mut out = Vec::new();
        for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            out.push(Target::resolve(url, credentials).await?);
        }
        if out.is_empty() {
            return Err(format!("{urls:?}: no URL"));
        }
        Ok(out)
    }

    /// The full request path for `path` (which starts with `/`).
    pub fn path(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }
}

/// One answer: status and the whole body.
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: StatusCode,
    /// The body, read to the end.
    pub body: Bytes,
}

/// A worker's connection, dialled on first use and again after a failure.
#[derive(Debug, Default)]
pub struct Conn {
    tx: Option<http1::SendRequest<Full<Bytes>>>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Conn {
    async fn dial(target: &Target) -> Result<http1::SendRequest<Full<Bytes>>, BoxError> {
        let stream = TcpStream::connect(target.addr).await?;
        stream.set_nodelay(true)?;
        let (tx, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // Ends when the server closes or the sender is dropped.
            let _ = conn.await;
        });
        Ok(tx)
    }

    /// Sends one request (`path_and_query` already carries the prefix) and
    /// reads the whole answer. A transport error drops the connection.
    pub async fn send(
        &mut self,
        target: &Target,
        method: Method,
        path_and_query: &str,
        body: Bytes,
        json: bool,
    ) -> Result<Answer, BoxError> {
        let result = self.send_inner(target, method, path_and_query, body, json).await;
        if result.is_err() {
            self.tx = None;
        }
        result
    }

    async fn send_inner(
        &mut self,
        target: &Target,
        method: Method,
        path_and_query: &str,
        body: Bytes,
        json: bool,
    ) -> Result<Answer, BoxError> {
        if self.tx.as_ref().is_none_or(|tx| tx.is_closed()) {
            self.tx = Some(Self::dial(target).await?);
        }
        let Some(tx) = self.tx.as_mut() else { unreachable!("dialled above") };
        tx.ready().await?;
        let mut req = Request::builder().method(method).uri(path_and_query);
        let headers = req.headers_mut().ok_or("invalid request")?;
        headers.insert(HOST, target.host.clone());
        if let Some(a) = &target.auth {
            headers.insert(AUTHORIZATION, a.clone());
        }
        if json {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if !body.is_empty() {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        let resp = tx.send_request(req.body(Full::new(body))?).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(Answer { status, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_comma_separated_list_gives_one_target_per_node() {
        let t = Target::resolve_all("http://127.0.0.1:7001, http://127.0.0.1:7002,", None)
            .await
            .unwrap();
        let ports: Vec<u16> = t.iter().map(|t| t.addr.port()).collect();
        assert_eq!(ports, vec![7001, 7002]);
        assert!(Target::resolve_all(" , ", None).await.is_err());
        assert!(Target::resolve_all("http://127.0.0.1:7001,ftp://x", None).await.is_err());
    }

    #[test]
    fn urls_split_into_host_port_and_prefix() {
        assert_eq!(
            parse_url("http://127.0.0.1:7942").unwrap(),
            ("127.0.0.1".into(), 7942, String::new())
        );
        assert_eq!(
            parse_url("http://localhost/base/").unwrap(),
            ("localhost".into(), 80, "/base".into())
        );
        assert_eq!(parse_url("http://[::1]:9000").unwrap(), ("::1".into(), 9000, String::new()));
        assert!(parse_url("https://x").unwrap_err().contains("plain HTTP"));
        assert!(parse_url("127.0.0.1:7942").is_err());
        assert!(parse_url("http://h:notaport").is_err());
    }

    #[test]
    fn basic_auth_is_rfc_7617_base64() {
        assert_eq!(basic_auth("Aladdin", "open sesame"), "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
        assert_eq!(basic_auth("a", "b"), "Basic YTpi");
        assert_eq!(basic_auth("ab", "c"), "Basic YWI6Yw==");
    }
}
