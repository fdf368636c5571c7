//! The fuzz checks: one function per decoder of bytes narad did not write
//! itself in this process (requests, query strings, files on disk).
//!
//! Each check feeds its input to the decoder and asserts what must hold
//! for *any* input: the decoder returns (no panic, no allocation beyond
//! what the input justifies), a failure is a clean `Err` of the expected
//! kind (an HTTP 400 or 413, never a 5xx), and what decodes re-encodes to
//! the same bytes where the format is canonical. A panic here is a bug.
//!
//! The same file runs two ways: as the `cargo fuzz` targets of
//! `fuzz/fuzz_targets/` (`cargo +nightly fuzz run <name>`), and, over the
//! checked-in corpora `fuzz/corpus/<name>/` plus seeded mutations, inside
//! `cargo test` (`crates/narad-server/tests/bad_input.rs`).

use std::io;

use bytes::Bytes;
use narad_log::frame::{self, FrameHeader};
use narad_log::limits::FRAME_HEADER_LEN;
use narad_server::error::ApiError;

/// One check: feeds one input to a decoder; panics only on a bug.
pub type Check = fn(&[u8]);

/// Every check, by target name.
pub const CHECKS: &[(&str, Check)] = &[
    ("wal_record", wal_record),
    ("wal_segment", wal_segment),
    ("log_frame", log_frame),
    ("log_envelope", log_envelope),
    ("log_segment", log_segment),
    ("batch_body", batch_body),
    ("receipt_handle", receipt_handle),
    ("query_params", query_params),
    ("go_duration", go_duration),
];

/// A request-parsing failure must be a client error.
fn client_error(e: &ApiError, allowed: &[u16]) {
    let status = e.status().as_u16();
    assert!(allowed.contains(&status), "bad input answered {status}: {e:?}");
}

/// An ingress WAL record (and the frame and segment headers around it).
/// What decodes re-encodes to exactly the input: the format is canonical.
pub fn wal_record(data: &[u8]) {
    let _ = narad_wal::frame::FrameHeader::parse(data);
    let _ = narad_wal::frame::check_segment_header(data, 0);
    let bytes = Bytes::copy_from_slice(data);
    let Ok(r) = narad_wal::record::decode(7, &bytes) else { return };
    let again = narad_wal::RecordRef {
        topic: r.topic(),
        incarnation: r.incarnation,
        key: r.key.as_deref(),
        partition: r.partition,
        accepted_at_ms: r.accepted_at_ms,
        payload: &r.payload,
    };
    let len = again.encoded_len().expect("a decoded record is encodable");
    assert_eq!(len as usize, data.len(), "encoded length of a decoded record");
    let mut out = Vec::with_capacity(data.len());
    again.encode_into(&mut out);
    assert_eq!(out, data, "a decoded WAL record re-encodes to its bytes");
}

/// A whole ingress WAL segment image, as opening the WAL judges it. The
/// first input byte picks sealed or last segment.
pub fn wal_segment(data: &[u8]) {
    let Some((&mode, image)) = data.split_first() else { return };
    let image = Bytes::copy_from_slice(image);
    let last = mode & 1 == 1;
    match narad_wal::recovery::verdict(&image, 0, last) {
        Ok(keep) => assert!(
            keep <= image.len() as u64 || keep == narad_wal::limits::SEGMENT_HEADER_BYTES,
            "keeps {keep} of {} bytes",
            image.len()
        ),
        Err(at) => assert!(at <= image.len() as u64, "fails at {at} of {} bytes", image.len()),
    }
}

/// The salt of the salted frames and segments of the log fuzz targets.
pub const FUZZ_SALT: u64 = 0x5eed_5a17_0000_0042;

