//! Golden bytes of the `NRS1` frame and every malformed header.

use super::*;

/// Checked-in bytes of a NodeRequest, request id 0x0102030405060708,
/// payload "hi".
const GOLDEN_REQUEST: &[u8] = &[
    b'N', b'R', b'S', b'1', // magic
    0x01, // version
    0x08, // type NodeRequest
    0x00, 0x00, // reserved
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // request id
    0x00, 0x00, 0x00, 0x02, // len
    b'h', b'i',
];

/// Checked-in bytes of an Error frame, request id 7, message "no".
const GOLDEN_ERROR: &[u8] = &[
    b'N', b'R', b'S', b'1', 0x01, 0x03, 0x00, 0x00, //
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, //
    0x00, 0x00, 0x00, 0x04, // len
    0x00, 0x02, b'n', b'o', // u16 length + message
];

/// Checked-in bytes of an empty Ping, request id 1.
const GOLDEN_PING: &[u8] = &[
    b'N', b'R', b'S', b'1', 0x01, 0x04, 0x00, 0x00, //
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, //
    0x00, 0x00, 0x00, 0x00,
];

#[test]
fn golden_frames_encode_to_the_checked_in_bytes() {
    let req = Frame::new(FrameType::NodeRequest, 0x0102_0304_0506_0708, &b"hi"[..]);
    assert_eq!(req.encode().unwrap(), GOLDEN_REQUEST);
    assert_eq!(Frame::error(7, "no").encode().unwrap(), GOLDEN_ERROR);
    assert_eq!(Frame::new(FrameType::Ping, 1, Bytes::new()).encode().unwrap(), GOLDEN_PING);
}

#[test]
fn golden_bytes_decode_to_the_frames() {
    let (f, used) = Frame::decode(GOLDEN_REQUEST).unwrap();
    assert_eq!(used, GOLDEN_REQUEST.len());
    assert_eq!(
        (f.kind, f.request_id, &f.payload[..]),
        (FrameType::NodeRequest, 0x0102_0304_0506_0708, &b"hi"[..])
    );
    let (f, _) = Frame::decode(GOLDEN_ERROR).unwrap();
    assert_eq!((f.kind, f.request_id), (FrameType::Error, 7));
    assert_eq!(Frame::error_message(&f.payload).unwrap(), "no");
    let (f, _) = Frame::decode(GOLDEN_PING).unwrap();
    assert_eq!((f.kind, f.request_id, f.payload.len()), (FrameType::Ping, 1, 0));
}

#[test]
fn every_frame_type_round_trips_and_no_other_byte_is_a_type() {
    // 10, the per-stream Auth frame of narad-cluster-quic-v1, is no type now.
    let known = [3u8, 4, 5, 8, 9];
    for b in 0..=255u8 {
        match FrameType::from_u8(b) {
            Ok(t) => {
                assert!(known.contains(&b));
                assert_eq!(t as u8, b);
                let bytes = Frame::new(t, 9, &b"x"[..]).encode().unwrap();
                assert_eq!(Frame::decode(&bytes).unwrap().0.kind, t);
            }
            Err(e) => {
                assert!(!known.contains(&b));
                assert!(matches!(e, Error::BadFrameType(x) if x == b));
            }
        }
    }
}

fn with(at: usize, bytes: &[u8]) -> Vec<u8> {
    let mut v = GOLDEN_REQUEST.to_vec();
    v[at..at + bytes.len()].copy_from_slice(bytes);
    v
}

#[test]
fn malformed_headers_are_refused_with_what_is_wrong() {
    assert!(matches!(Frame::decode(&with(0, b"NRS2")), Err(Error::BadMagic(m)) if &m == b"NRS2"));
    assert!(matches!(Frame::decode(&with(4, &[2])), Err(Error::BadVersion(2))));
    assert!(matches!(Frame::decode(&with(4, &[0])), Err(Error::BadVersion(0))));
    assert!(matches!(Frame::decode(&with(5, &[7])), Err(Error::BadFrameType(7))));
    assert!(matches!(Frame::decode(&with(6, &[0, 1])), Err(Error::BadReserved(1))));
    assert!(matches!(Frame::decode(&with(6, &[0x80, 0])), Err(Error::BadReserved(0x8000))));
    let over = (FRAME_MAX_PAYLOAD as u32 + 1).to_be_bytes();
    assert!(
        matches!(Frame::decode(&with(16, &over)), Err(Error::FrameTooLarge { len, .. }) if len == FRAME_MAX_PAYLOAD as u64 + 1)
    );
    assert!(matches!(Frame::decode(&with(16, &[0xff; 4])), Err(Error::FrameTooLarge { .. })));
    // A payload of exactly the limit is legal (truncated here, not too large).
    let max = (FRAME_MAX_PAYLOAD as u32).to_be_bytes();
    assert!(matches!(
        Frame::decode(&with(16, &max)),
        Err(Error::Truncated { what: "frame payload", .. })
    ));
}

