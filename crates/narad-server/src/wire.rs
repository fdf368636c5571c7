//! The message JSON consumers receive (SPEC §1.7), as the OpenAPI document
//! shows it ([`MessageDoc`], [`MessagesDoc`], [`ConsumeReply`]). The
//! encoder itself ([`encode_message`], [`push_json_string`]) is
//! narad-node's `wire`, re-exported here: a consume forwarded to another
//! node (node RPC op 2) answers with the same JSON.

pub use narad_node::wire::{MessageView, encode_message, is_json, push_json_string};
use serde::Deserialize;
use utoipa::ToSchema;

/// A message as consumers receive it: the shape [`encode_message`] writes,
/// for the OpenAPI document (a test decodes encoded messages into it).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Message)]
pub struct MessageDoc {
    /// Topic name.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Offset in the partition.
    pub offset: u64,
    /// The key (absent when the message has none).
    pub key: Option<String>,
    /// `base64` when the key is not UTF-8.
    pub key_encoding: Option<String>,
    /// The payload: JSON as produced, else a string (base64 with
    /// `payload_encoding`).
    #[schema(value_type = Value)]
    pub payload: serde_json::Value,
    /// `base64` when the payload is neither JSON nor UTF-8.
    pub payload_encoding: Option<String>,
    /// Commit time, Unix seconds.
    pub timestamp: u64,
    /// Present in queue mode: ack, extend or nack with it.
    pub receipt_handle: Option<String>,
}

/// A consume with `max=`: a batch of messages.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Messages)]
pub struct MessagesDoc {
    /// The messages, at least one.
    pub messages: Vec<MessageDoc>,
}

/// What a consume answers with 200: one message, or a batch with `max=`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ConsumeReply {
    /// Without `max=`.
    One(MessageDoc),
    /// With `max=`.
    Batch(MessagesDoc),
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
    fn every_encoded_message_is_valid_json_of_the_documented_shape() {
        for p in [&b"{}"[..], b"plain", b"\x80\x81", b"  [1, 2] \n", b"\"str\"", b"nul\x00l"] {
            for key in [None, Some(&b"k\x01"[..]), Some(&[0xff][..])] {
                let s = msg(p, key, Some("0:0:1"));
                serde_json::from_str::<MessageDoc>(&s).unwrap_or_else(|e| panic!("{s}: {e}"));
            }
        }
    }
}
