//! The fuzz checks of the cluster's decoders (crates/narad-cluster and the
//! control plane's files): the connection handshake an unauthenticated
//! peer speaks (`NRH2`), node RPC's `NRS1` frame, the request
//! encodings, the reply encoding and the JSON payloads of the control
//! plane's ops (29-32); the values of the Raft log `raft.redb` (`NRAF`
//! records around openraft's JSON); the metastore snapshot (`NMSNAP01`)
//! that the control plane installs.
//!
//! Kept apart from `lib.rs` (which the HTTP server's tests include and
//! which must not need narad-cluster): the cargo-fuzz targets include this
//! file by path, and `crates/narad-cluster/tests/bad_input.rs` runs the
//! same checks over the corpora `fuzz/corpus/<target>/` under `cargo
//! test`. Node RPC's formats are canonical: what decodes re-encodes to the
//! same bytes, and every failure is a request error (400). The files' JSON
//! is not (whitespace, field order): what decodes re-encodes to bytes that
//! decode to the same value and are a fixed point.

use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;

use narad_cluster::frame::{Frame, FrameType, Header};
use narad_cluster::handshake::{self, HandshakeError, Kind};
use narad_cluster::limits::{FRAME_HEADER_LEN, FRAME_MAX_PAYLOAD};
use narad_cluster::raft::TypeConfig;
use narad_cluster::raft::log_store::{
    RECORD_HEADER_LEN, decode_entry, decode_record, decode_value, encode_record, encode_value,
};
use narad_cluster::raft::network::ControlPayload;
use narad_cluster::raft::types::{AppliedState, LogId, Vote};
use narad_cluster::rpc::{Reply, Request};
use narad_meta::{MetaStore, MetaStoreOptions, StorageError, TopicDefaults};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// One check: feeds one input to a decoder; panics only on a bug.
pub type Check = fn(&[u8]);

/// Every check, by target name.
pub const CHECKS: &[(&str, Check)] = &[
    ("node_rpc_handshake", node_rpc_handshake),
    ("node_rpc_frame", node_rpc_frame),
    ("node_rpc_request", node_rpc_request),
    ("node_rpc_reply", node_rpc_reply),
    ("control_rpc_payload", control_rpc_payload),
    ("raft_log_value", raft_log_value),
    ("meta_snapshot", meta_snapshot),
];

/// Polls a future over in-memory input once: a reader of a byte slice is
/// always ready, so it finishes at once.
fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("a reader of a byte slice returned Pending"),
    }
}

/// The handshake readers of `handshake.rs`, the ones that read what a peer
/// sends before it has authenticated: the first byte picks the message
/// (Hello, ServerProof, ClientProof, Welcome), the rest is what the peer
/// sent. A message decodes only from exactly its bytes (re-encoded, they
/// are what was consumed), and nothing else panics or reads past the
/// message's bound (171 bytes).
pub fn node_rpc_handshake(data: &[u8]) {
    let Some((&pick, sent)) = data.split_first() else { return };
    let mut rest = sent;
    let result: Result<Vec<u8>, HandshakeError> = match pick % 4 {
        0 => ready(handshake::read_hello(&mut rest)).map(|n| handshake::encode_hello(&n)),
        1 => ready(handshake::read_proof(&mut rest, Kind::ServerProof))
            .map(|p| handshake::encode_proof(Kind::ServerProof, &p)),
        2 => ready(handshake::read_proof(&mut rest, Kind::ClientProof))
            .map(|p| handshake::encode_proof(Kind::ClientProof, &p)),
        _ => {
            ready(handshake::read_welcome(&mut rest)).map(|()| handshake::encode_welcome().to_vec())
        }
    };
    let used = sent.len() - rest.len();
    assert!(used <= 171, "a handshake reader took {used} bytes");
    match result {
        Ok(encoded) => assert_eq!(encoded, &sent[..used]),
        Err(HandshakeError::Malformed(_) | HandshakeError::Io(_)) => {}
        Err(e) => panic!("a reader failed with {e}"),
    }
}