#[test]
fn every_truncation_is_refused() {
    for cut in 0..GOLDEN_REQUEST.len() {
        let e = Frame::decode(&GOLDEN_REQUEST[..cut]).unwrap_err();
        assert!(matches!(e, Error::Truncated { .. }), "cut {cut}: {e}");
    }
}

#[test]
fn error_payloads_are_checked() {
    assert!(matches!(Frame::error_message(&[0]), Err(Error::Truncated { .. })));
    assert!(matches!(Frame::error_message(&[0, 3, b'a']), Err(Error::Truncated { .. })));
    assert!(matches!(Frame::error_message(&[0, 1, b'a', b'b']), Err(Error::TrailingBytes(1))));
    assert!(matches!(Frame::error_message(&[0, 1, 0xff]), Err(Error::InvalidField { .. })));
    let long = "é".repeat(40_000);
    let f = Frame::error(1, &long);
    let msg = Frame::error_message(&f.payload).unwrap();
    assert!(msg.len() <= u16::MAX as usize && long.starts_with(&msg));
}

#[test]
fn an_oversized_payload_is_refused_on_write_and_nothing_is_written() {
    let f = Frame::new(FrameType::NodeRequest, 1, vec![0u8; FRAME_MAX_PAYLOAD + 1]);
    let mut out = Vec::new();
    assert!(matches!(f.encode_into(&mut out), Err(Error::FrameTooLarge { .. })));
    assert!(out.is_empty());
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let mut sink = Vec::new();
        assert!(matches!(write_frame(&mut sink, &f).await, Err(Error::FrameTooLarge { .. })));
        assert!(sink.is_empty());
        let ok = Frame::new(FrameType::NodeRequest, 1, vec![7u8; FRAME_MAX_PAYLOAD]);
        write_frame(&mut sink, &ok).await.unwrap();
        assert_eq!(sink.len(), FRAME_HEADER_LEN + FRAME_MAX_PAYLOAD);
    });
}

/// A reader that serves its bytes and then fails the test if read again:
/// proves `read_frame` refuses an oversized header before reading (or
/// allocating) a payload.
struct HeaderOnly(Vec<u8>, usize);

impl AsyncRead for HeaderOnly {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let at = self.1;
        assert!(at < self.0.len(), "read past the header");
        let n = buf.remaining().min(self.0.len() - at);
        buf.put_slice(&self.0[at..at + n]);
        self.1 += n;
        std::task::Poll::Ready(Ok(()))
    }
}

#[test]
fn read_frame_refuses_a_lying_length_before_reading_the_payload() {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let header = with(16, &[0xff; 4])[..FRAME_HEADER_LEN].to_vec();
        let e = read_frame(&mut HeaderOnly(header, 0)).await.unwrap_err();
        assert!(matches!(e, Error::FrameTooLarge { len: 0xffff_ffff, .. }), "{e}");
    });
}

#[test]
fn read_frame_reads_frames_and_tells_a_clean_end_from_a_cut() {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let mut two = GOLDEN_REQUEST.to_vec();
        two.extend_from_slice(GOLDEN_PING);
        let mut r = &two[..];
        assert_eq!(read_frame(&mut r).await.unwrap().unwrap().kind, FrameType::NodeRequest);
        assert_eq!(read_frame(&mut r).await.unwrap().unwrap().kind, FrameType::Ping);
        assert!(read_frame(&mut r).await.unwrap().is_none());
        for cut in 1..GOLDEN_REQUEST.len() {
            let mut r = &GOLDEN_REQUEST[..cut];
            assert!(matches!(read_frame(&mut r).await, Err(Error::Truncated { .. })), "cut {cut}");
        }
    });
}
