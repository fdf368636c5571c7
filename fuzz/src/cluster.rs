//! The fuzz checks of node RPC's decoders (crates/narad-cluster): the
//! `NRS1` frame, the request encodings, the reply encoding and the JSON
//! payloads of the control plane's ops (29-32).
//!
//! Kept apart from `lib.rs` (which the HTTP server's tests include and
//! which must not need narad-cluster): the cargo-fuzz targets include this
//! file by path, and `crates/narad-cluster/tests/bad_input.rs` runs the
//! same checks over the corpora `fuzz/corpus/node_rpc_*/` under `cargo
//! test`. Every format here is canonical: what decodes re-encodes to the
//! same bytes, and every failure is a request error (400).

use narad_cluster::frame::{Frame, FrameType, Header};
use narad_cluster::limits::{FRAME_HEADER_LEN, FRAME_MAX_PAYLOAD};
use narad_cluster::raft::network::ControlPayload;
use narad_cluster::rpc::{Reply, Request};

/// One check: feeds one input to a decoder; panics only on a bug.
pub type Check = fn(&[u8]);

/// Every check, by target name.
pub const CHECKS: &[(&str, Check)] = &[
    ("node_rpc_frame", node_rpc_frame),
    ("node_rpc_request", node_rpc_request),
    ("node_rpc_reply", node_rpc_reply),
    ("control_rpc_payload", control_rpc_payload),
];

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