/// An `NRS1` frame (and an Error frame's message): the header's checks
/// agree with the frame decoder's, nothing longer than the limit decodes,
/// and a decoded frame re-encodes to the bytes it took.
pub fn node_rpc_frame(data: &[u8]) {
    let header = data.first_chunk::<FRAME_HEADER_LEN>().map(Header::decode);
    match Frame::decode(data) {
        Ok((f, used)) => {
            assert!(f.payload.len() <= FRAME_MAX_PAYLOAD);
            assert_eq!(used, FRAME_HEADER_LEN + f.payload.len());
            assert_eq!(f.encode().expect("a decoded frame encodes"), &data[..used]);
            assert!(matches!(header, Some(Ok(h)) if h.len as usize == f.payload.len()));
            if f.kind == FrameType::Error
                && let Ok(msg) = Frame::error_message(&f.payload)
            {
                assert_eq!(Frame::error(f.request_id, &msg), f);
            }
        }
        Err(e) => {
            assert_eq!(e.status(), 400, "{e}");
            if let Some(Ok(h)) = header {
                assert!(
                    data.len() - FRAME_HEADER_LEN < h.len as usize,
                    "valid header, enough bytes, still {e}"
                );
            }
        }
    }
}

/// A NodeRequest payload: decodes and re-encodes to the same bytes, or is
/// refused with 400 (an unknown op included).
pub fn node_rpc_request(data: &[u8]) {
    match Request::decode(data) {
        Ok(r) => assert_eq!(r.encode(), data, "{r:?}"),
        Err(e) => assert_eq!(e.status(), 400, "{e}"),
    }
}

/// A NodeReply payload: decodes and re-encodes to the same bytes, or is
/// refused.
pub fn node_rpc_reply(data: &[u8]) {
    match Reply::decode(data) {
        Ok(r) => assert_eq!(r.encode(), data),
        Err(e) => assert_eq!(e.status(), 400, "{e}"),
    }
}

/// A NodeRequest of the control plane (ProposeCommand, Raft AppendEntries,
/// Vote, InstallSnapshot): its JSON payload decodes or is refused (the
/// server answers 400); a decoded payload re-encodes to a request that
/// decodes to the same payload.
pub fn control_rpc_payload(data: &[u8]) {
    let Ok(request) = Request::decode(data) else { return };
    let Some(Ok(payload)) = ControlPayload::decode(&request) else { return };
    let again = payload.encode();
    let decoded = ControlPayload::decode(&again)
        .expect("a control request")
        .expect("a re-encoded payload decodes");
    assert_eq!(decoded.encode(), again, "{payload:?}");
}

/// A value of `raft.redb` as the log store reads it back: the `NRAF`
/// record, then its JSON (`log_store::decode_value`, `decode_entry`). The
/// first byte picks how the rest is used:
/// * bits 0-1, the value: 0 the format number, 1 the vote, 2 the last
///   purged log id, 3 a log entry, whose key (u64 BE) is the next 8 bytes;
/// * bit 7 set: the rest is a body, the harness builds the record around
///   it (length and CRC right), so mutations reach the JSON; clear: the
///   rest is the record as stored.
///
/// A record decodes, or is refused, before anything is parsed; a decoded
/// record re-encodes to its bytes (the record is canonical); a built one
/// always decodes. A decoded value re-encodes to a record that decodes to
/// the same value and re-encodes to itself; an entry holds its key's index.
pub fn raft_log_value(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let (key, rest) = if mode & 3 == 3 {
        let Some((key, rest)) = rest.split_first_chunk::<8>() else { return };
        (u64::from_be_bytes(*key), rest)
    } else {
        (0, rest)
    };
    let record = if mode & 0x80 != 0 { encode_record(rest) } else { rest.to_vec() };
    match decode_record(&record) {
        Ok(body) => {
            assert_eq!(body.len() + RECORD_HEADER_LEN, record.len());
            assert_eq!(encode_record(body), record, "a decoded record re-encodes to its bytes");
        }
        Err(e) => assert!(mode & 0x80 == 0, "a record built around a body is refused: {e}"),
    }
    match mode & 3 {
        0 => value_round_trips::<u64>("format", &record),
        1 => value_round_trips::<Vote>("vote", &record),
        2 => value_round_trips::<LogId>("purged", &record),
        _ => {
            let Ok(entry) = decode_entry::<TypeConfig>(key, &record) else { return };
            assert_eq!(entry.log_id.index, key, "an entry decoded under another key");
            let again = encode_value(&entry);
            let back = decode_entry::<TypeConfig>(key, &again).expect("a re-encoded entry decodes");
            assert_eq!(back, entry);
            assert_eq!(encode_value(&back), again, "a re-encoded entry is a fixed point");
        }
    }
}

