//! Golden bytes of the handshake (computed independently, with Python's
//! hmac module), its exchange over in-memory pipes, and what a peer that
//! lies, relays or replays gets.

use super::*;
use tokio::io::{DuplexStream, duplex};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
const OTHER: &[u8] = b"fedcba9876543210fedcba9876543210";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn binding() -> Binding {
    Binding { exporter: [0x11; 32], client_nonce: [0x22; 32], server_nonce: [0x33; 32] }
}

fn key(secret: &[u8]) -> [u8; 32] {
    ClusterSecret::new(secret).unwrap().key()
}

#[test]
fn the_key_and_both_proofs_match_independently_computed_bytes() {
    assert_eq!(
        key(SECRET).to_vec(),
        unhex("25c277476dcd31fd6b1a73512b8af562479ff4dcacb7df22f2e7163379bef535")
    );
    assert_eq!(
        mac(&key(SECRET), Role::Server, &binding(), "n1").to_vec(),
        unhex("30987b7d20dc2f3af7aa50f6c39b3a57f4849f8cd453c7bd8f79418cf96b3357")
    );
    assert_eq!(
        mac(&key(SECRET), Role::Client, &binding(), "n2").to_vec(),
        unhex("f05a4e1f2d203a1e8e9f85dfb2e22846fe854db966f58ee8ea34af1a462978ec")
    );
}

#[test]
fn every_message_matches_its_golden_bytes() {
    let b = binding();
    assert_eq!(
        encode_hello(&b.client_nonce),
        unhex("4e524832020100002222222222222222222222222222222222222222222222222222222222222222")
    );
    let server = Proof {
        nonce: Some(b.server_nonce),
        macs: vec![mac(&key(SECRET), Role::Server, &b, "n1")],
        node_id: "n1".into(),
    };
    assert_eq!(
        encode_proof(Kind::ServerProof, &server),
        unhex(
            "4e52483202020000333333333333333333333333333333333333333333333333333333333333333301\
             30987b7d20dc2f3af7aa50f6c39b3a57f4849f8cd453c7bd8f79418cf96b3357026e31"
        )
    );
    let client = Proof {
        nonce: None,
        macs: vec![mac(&key(SECRET), Role::Client, &b, "n2")],
        node_id: "n2".into(),
    };
    assert_eq!(
        encode_proof(Kind::ClientProof, &client),
        unhex(
            "4e5248320203000001f05a4e1f2d203a1e8e9f85dfb2e22846fe854db966f58ee8ea34af1a462978ec\
             026e32"
        )
    );
    assert_eq!(encode_welcome().to_vec(), unhex("4e52483202040000"));
}

#[tokio::test]
async fn golden_messages_decode_to_what_they_encode() {
    let b = binding();
    let sp = encode_proof(
        Kind::ServerProof,
        &Proof {
            nonce: Some(b.server_nonce),
            macs: vec![[7; 32], [8; 32]],
            node_id: "node-a.b_c".into(),
        },
    );
    let got = read_proof(&mut &sp[..], Kind::ServerProof).await.unwrap();
    assert_eq!(got.nonce, Some(b.server_nonce));
    assert_eq!(got.macs, vec![[7; 32], [8; 32]]);
    assert_eq!(got.node_id, "node-a.b_c");
    let hello = encode_hello(&b.client_nonce);
    assert_eq!(read_hello(&mut &hello[..]).await.unwrap(), b.client_nonce);
    read_welcome(&mut &encode_welcome()[..]).await.unwrap();
}

