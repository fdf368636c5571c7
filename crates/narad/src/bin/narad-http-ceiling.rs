//! `narad-http-ceiling`: the request-rate ceiling of this machine.
//!
//! A bare axum server on the same runtime and HTTP stack as `narad serve`
//! that reads the whole body of any POST and answers `202 Accepted` with an
//! empty body (every other method gets `200 {}`). No WAL, no broker, no
//! routing: what is left is the cost of HTTP/1.1 and TCP on loopback, so
//! `narad bench produce --url` against it gives the req/s that a produce,
//! which is one request, can never beat. `bench/compare` runs it under the
//! same load generator and concurrency as narad.
//!
//! Usage: `narad-http-ceiling [--addr 127.0.0.1:7950]`. SIGTERM or SIGINT
//! stops it.

use std::net::SocketAddr;
use std::process::ExitCode;

use axum::Router;
use axum::body::Bytes;
use axum::http::{Method, StatusCode};

/// The same allocator as `narad serve`, so the ceiling is measured with it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn answer(method: Method, body: Bytes) -> (StatusCode, &'static str) {
    // The body is read in full before the answer, as a produce reads it.
    std::hint::black_box(body.len());
    if method == Method::POST { (StatusCode::ACCEPTED, "") } else { (StatusCode::OK, "{}") }
}

fn parse_addr() -> Result<SocketAddr, String> {
    let mut args = std::env::args().skip(1);
    let mut addr = "127.0.0.1:7950".to_owned();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--addr" => addr = args.next().ok_or("--addr needs a value")?,
            "-h" | "--help" => {
                return Err("usage: narad-http-ceiling [--addr HOST:PORT]".to_owned());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    addr.parse().map_err(|e| format!("invalid --addr {addr:?}: {e}"))
}

async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn main() -> ExitCode {
    let addr = match parse_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("narad-http-ceiling: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("narad-http-ceiling: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let served: std::io::Result<()> = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        eprintln!("narad-http-ceiling listening on {}", listener.local_addr()?);
        let app = Router::new().fallback(answer);
        axum::serve(listener, app).with_graceful_shutdown(shutdown()).await
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("narad-http-ceiling: {e}");
            ExitCode::from(1)
        }
    }
}