fn value_round_trips<T>(what: &str, record: &[u8])
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let Ok(value) = decode_value::<T>(what, record) else { return };
    let again = encode_value(&value);
    let back: T = decode_value(what, &again).expect("a re-encoded value decodes");
    assert_eq!(back, value);
    assert_eq!(encode_value(&back), again, "a re-encoded {what} is a fixed point");
}

/// Bytes of a metastore snapshot before its body and after it.
const SNAPSHOT_HEADER_LEN: usize = 24;
const SNAPSHOT_CRC_LEN: usize = 4;

/// A metastore snapshot (`NMSNAP01`) as a follower installs it. The first
/// byte picks fix-ups of the rest: bit 0 makes the body length agree with
/// the input's length, bit 1 recomputes the CRC (so mutations reach the
/// JSON body and the state checks behind it).
///
/// `narad_meta::decode_snapshot` either refuses the bytes with
/// `BadSnapshot` or returns a state; the Raft state it carries decodes as
/// the control plane's `AppliedState` or is refused. A snapshot that
/// decodes installs (`MetaStore::install_snapshot`, on a fresh store on
/// `SimFs`) and then holds exactly that state; what it exports decodes to
/// the same, and installs and exports back identically.
pub fn meta_snapshot(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut bytes = rest.to_vec();
    if bytes.len() >= SNAPSHOT_HEADER_LEN + SNAPSHOT_CRC_LEN {
        if mode & 1 == 1 {
            let raft_len = u64::from(u32::from_be_bytes(bytes[12..16].try_into().expect("4")));
            let room = (bytes.len() - SNAPSHOT_HEADER_LEN - SNAPSHOT_CRC_LEN) as u64;
            bytes[16..24].copy_from_slice(&room.saturating_sub(raft_len).to_be_bytes());
        }
        if mode & 2 == 2 {
            let n = bytes.len() - SNAPSHOT_CRC_LEN;
            let crc = crc32c::crc32c(&bytes[..n]);
            bytes[n..].copy_from_slice(&crc.to_be_bytes());
        }
    }
    let (state, raft) = match narad_meta::decode_snapshot(&bytes) {
        Ok(decoded) => decoded,
        Err(StorageError::BadSnapshot(_)) => return,
        Err(e) => panic!("a snapshot refused with {e:?}, not BadSnapshot"),
    };
    if let Some(raft) = &raft {
        let _ = AppliedState::decode(raft);
    }
    let fs = narad_fs::SimFs::new(1);
    let options = MetaStoreOptions {
        defaults: TopicDefaults::default(),
        clock: Arc::new(narad_clock::ManualClock::new(1_700_000_000_000)),
        rng_seed: Some(1),
    };
    let store = MetaStore::open(&fs, Path::new("/data"), options).expect("a fresh store opens");
    store.install_snapshot(&fs, &bytes).expect("a snapshot that decodes installs");
    assert_eq!(*store.snapshot(), state, "the installed state is the decoded one");
    assert_eq!(store.raft_state(), raft, "the installed Raft state is the decoded one");
    let exported = store.export_snapshot().expect("an installed store exports");
    let (again, again_raft) =
        narad_meta::decode_snapshot(&exported).expect("an exported snapshot decodes");
    assert_eq!((again, again_raft), (state, raft), "the export holds what was installed");
    store.install_snapshot(&fs, &exported).expect("an exported snapshot installs");
    let twice = store.export_snapshot().expect("a reinstalled store exports");
    assert_eq!(twice, exported, "an exported snapshot installs and exports back identically");
}
