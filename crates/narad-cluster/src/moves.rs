//! The answers of the partition-move RPCs (SPEC §7.3): ListPartitionSegments
//! (22) answers a [`SegmentsBody`], PrepareHandoff (24) a [`FrozenBody`],
//! both JSON; FetchSegmentChunk (23) answers raw bytes. Decoded by the
//! destination's copier, encoded by the source: one type for both sides.

use serde::{Deserialize, Serialize};

/// One segment of the source's partition log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentBody {
    /// The offset of its first record.
    pub base: u64,
    /// Bytes of header and verified frames (what a copy takes).
    pub len: u64,
    /// The offset after its last verified record.
    pub end_offset: u64,
}

/// RPC 22's answer: the source's partition as a copy starts from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentsBody {
    /// The offset after the last committed record.
    pub high_watermark: u64,
    /// The oldest offset retention kept.
    pub oldest: u64,
    /// Oldest first.
    pub segments: Vec<SegmentBody>,
}

impl SegmentsBody {
    /// Bytes of all segments: how far a copy holding `copied` bytes is
    /// behind is `total_len() - copied`.
    pub fn total_len(&self) -> u64 {
        self.segments.iter().map(|s| s.len).sum()
    }
}

/// RPC 24's answer: the source at rest, final while it stays frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrozenBody {
    /// The offset after the last committed record.
    pub high_watermark: u64,
    /// The last offset up to which every record is acked (`null`: none).
    pub consumer_frontier: Option<u64>,
    /// The fan-out cursors of a parent partition, as their files stood at
    /// the freeze (absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fanout_cursors: Vec<CursorBody>,
}

/// One fan-out cursor of a moving parent partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CursorBody {
    /// The attachment's epoch.
    pub epoch: u64,
    /// The next parent offset the child's cursor sends.
    pub next_offset: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn move_answers_encode_to_their_golden_json_and_decode_back() {
        let segments = SegmentsBody {
            high_watermark: 350,
            oldest: 17,
            segments: vec![
                SegmentBody { base: 17, len: 4090, end_offset: 200 },
                SegmentBody { base: 200, len: 1203, end_offset: 350 },
            ],
        };
        let json = r#"{"high_watermark":350,"oldest":17,"segments":[{"base":17,"len":4090,"end_offset":200},{"base":200,"len":1203,"end_offset":350}]}"#;
        assert_eq!(serde_json::to_string(&segments).unwrap(), json);
        assert_eq!(serde_json::from_str::<SegmentsBody>(json).unwrap(), segments);
        assert_eq!(segments.total_len(), 5293);
        let frozen = FrozenBody {
            high_watermark: 350,
            consumer_frontier: Some(9),
            fanout_cursors: vec![CursorBody { epoch: 0xab, next_offset: 340 }],
        };
        let json = r#"{"high_watermark":350,"consumer_frontier":9,"fanout_cursors":[{"epoch":171,"next_offset":340}]}"#;
        assert_eq!(serde_json::to_string(&frozen).unwrap(), json);
        assert_eq!(serde_json::from_str::<FrozenBody>(json).unwrap(), frozen);
        let none = r#"{"high_watermark":0,"consumer_frontier":null}"#;
        let frozen =
            FrozenBody { high_watermark: 0, consumer_frontier: None, fanout_cursors: Vec::new() };
        assert_eq!(serde_json::to_string(&frozen).unwrap(), none);
        assert!(serde_json::from_str::<FrozenBody>(r#"{"high_watermark":0,"x":1}"#).is_err());
    }
}
