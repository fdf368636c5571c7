//! The configuration of one partition log.

use crate::error::LogError;
use crate::frame::Codec;
use crate::limits::{
    DEFAULT_CACHE_BYTES, DEFAULT_CACHE_FRAMES, DEFAULT_COMMIT_LINGER_US,
    DEFAULT_FRAME_TARGET_BYTES, DEFAULT_INDEX_STRIDE_BYTES, DEFAULT_RUNWAY_BYTES,
    DEFAULT_SEGMENT_BYTES, MAX_COMMIT_LINGER_US, MAX_FRAME_TARGET_BYTES, MAX_RUNWAY_BYTES,
    MAX_SEGMENT_BYTES, MAX_ZSTD_LEVEL, MIN_FRAME_TARGET_BYTES, MIN_INDEX_STRIDE_BYTES,
    MIN_SEGMENT_BYTES,
};

/// How much of the sealed segments [`PartitionLog::open`](crate::PartitionLog::open)
/// checks. The last segment is always fully checked (its tail decides the
/// high watermark).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SealedCheck {
    /// Every header and every CRC: damage anywhere fails the open (SPEC
    /// §5.5's walk). Reads every byte of the log on open.
    #[default]
    Full,
    /// Every header (offsets, sizes, structure) but no payload CRC: opening
    /// reads only what the header walk touches; a payload that went bad is
    /// found (and skipped) at read time instead.
    Headers,
}

/// The configuration of one partition log. Every field has a documented
/// default ([`LogConfig::default`]); [`LogConfig::validate`] refuses values
/// that cannot work instead of adjusting them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// Roll to a new segment when the next frame would take the active one
    /// past this size. Default 64 MiB; 256 B ..= 1 GiB.
    pub segment_bytes: u64,
    /// The codec for new frames. Default none.
    pub codec: Codec,
    /// A commit cycle's records are split into frames of at most this many
    /// uncompressed bytes (a single larger record gets a frame of its own).
    /// Default 1 MiB; 1 KiB ..= 128 MiB. The effective split point is also
    /// at most `segment_bytes`.
    pub frame_target_bytes: u64,
    /// Spacing of the in-memory sparse index, in file bytes. Default 64 KiB.
    pub index_stride_bytes: u64,
    /// Byte budget of the decoded-frame cache. Default 8 MiB; 0 disables it.
    pub cache_bytes: u64,
    /// Frame budget of the decoded-frame cache. Default 64.
    pub cache_frames: usize,
    /// How much of the sealed segments open checks. Default full.
    pub sealed_check: SealedCheck,
    /// The most a new commit-cycle leader waits, in µs, for the callers of
    /// the previous cycle to collect their outcomes (so that those who
    /// commit again at once join its cycle). Default 200; 0 disables;
    /// at most 10,000. Only applies when the previous cycle had other
    /// callers.
    pub commit_linger_us: u64,
    /// Zero-filled bytes kept written after the active segment's data, so
    /// that a commit cycle of one frame overwrites blocks the file already
    /// has and its fdatasync does not change the file's size (on ext4 and
    /// XFS that saves a journal commit per cycle). Topped up only by cycles
    /// of one frame of at most an eighth of it (32 KiB by default: bigger
    /// cycles are dominated by their own bytes, and every runway byte is
    /// written twice). At most the data already in the segment (a small
    /// segment at most doubles), never past `segment_bytes`; trimmed before
    /// the segment is sealed. Default 256 KiB; 0 disables; at most 16 MiB.
    pub runway_bytes: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            codec: Codec::None,
            frame_target_bytes: DEFAULT_FRAME_TARGET_BYTES,
            index_stride_bytes: DEFAULT_INDEX_STRIDE_BYTES,
            cache_bytes: DEFAULT_CACHE_BYTES,
            cache_frames: DEFAULT_CACHE_FRAMES,
            sealed_check: SealedCheck::Full,
            commit_linger_us: DEFAULT_COMMIT_LINGER_US,
            runway_bytes: DEFAULT_RUNWAY_BYTES,
        }
    }
}

impl LogConfig {
    /// Checks every field against its bounds.
    pub fn validate(&self) -> Result<(), LogError> {
        let bad = |msg: String| Err(LogError::InvalidConfig(msg));
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&self.segment_bytes) {
            return bad(format!(
                "segment_bytes {} is outside {MIN_SEGMENT_BYTES}..={MAX_SEGMENT_BYTES}",
                self.segment_bytes
            ));
        }
        if !(MIN_FRAME_TARGET_BYTES..=MAX_FRAME_TARGET_BYTES).contains(&self.frame_target_bytes) {
            return bad(format!(
                "frame_target_bytes {} is outside {MIN_FRAME_TARGET_BYTES}..={MAX_FRAME_TARGET_BYTES}",
                self.frame_target_bytes
            ));
        }
        if self.index_stride_bytes < MIN_INDEX_STRIDE_BYTES {
            return bad(format!(
                "index_stride_bytes {} is below {MIN_INDEX_STRIDE_BYTES}",
                self.index_stride_bytes
            ));
        }
        if self.commit_linger_us > MAX_COMMIT_LINGER_US {
            return bad(format!(
                "commit_linger_us {} is above {MAX_COMMIT_LINGER_US}",
                self.commit_linger_us
            ));
        }
        if self.runway_bytes > MAX_RUNWAY_BYTES {
            return bad(format!("runway_bytes {} is above {MAX_RUNWAY_BYTES}", self.runway_bytes));
        }
        if let Codec::Zstd { level } = self.codec
            && !(1..=MAX_ZSTD_LEVEL).contains(&level)
        {
            return bad(format!("zstd level {level} is outside 1..={MAX_ZSTD_LEVEL}"));
        }
        Ok(())
    }

    /// The split point actually used: the frame target, at most the segment
    /// size.
    pub(crate) fn effective_frame_target(&self) -> u64 {
        self.frame_target_bytes.min(self.segment_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_values_out_of_bounds_are_refused_not_adjusted() {
        assert!(LogConfig::default().validate().is_ok());
        let bad = [
            LogConfig { segment_bytes: MIN_SEGMENT_BYTES - 1, ..LogConfig::default() },
            LogConfig { segment_bytes: MAX_SEGMENT_BYTES + 1, ..LogConfig::default() },
            LogConfig { frame_target_bytes: MAX_FRAME_TARGET_BYTES + 1, ..LogConfig::default() },
            LogConfig { frame_target_bytes: MIN_FRAME_TARGET_BYTES - 1, ..LogConfig::default() },
            LogConfig { index_stride_bytes: MIN_INDEX_STRIDE_BYTES - 1, ..LogConfig::default() },
            LogConfig { codec: Codec::Zstd { level: 0 }, ..LogConfig::default() },
            LogConfig { codec: Codec::Zstd { level: MAX_ZSTD_LEVEL + 1 }, ..LogConfig::default() },
            LogConfig { commit_linger_us: MAX_COMMIT_LINGER_US + 1, ..LogConfig::default() },
            LogConfig { runway_bytes: MAX_RUNWAY_BYTES + 1, ..LogConfig::default() },
        ];
        for c in bad {
            assert!(matches!(c.validate(), Err(LogError::InvalidConfig(_))), "{c:?}");
        }
    }
}
