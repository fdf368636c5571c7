//! The message JSON consumers receive (SPEC §1.7), encoded by hand in a
//! fixed field order (here, not in the HTTP crate, because a forwarded
//! consume's answer, node RPC op 2, is this JSON too):
//! `{"topic","partition","offset",["key",]"payload",["payload_encoding":"base64",]"timestamp",["receipt_handle"]}`
//!
//! * `payload`: a body that is valid JSON is embedded verbatim (whitespace
//!   kept); else valid UTF-8 becomes a JSON string (Go escaping: `<`, `>`,
//!   `&`, U+2028 and U+2029 as `\uXXXX`); else standard padded base64,
//!   followed by `"payload_encoding":"base64"`.
//! * `key`: omitted when absent or empty; a UTF-8 key is a JSON string, any
//!   other key is base64 followed by `"key_encoding":"base64"`.
//! * `timestamp`: the owner's commit time, Unix seconds.

use std::fmt::Write as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// One message, ready to encode.
#[derive(Debug, Clone)]
pub struct MessageView<'a> {
    /// Topic name.
    pub topic: &'a str,
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// Key, if any.
    pub key: Option<&'a [u8]>,
    /// Payload bytes.
    pub payload: &'a [u8],
    /// Commit time, ms.
    pub commit_time_ms: u64,
    /// Receipt handle (queue mode only).
    pub receipt_handle: Option<&'a str>,
}

/// Bytes [`push_json_string`] cannot copy as they are: the ASCII it
/// escapes, and 0xE2, the first byte of U+2028 and U+2029.
const NEEDS_ESCAPE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t[b'<' as usize] = true;
    t[b'>' as usize] = true;
    t[b'&' as usize] = true;
    t[0xE2] = true;
    t
};

/// Appends `s` as a JSON string with Go's escaping (`<`, `>`, `&`, U+2028
/// and U+2029 too). Runs of bytes that need nothing are copied whole: a
/// consumed payload is mostly such a run.
pub fn push_json_string(out: &mut String, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push('"');
    let mut run = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if !NEEDS_ESCAPE[b as usize] {
            i += 1;
            continue;
        }
        // `run..i` ends before an ASCII byte or a lead byte: a char boundary.
        out.push_str(&s[run..i]);
        let mut len = 1;
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            b'<' => out.push_str("\\u003c"),
            b'>' => out.push_str("\\u003e"),
            b'&' => out.push_str("\\u0026"),
            0xE2 => {
                len = 3; // every char starting with 0xE2 is three bytes
                match &bytes[i..i + 3] {
                    [_, 0x80, 0xA8] => out.push_str("\\u2028"),
                    [_, 0x80, 0xA9] => out.push_str("\\u2029"),
                    _ => out.push_str(&s[i..i + 3]),
                }
            }
            c => {
                let _ = write!(out, "\\u{c:04x}");
            }
        }
        i += len;
        run = i;
    }
    out.push_str(&s[run..]);
    out.push('"');
}

/// Whether `b` is one valid JSON value (surrounding whitespace allowed).
pub fn is_json(b: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
}

/// Encodes one message object (no trailing newline).
pub fn encode_message(out: &mut String, m: &MessageView<'_>) {
    out.push_str("{\"topic\":");
    push_json_string(out, m.topic);
    let _ = write!(out, ",\"partition\":{},\"offset\":{}", m.partition, m.offset);
    if let Some(key) = m.key.filter(|k| !k.is_empty()) {
        out.push_str(",\"key\":");
        match std::str::from_utf8(key) {
            Ok(s) => push_json_string(out, s),
            Err(_) => {
                out.push('"');
                out.push_str(&STANDARD.encode(key));
                out.push_str("\",\"key_encoding\":\"base64\"");
            }
        }
    }
    out.push_str(",\"payload\":");
    if is_json(m.payload) {
        // Valid JSON is valid UTF-8.
        out.push_str(std::str::from_utf8(m.payload).unwrap_or("null"));
    } else if let Ok(s) = std::str::from_utf8(m.payload) {
        push_json_string(out, s);
    } else {
        out.push('"');
        out.push_str(&STANDARD.encode(m.payload));
        out.push_str("\",\"payload_encoding\":\"base64\"");
    }
    let _ = write!(out, ",\"timestamp\":{}", m.commit_time_ms / 1000);
    if let Some(h) = m.receipt_handle {
        out.push_str(",\"receipt_handle\":");
        push_json_string(out, h);
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg<'a>(payload: &'a [u8], key: Option<&'a [u8]>, handle: Option<&'a str>) -> String {
        let mut s = String::new();
        encode_message(
            &mut s,
            &MessageView {
                topic: "orders",
                partition: 1,
                offset: 7,
                key,
                payload,
                commit_time_ms: 1_700_000_000_999,
                receipt_handle: handle,
            },
        );
        s
    }

    #[test]
    fn json_payloads_are_embedded_verbatim() {
        assert_eq!(
            msg(b"{\"a\": 1}", Some(b"k"), Some("1:7:3")),
            r#"{"topic":"orders","partition":1,"offset":7,"key":"k","payload":{"a": 1},"timestamp":1700000000,"receipt_handle":"1:7:3"}"#
        );
    }

    #[test]
    fn text_payloads_become_strings_with_go_escaping() {
        assert_eq!(
            msg(b"a<b>&\"c\"\n", None, None),
            r#"{"topic":"orders","partition":1,"offset":7,"payload":"a\u003cb\u003e\u0026\"c\"\n","timestamp":1700000000}"#
        );
    }

    /// The char-by-char form `push_json_string` had before it copied runs.
    fn escaped_char_by_char(s: &str) -> String {
        let mut out = String::from('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '<' => out.push_str("\\u003c"),
                '>' => out.push_str("\\u003e"),
                '&' => out.push_str("\\u0026"),
                '\u{2028}' => out.push_str("\\u2028"),
                '\u{2029}' => out.push_str("\\u2029"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    #[test]
    fn strings_are_escaped_like_go_and_round_trip() {
        let mut cases: Vec<String> =
            (0u32..0x80).map(|c| char::from_u32(c).unwrap().to_string()).collect();
        cases.extend(
            [
                "",
                "plain",
                "a<b>&\"c\"\n\\",
                "\u{2028}x\u{2029}",
                "\u{2027}\u{202a}\u{20ac}\u{2000}",
                "é→😀\u{7f}\u{80}",
                "end with escape\u{1f}",
                "\u{2028}",
                "mixed é\t\u{2029}&€",
            ]
            .map(String::from),
        );
        // Every char from U+2000 to U+2FFF starts with 0xE2.
        cases.push((0x2000u32..0x3000).filter_map(char::from_u32).collect());
        for s in &cases {
            let mut out = String::from("prefix");
            push_json_string(&mut out, s);
            assert_eq!(out["prefix".len()..], escaped_char_by_char(s), "{s:?}");
            assert_eq!(&serde_json::from_str::<String>(&out["prefix".len()..]).unwrap(), s);
        }
    }

    #[test]
    fn binary_payloads_are_base64_with_an_encoding_field() {
        assert_eq!(
            msg(&[0xff, 0x00, 0x01], Some(b""), None),
            r#"{"topic":"orders","partition":1,"offset":7,"payload":"/wAB","payload_encoding":"base64","timestamp":1700000000}"#
        );
    }

    #[test]
    fn binary_keys_are_base64_with_an_encoding_field() {
        let s = msg(b"1", Some(&[0xff]), None);
        assert!(s.contains(r#""key":"/w==","key_encoding":"base64""#), "{s}");
    }
}