#[tokio::test]
async fn malformed_messages_are_refused_naming_the_field() {
    let hello = encode_hello(&[1; 32]);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        ([b"NRS1".as_slice(), &hello[4..]].concat(), "bad magic"),
        (
            {
                let mut h = hello.clone();
                h[4] = 1;
                h
            },
            "handshake version 1",
        ),
        (
            {
                let mut h = hello.clone();
                h[5] = 3;
                h
            },
            "message type 3",
        ),
        (
            {
                let mut h = hello.clone();
                h[7] = 1;
                h
            },
            "reserved",
        ),
    ];
    for (bytes, want) in cases {
        let e = read_hello(&mut &bytes[..]).await.unwrap_err();
        assert!(matches!(e, HandshakeError::Malformed(_)) && e.to_string().contains(want), "{e}");
    }
    // A cut-off message is an i/o error (the stream ended), not a panic.
    let e = read_hello(&mut &hello[..20]).await.unwrap_err();
    assert!(matches!(e, HandshakeError::Io(_)), "{e}");
    let proof = |n: u8, id: &[u8]| {
        let mut p = [&MAGIC[..], &[VERSION, Kind::ClientProof as u8, 0, 0], &[n]].concat();
        p.extend(std::iter::repeat_n(9u8, 32 * n.min(2) as usize));
        p.push(id.len() as u8);
        p.extend_from_slice(id);
        p
    };
    for (bytes, want) in [
        (proof(3, b"n1"), "3 macs"),
        (proof(1, b""), "node id of 0 bytes"),
        (proof(1, &[b'a'; 65]), "node id of 65 bytes"),
        (proof(1, b"n 1"), "not ^[A-Za-z0-9._-]+$"),
        (proof(1, "né".as_bytes()), "not ^[A-Za-z0-9._-]+$"),
    ] {
        let e = read_proof(&mut &bytes[..], Kind::ClientProof).await.unwrap_err();
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
}

#[tokio::test]
async fn a_frame_header_announcing_16_mib_is_only_eight_bad_bytes_to_the_handshake() {
    // The header flood of the v1 protocol: 20 bytes announcing 16 MiB.
    let mut flood = crate::frame::Header {
        kind: crate::frame::FrameType::NodeRequest,
        request_id: 1,
        len: 16 << 20,
    }
    .encode()
    .to_vec();
    flood.extend([0u8; 20]);
    let e = read_hello(&mut &flood[..]).await.unwrap_err();
    assert!(matches!(e, HandshakeError::Malformed(_)), "{e}");
}

/// Both ends over in-memory pipes, with the given keys and exporter values.
async fn exchange(
    client_keys: Vec<[u8; 32]>,
    server_keys: Vec<[u8; 32]>,
) -> (HResult<String>, HResult<String>) {
    let (mut c_send, mut s_recv) = duplex(1024);
    let (mut s_send, mut c_recv) = duplex(1024);
    let exporter = [0x5a; 32];
    let client = async {
        let r = client(&mut c_send, &mut c_recv, exporter, &client_keys, "n1").await;
        drop(c_send);
        r
    };
    let server = async {
        let r = server(&mut s_send, &mut s_recv, exporter, &server_keys, "n2").await;
        drop(s_send);
        r
    };
    tokio::join!(client, server)
}

#[tokio::test]
async fn nodes_with_the_same_secret_authenticate_each_other_and_learn_each_others_ids() {
    let (c, s) = exchange(vec![key(SECRET)], vec![key(SECRET)]).await;
    assert_eq!(c.unwrap(), "n2");
    assert_eq!(s.unwrap(), "n1");
    // Without secrets on both sides (--dev), the ids are exchanged unproved.
    let (c, s) = exchange(vec![], vec![]).await;
    assert_eq!((c.unwrap(), s.unwrap()), ("n2".to_owned(), "n1".to_owned()));
}

#[tokio::test]
async fn a_rotation_works_with_either_secret_on_either_side() {
    let (new, old) = (key(SECRET), key(OTHER));
    for (client, server) in [
        (vec![new, old], vec![old]),
        (vec![old], vec![new, old]),
        (vec![new, old], vec![new]),
        (vec![new], vec![new, old]),
        (vec![new, old], vec![old, new]),
    ] {
        let (c, s) = exchange(client.clone(), server.clone()).await;
        assert!(c.is_ok() && s.is_ok(), "{client:?} / {server:?}: {c:?} {s:?}");
    }
}

#[tokio::test]
async fn a_client_never_proves_itself_to_a_server_that_did_not_prove_the_secret() {
    // The server has another secret: the client stops after its Hello.
    let (c, s) = exchange(vec![key(SECRET)], vec![key(OTHER)]).await;
    assert!(matches!(c, Err(HandshakeError::BadProof)), "{c:?}");
    assert!(matches!(s, Err(HandshakeError::Io(_))), "the server got no proof: {s:?}");
    // The server has none at all.
    let (c, _) = exchange(vec![key(SECRET)], vec![]).await;
    assert!(matches!(c, Err(HandshakeError::NoProof)), "{c:?}");
    // A client without a secret does not get in.
    let (_, s) = exchange(vec![], vec![key(SECRET)]).await;
    assert!(matches!(s, Err(HandshakeError::NoProof)), "{s:?}");
}