/// A partition-log frame. The first byte picks how the rest is used:
/// * bit 2: the frame is sealed with the seed of [`FUZZ_SALT`] (else
///   unsalted, as in a format 1 segment);
/// * bit 7 set: the rest is a frame payload (first byte the record count),
///   encoded as a real frame (bit 0: zstd), so the fuzzer reaches the
///   record split and the envelopes behind a valid CRC;
/// * else the rest is a frame; bit 0 makes its size fields match its
///   length, bit 1 recomputes its CRC (so mutations get past both).
pub fn log_frame(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let seed = if mode & 4 == 4 {
        frame::FrameSeed::of_salt(FUZZ_SALT)
    } else {
        frame::FrameSeed::UNSALTED
    };
    let bytes = if mode & 0x80 != 0 {
        let Some((&count, payload)) = rest.split_first() else { return };
        let codec = if mode & 1 == 1 {
            narad_log::Codec::Zstd { level: 1 }
        } else {
            narad_log::Codec::None
        };
        match frame::encode_frame(42, u32::from(count), payload, codec, seed) {
            Ok(f) => f,
            Err(_) => return,
        }
    } else {
        let mut f = rest.to_vec();
        if f.len() >= FRAME_HEADER_LEN {
            let stored = ((f.len() - FRAME_HEADER_LEN) as u32).to_be_bytes();
            if mode & 1 == 1 {
                f[19..23].copy_from_slice(&stored);
                if f[2] & 0x07 == 0 {
                    f[15..19].copy_from_slice(&stored);
                }
            }
            if mode & 2 == 2 {
                let header: [u8; FRAME_HEADER_LEN] =
                    f[..FRAME_HEADER_LEN].try_into().expect("header length");
                let crc =
                    crc32c::crc32c_append(frame::crc_start(seed, &header), &f[FRAME_HEADER_LEN..]);
                f[23..27].copy_from_slice(&crc.to_be_bytes());
            }
        }
        f
    };
    if let Some(h) = bytes.get(..FRAME_HEADER_LEN) {
        let _ = FrameHeader::parse(h.try_into().expect("header length"));
    }
    let Ok(h) = frame::verify_frame(&bytes, seed) else { return };
    // Sealed with one seed, a frame fails with the other (but for a
    // 2^-32 chance per input, which the fuzzer would have to find).
    let other = if mode & 4 == 4 {
        frame::FrameSeed::UNSALTED
    } else {
        frame::FrameSeed::of_salt(FUZZ_SALT)
    };
    assert!(frame::verify_frame(&bytes, other).is_err(), "a frame checks under both seeds");
    let stored = Bytes::copy_from_slice(&bytes[FRAME_HEADER_LEN..]);
    let records = frame::decode_records(&h, stored.clone());
    let bounds = frame::commit_time_bounds(&h, stored);
    if let Ok(records) = records {
        assert_eq!(records.len() as u64, u64::from(h.count), "records of a decoded frame");
        let first = records.first().expect("a frame has records").commit_time_ms;
        let last = records.last().expect("a frame has records").commit_time_ms;
        assert_eq!(bounds, Ok((first, last)), "commit time bounds agree with the records");
    }
}

/// A partition-log record envelope. Decode and the commit-time-only read
/// agree; a version-3 envelope re-encodes to its bytes.
pub fn log_envelope(data: &[u8]) {
    let bytes = Bytes::copy_from_slice(data);
    let full = narad_log::envelope::decode(&bytes);
    let time = narad_log::envelope::commit_time_of(data);
    match &full {
        Ok(e) => assert_eq!(time, Ok(e.commit_time_ms), "commit_time_of agrees with decode"),
        Err(_) => assert!(time.is_err() || data.first() == Some(&0x02), "{time:?} vs {full:?}"),
    }
    let Ok(e) = full else { return };
    if data[0] == narad_log::envelope::ENVELOPE_VERSION {
        let mut out = Vec::with_capacity(data.len());
        narad_log::envelope::encode_into(&mut out, e.key.as_deref(), e.commit_time_ms, &e.payload);
        assert_eq!(out, data, "a version-3 envelope re-encodes to its bytes");
    }
}

/// An in-memory file for the segment scan.
#[derive(Debug)]
struct MemFile(Vec<u8>);

impl narad_fs::File for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(self.0.len());
        let n = buf.len().min(self.0.len() - start);
        buf[..n].copy_from_slice(&self.0[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&self, _: &[u8], _: u64) -> io::Result<()> {
        Err(io::Error::other("read-only"))
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.len() as u64)
    }

    fn set_len(&self, _: u64) -> io::Result<()> {
        Err(io::Error::other("read-only"))
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
}

/// A whole partition-log segment (base offset 42), walked as opening a log
/// does. The first byte: bit 0 checks CRCs; bit 1 puts a valid format 2
/// header salted with [`FUZZ_SALT`] in front of the rest (so the fuzzer
/// reaches the salted frames behind it).
pub fn log_segment(data: &[u8]) {
    let Some((&mode, image)) = data.split_first() else { return };
    let mut bytes = Vec::with_capacity(image.len() + 32);
    if mode & 2 == 2 {
        bytes.extend_from_slice(&narad_log::segment::segment_header(42, FUZZ_SALT));
    }
    bytes.extend_from_slice(image);
    let file = MemFile(bytes);
    let scan = narad_log::segment::scan_segment(&file, 42, mode & 1 == 1, 1 << 10)
        .expect("an in-memory file reads");
    assert!(scan.good_len <= scan.file_len, "{scan:?}");
    assert!(scan.next_offset >= 42, "{scan:?}");
    if let Some(f) = scan.format {
        assert!(scan.good_len >= f.frames_start(), "{scan:?}");
    } else {
        assert_eq!((scan.good_len, scan.frames), (0, 0), "{scan:?}");
    }
    match &scan.defect {
        None => assert_eq!(scan.good_len, scan.file_len, "no defect means every byte is good"),
        Some(d) => {
            assert_eq!(d.pos, scan.good_len, "the defect is where the good frames end");
            if let Some(after) = d.valid_frame_after {
                assert!(after > d.pos && after < scan.file_len, "{d:?}");
            }
        }
    }
}

