//! What every accepted connection gets before a byte of HTTP is read.

use axum::serve::Listener;
use narad_server::accept::{ConnLimit, PlainListener};
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};

/// Accepts one connection on `listener` (dialled from here).
async fn accept_one<L: Listener>(listener: &mut L, addr: std::net::SocketAddr) -> L::Io {
    let dial = tokio::spawn(async move { TcpStream::connect(addr).await.unwrap() });
    let (io, _) = listener.accept().await;
    drop(dial.await.unwrap());
    io
}

#[tokio::test]
async fn accepted_connections_have_nagles_algorithm_turned_off() {
    // The control: a socket as the kernel hands it out still delays.
    let mut raw = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = raw.local_addr().unwrap();
    let io = accept_one(&mut raw, addr).await;
    assert!(!io.nodelay().unwrap(), "the kernel's default is Nagle on");

    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let mut listener = PlainListener::new(tcp, ConnLimit::new(4, &mut Registry::default()));
    let io = accept_one(&mut listener, addr).await;
    assert!(io.get_ref().nodelay().unwrap(), "TCP_NODELAY is set on every accepted connection");
}