/// A server-side reader of what the client sent, until the stream ends.
async fn drain(mut r: DuplexStream) -> Vec<u8> {
    let mut all = Vec::new();
    r.read_to_end(&mut all).await.unwrap();
    all
}

#[tokio::test]
async fn an_impostor_that_relays_a_real_servers_proof_gets_nothing_from_the_client() {
    // The impostor sits between a real client (exporter A, its connection
    // to the impostor) and a real server (exporter B): it forwards the
    // client's Hello to the server and the server's proof back.
    let (ex_a, ex_b) = ([0xa1; 32], [0xb2; 32]);
    let keys = vec![key(SECRET)];
    // Real server on connection B.
    let (mut imp_to_srv, mut srv_recv) = duplex(1024);
    let (mut srv_send, mut imp_from_srv) = duplex(1024);
    let server_keys = keys.clone();
    let srv = tokio::spawn(async move {
        server(&mut srv_send, &mut srv_recv, ex_b, &server_keys, "n2").await
    });
    // Real client on connection A.
    let (mut cli_send, imp_from_cli) = duplex(1024);
    let (mut imp_to_cli, mut cli_recv) = duplex(1024);
    let cli_keys = keys.clone();
    let cli = tokio::spawn(async move {
        let r = client(&mut cli_send, &mut cli_recv, ex_a, &cli_keys, "n1").await;
        drop(cli_send);
        r
    });
    let mut imp_from_cli = imp_from_cli;
    let hello: [u8; 40] = read_array(&mut imp_from_cli).await.unwrap();
    imp_to_srv.write_all(&hello).await.unwrap();
    let proof = read_proof(&mut imp_from_srv, Kind::ServerProof).await.unwrap();
    imp_to_cli.write_all(&encode_proof(Kind::ServerProof, &proof)).await.unwrap();
    let c = cli.await.unwrap();
    assert!(matches!(c, Err(HandshakeError::BadProof)), "{c:?}");
    // The client sent nothing after its Hello.
    assert!(drain(imp_from_cli).await.is_empty());
    drop(imp_to_srv);
    assert!(srv.await.unwrap().is_err());
}

#[tokio::test]
async fn a_proof_replayed_on_another_session_or_reflected_does_not_verify() {
    let k = vec![key(SECRET)];
    let b = binding();
    let client_mac = mac(&k[0], Role::Client, &b, "n1");
    // Same nonces, another TLS session.
    let other = Binding { exporter: [0x12; 32], ..b };
    assert!(matches!(
        verify(&k, Role::Client, &other, "n1", &[client_mac]),
        Err(HandshakeError::BadProof)
    ));
    // Another claimed id.
    assert!(verify(&k, Role::Client, &b, "n3", &[client_mac]).is_err());
    // A server's proof reflected as a client's.
    let server_mac = mac(&k[0], Role::Server, &b, "n1");
    assert!(verify(&k, Role::Client, &b, "n1", &[server_mac]).is_err());
    // Another nonce.
    let fresh = Binding { server_nonce: [0x34; 32], ..b };
    assert!(verify(&k, Role::Client, &fresh, "n1", &[client_mac]).is_err());
    assert_eq!(verify(&k, Role::Client, &b, "n1", &[[0; 32], client_mac]).unwrap(), 0);
}

#[tokio::test]
async fn the_old_static_tag_replayed_as_a_hello_is_refused() {
    // v1's Auth frame: an NRS1 header of type 10 and a 32-byte tag.
    let mut v1 =
        crate::frame::Header { kind: crate::frame::FrameType::Ping, request_id: 0, len: 32 }
            .encode()
            .to_vec();
    v1[5] = 10;
    v1.extend([0xee; 32]);
    let (mut c_send, mut s_recv) = duplex(1024);
    let (mut s_send, _c_recv) = duplex(1024);
    c_send.write_all(&v1).await.unwrap();
    let e = server(&mut s_send, &mut s_recv, [0; 32], &[key(SECRET)], "n2").await.unwrap_err();
    assert!(matches!(e, HandshakeError::Malformed(_)), "{e}");
}
