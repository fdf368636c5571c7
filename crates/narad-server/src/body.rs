//! Request bodies: read with a size cap enforced before buffering (the
//! declared `Content-Length` is checked first, then the bytes as they
//! arrive), optional decompression with a cap on the decompressed size, and
//! strict JSON decoding with Narad's error texts.

use std::io::Read;

use axum::body::Body;
use axum::http::HeaderMap;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use serde::Deserialize;

use crate::conn::BodyReadTimeout;
use crate::error::ApiError;
use crate::limits::ZSTD_WINDOW_LOG_MAX;
use crate::objects_only::ObjectsOnly;

/// Whether `E` is `e` or somewhere in its chain of sources.
fn caused_by<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<E>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Reads the whole body, refusing more than `limit` bytes with 413 (a
/// declared `Content-Length` over it before reading anything) and a body
/// slower than `http.read_timeout` with 408.
pub async fn read_limited<B>(headers: &HeaderMap, body: B, limit: usize) -> Result<Bytes, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    if let Some(len) = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(ApiError::too_large());
    }
    // Frame by frame rather than through `Limited` + `collect` (a buffer
    // list and two boxed layers per request): the usual body is one frame,
    // taken as it is.
    let mut body = std::pin::pin!(body);
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                let e: axum::BoxError = e.into();
                return Err(if caused_by::<BodyReadTimeout>(&*e) {
                    ApiError::body_timeout()
                } else {
                    ApiError::bad_request(format!("cannot read request body: {e}"))
                });
            }
        };
        let Ok(data) = frame.into_data() else { continue };
        total += data.len();
        if total > limit {
            return Err(ApiError::too_large());
        }
        if let Some(j) = &mut joined {
            j.extend_from_slice(&data);
        } else if first.is_empty() {
            first = data;
        } else if !data.is_empty() {
            let mut j = BytesMut::with_capacity(first.len() + data.len());
            j.extend_from_slice(&first);
            j.extend_from_slice(&data);
            joined = Some(j);
        }
    }
    Ok(joined.map_or(first, BytesMut::freeze))
}

/// Reads a JSON body that Narad streams into its decoder (users, attach):
/// more than `limit` bytes is a 400 `invalid json: http: request body too
/// large` rather than a 413; then [`strict_json`].
pub async fn read_streamed_json<T: for<'de> Deserialize<'de>>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = read_limited(headers, body, limit).await.map_err(|e| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::bad_request("invalid json: http: request body too large")
        } else {
            e
        }
    })?;
    strict_json(&bytes)
}

/// The request's `Content-Encoding`, if it has one that is text.
pub fn content_encoding(headers: &HeaderMap) -> Option<&str> {
    headers.get(axum::http::header::CONTENT_ENCODING).and_then(|v| v.to_str().ok())
}

/// Decodes a `Content-Encoding` of `gzip` or `zstd` (or none), refusing a
/// decompressed size above `limit` (413) without ever holding more.
pub fn decode_content(encoding: Option<&str>, raw: Bytes, limit: usize) -> Result<Bytes, ApiError> {
    let enc = encoding.map(|s| s.trim().to_ascii_lowercase());
    let reader: Box<dyn Read> = match enc.as_deref() {
        None | Some("") | Some("identity") => return Ok(raw),
        Some("gzip") => Box::new(flate2::read::GzDecoder::new(std::io::Cursor::new(raw))),
        Some("zstd") => {
            let bad = |e: std::io::Error| ApiError::bad_request(format!("invalid zstd body: {e}"));
            let mut d = zstd::stream::read::Decoder::new(std::io::Cursor::new(raw)).map_err(bad)?;
            // The decoder allocates the window a frame asks for (zstd allows
            // up to 128 MiB): no more than the batch body cap.
            d.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(bad)?;
            Box::new(d)
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!("unsupported Content-Encoding {other:?}")));
        }
    };
    let mut out = Vec::new();
    let n = reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| ApiError::bad_request(format!("invalid compressed body: {e}")))?;
    if n > limit {
        return Err(ApiError::too_large());
    }
    Ok(Bytes::from(out))
}

/// Decodes exactly one JSON value into `T`, refusing unknown fields and
/// trailing values with Narad's texts, and any struct (at any depth) that
/// is not written as a JSON object ([`ObjectsOnly`]): every JSON request
/// body goes through here.
pub fn strict_json<'de, T: Deserialize<'de>>(body: &'de [u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = T::deserialize(ObjectsOnly(&mut de))
        .map_err(|e| ApiError::bad_request(json_error_text(&e)))?;
    de.end().map_err(|_| ApiError::bad_request("invalid json: multiple JSON values"))?;
    Ok(value)
}

fn json_error_text(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    if let Some(rest) = msg.strip_prefix("unknown field `")
        && let Some(name) = rest.split('`').next()
    {
        return format!("invalid json: json: unknown field \"{name}\"");
    }
    if e.is_eof() && msg.starts_with("EOF while parsing a value") && e.column() == 0 {
        return "invalid json: EOF".into();
    }
    format!("invalid json: {msg}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct T {
        a: Option<i64>,
    }

    #[test]
    fn strict_json_refuses_unknown_fields_and_trailing_values_with_narads_texts() {
        let e = strict_json::<T>(br#"{"a":1,"x":2}"#).unwrap_err();
        assert!(
            matches!(e, ApiError::Json { ref message, .. } if message == "invalid json: json: unknown field \"x\""),
            "{e:?}"
        );
        let e = strict_json::<T>(br#"{"a":1} {"a":2}"#).unwrap_err();
        assert!(
            matches!(e, ApiError::Json { ref message, .. } if message == "invalid json: multiple JSON values"),
            "{e:?}"
        );
        assert!(strict_json::<T>(b" {\"a\":1}\n").is_ok());
    }

    /// A zstd frame may ask for a 128 MiB window, which the decoder would
    /// allocate before producing a byte: a 20-byte request body could make
    /// the server allocate 128 MiB. Windows are capped at what the body cap
    /// needs, so such a frame is a 400.
    #[test]
    fn zstd_windows_beyond_the_body_cap_are_refused_before_allocating() {
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 19).unwrap();
        e.set_parameter(zstd::zstd_safe::CParameter::WindowLog(27)).unwrap();
        e.set_pledged_src_size(None).unwrap();
        std::io::Write::write_all(&mut e, &vec![7u8; 4 << 20]).unwrap();
        let packed = Bytes::from(e.finish().unwrap());
        let err = decode_content(Some("zstd"), packed, 16 << 20).unwrap_err();
        assert_eq!(err.status(), 400, "{err:?}");
        // The default window of every standard level (≤ 19) still decodes.
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 19).unwrap();
        std::io::Write::write_all(&mut e, &vec![7u8; 4 << 20]).unwrap();
        let packed = Bytes::from(e.finish().unwrap());
        assert_eq!(decode_content(Some("zstd"), packed, 16 << 20).unwrap().len(), 4 << 20);
    }

    #[test]
    fn decompression_is_capped() {
        let data = vec![b'a'; 10_000];
        let packed = Bytes::from(zstd::encode_all(&data[..], 1).unwrap());
        assert_eq!(decode_content(Some("zstd"), packed.clone(), 10_000).unwrap().len(), 10_000);
        assert_eq!(decode_content(Some("zstd"), packed, 9_999).unwrap_err().status(), 413);
        let mut g = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut g, &data).unwrap();
        assert_eq!(
            decode_content(Some(" GZIP "), Bytes::from(g.finish().unwrap()), 20_000).unwrap().len(),
            10_000
        );
    }
}