/// A batch produce body. The first byte picks the `Content-Encoding`:
/// 0 none, 1 `gzip`, 2 `zstd` (the rest sent as is: the fuzzer attacks the
/// decompressors), 3 and 4 the rest compressed with gzip or zstd first (the
/// fuzzer attacks the JSON behind a valid compression), else an unknown
/// encoding.
pub fn batch_body(data: &[u8]) {
    use std::io::Write;
    let Some((&mode, rest)) = data.split_first() else { return };
    let (encoding, body) = match mode {
        0 => (None, rest.to_vec()),
        1 => (Some("gzip"), rest.to_vec()),
        2 => (Some("zstd"), rest.to_vec()),
        3 => {
            let mut g = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            g.write_all(rest).expect("in memory");
            (Some("gzip"), g.finish().expect("in memory"))
        }
        4 => (Some("zstd"), zstd::encode_all(rest, 1).expect("in memory")),
        _ => (Some("br"), rest.to_vec()),
    };
    match narad_server::routes::produce::decode_batch(encoding, Bytes::from(body)) {
        Ok(records) => {
            // Only objects decode: the body, and each of its messages (a
            // `Value` refuses numbers out of range that a payload may hold).
            if matches!(mode, 0 | 3 | 4)
                && let Ok(v) = serde_json::from_slice::<serde_json::Value>(rest)
            {
                let messages = v.get("messages").and_then(|m| m.as_array());
                assert!(v.is_object() && messages.is_some(), "a non-object body decoded");
                assert!(
                    messages.into_iter().flatten().all(|m| m.is_object()),
                    "a non-object message decoded"
                );
            }
            let max = narad_server::limits::BATCH_MAX_RECORDS;
            assert!((1..=max).contains(&records.len()), "{} records", records.len());
            assert!(records.iter().all(|r| !r.payload.is_empty()), "an empty payload passed");
            assert!(
                records.iter().all(|r| r.key.as_ref().is_none_or(|k| !k.is_empty())),
                "an empty key is no key"
            );
        }
        Err(e) => client_error(&e, &[400, 413]),
    }
}

/// A receipt handle `partition:offset:nonce`: what parses formats back to
/// an equal handle, and a canonical handle formats to itself.
pub fn receipt_handle(data: &[u8]) {
    use narad_broker::consume::shard::{parse_receipt_handle, receipt_handle};
    let text = String::from_utf8_lossy(data);
    let Some((p, o, n)) = parse_receipt_handle(&text) else { return };
    assert!(n >= 1, "nonce 0 parsed");
    let formatted = receipt_handle(p, o, n);
    assert_eq!(parse_receipt_handle(&formatted), Some((p, o, n)), "{formatted}");
    let canonical = text.split(':').all(|d| d == "0" || !d.starts_with('0'));
    if canonical {
        assert_eq!(formatted, text, "a canonical handle formats to itself");
    }
}

/// Every query-string parser of the API, on the same string: each either
/// parses or answers 400.
pub fn query_params(data: &[u8]) {
    use narad_server::routes::{consume, produce, topics};
    let raw = String::from_utf8_lossy(data);
    let pairs = narad_server::query::pairs(&raw);
    for (_, value) in &pairs {
        // Values stay raw (their `%26` is not yet an `&`), split at `&`.
        assert!(!value.contains('&'), "{value:?}");
        let _ = narad_server::query::decode_component(value);
    }
    if let Err(e) = produce::parse_produce_query(&raw) {
        client_error(&e, &[400]);
    }
    match consume::parse_consume_query(&raw) {
        Ok(q) => {
            assert!(q.offset.is_none() || q.partition.is_some(), "replay without partition");
            assert!(q.offset.is_none() || q.max.is_none(), "replay with max");
            let max = narad_broker::limits::CONSUME_BATCH_MAX;
            assert!(q.max.is_none_or(|m| (1..=max).contains(&m)), "{q:?}");
        }
        Err(e) => client_error(&e, &[400]),
    }
    match consume::parse_ack_query(&raw) {
        Ok((handle, _)) => assert!(handle.is_none_or(|h| !h.is_empty()), "empty handle"),
        Err(e) => client_error(&e, &[400]),
    }
    match topics::parse_list_query(&raw) {
        Ok((limit, _)) => assert!((1..=1000).contains(&limit), "limit {limit}"),
        Err(e) => client_error(&e, &[400]),
    }
    if let Err(e) = topics::parse_details_query(&raw) {
        client_error(&e, &[400]);
    }
    let _ = narad_meta::parse_list_limit(Some(&raw));
}

/// A Go duration (`wait=`): parses or errs; a whole number of
/// milliseconds formats and parses back to itself.
pub fn go_duration(data: &[u8]) {
    use narad_server::config::format_duration;
    use narad_server::duration::parse_go_duration;
    let text = String::from_utf8_lossy(data);
    let Ok(d) = parse_go_duration(&text) else { return };
    if d.subsec_nanos() % 1_000_000 == 0 {
        assert_eq!(parse_go_duration(&format_duration(d)), Ok(d), "{text:?} -> {d:?}");
    }
}
