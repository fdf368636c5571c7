//! Leasing from one partition: reserve an offset, then read it (SPEC §2.2).
//! A reservation whose record cannot be read is resolved as corrupt (the
//! queue never wedges on it); offsets retention removed are skipped in one
//! step. A read that fails with an I/O error gives its reservation back and
//! ends the take: what was leased before it is still answered (never left
//! leased behind an error), and the error is reported beside it.

use narad_log::{LogRecord, ReadError};
use tracing::warn;

use crate::consume::shard::ShardLimits;
use crate::error::BrokerError;
use crate::topics::PartitionRt;

/// A leased record.
#[derive(Debug, Clone)]
pub struct Leased {
    /// The record.
    pub record: LogRecord,
    /// Its lease nonce (for the receipt handle).
    pub nonce: u64,
}

/// What a take skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Reserved offsets that could not be read (counted corrupt).
    pub corrupt: u64,
    /// Offsets retention removed before they were consumed.
    pub dropped: u64,
}

/// What one take got.
#[derive(Debug, Default)]
pub struct Taken {
    /// Leased records, in offset order of their reservation.
    pub leased: Vec<Leased>,
    /// What was skipped.
    pub skipped: Skipped,
    /// Why the take stopped early, if it failed: the consumer state could
    /// not be loaded, or a read failed (its reservation was given back).
    /// `leased` is still valid: those leases are live.
    pub failed: Option<BrokerError>,
}

/// Leases up to `max` records (and about `max_bytes` of payload) from `part`.
pub fn take(
    topic: &str,
    part: &PartitionRt,
    limits: &ShardLimits,
    now_ms: u64,
    max: usize,
    max_bytes: usize,
) -> Taken {
    let mut taken = Taken::default();
    let mut guard = match part.shard() {
        Ok(g) => g,
        Err(e) => {
            taken.failed = Some(e);
            return taken;
        }
    };
    let shard = guard.as_mut().expect("shard() fills the slot");
    let mut bytes = 0usize;
    while taken.leased.len() < max && bytes < max_bytes {
        let hwm = part.log.high_watermark();
        let Some(res) = shard.reserve(hwm, now_ms, limits) else { break };
        match part.log.read(res.offset, 1, u64::MAX) {
            Ok(batch) => {
                match batch.records.into_iter().next().filter(|r| r.offset == res.offset) {
                    Some(record) => {
                        bytes += record.payload.len();
                        taken.leased.push(Leased { record, nonce: res.nonce });
                    }
                    None => {
                        shard.mark_corrupt(res.offset);
                        taken.skipped.corrupt += 1;
                        warn!(
                            topic,
                            partition = part.index,
                            offset = res.offset,
                            "skipped permanently-unreadable record"
                        );
                    }
                }
            }
            Err(ReadError::Gone { oldest, .. }) => {
                taken.skipped.dropped += shard.skip_below(oldest);
            }
            Err(e) => {
                // Not corruption (it may read later): give the lease back.
                let _ = shard.nack(res.offset, res.nonce, now_ms);
                taken.failed = Some(BrokerError::internal("consume", e));
                break;
            }
        }
    }
    taken
}
