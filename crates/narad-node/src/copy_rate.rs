//! The copy-rate limit of the moves a node runs as their destination
//! (`cluster.move_copy_rate`, bytes per second; 0 = none).
//!
//! A move's copy rounds read the source's segments as fast as the network
//! and both disks allow; on a loaded cluster that speed is taken from the
//! producers and consumers (on the test machine, a 4th node taking three
//! partitions at ~140 MB/s each cut the cluster's produce rate to 0.37×).
//! The limit is shared by every move to this node: each chunk a copy round
//! receives (RPC 23) books its length on a schedule that advances by
//! `len / rate` per chunk, and the round takes no further chunk until its
//! slot comes, so the node's moves together read at most `rate` bytes per
//! second on average (a round's few fetches in flight run at most that
//! many chunks ahead). The tail copied while the
//! source is frozen is not limited: commits to the partition wait for it
//! (the freeze window), and it is at most a few MiB.
//!
//! Invariant: after `admit(n)` returns for chunks n₁ … n_k (from any
//! number of tasks), at least `(n₁ + … + n_{k-1}) / rate` seconds have
//! passed since the first of them was admitted.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A byte-rate schedule (see the module docs).
#[derive(Debug)]
pub struct CopyRate {
    bytes_per_sec: u64,
    /// When the next chunk may start (None: nothing admitted yet).
    next: Mutex<Option<Instant>>,
}

impl CopyRate {
    /// A limit of `bytes_per_sec` (0: no limit).
    pub fn new(bytes_per_sec: u64) -> CopyRate {
        CopyRate { bytes_per_sec, next: Mutex::new(None) }
    }

    /// Waits until `n` more bytes may be fetched; returns how long it
    /// waited.
    pub async fn admit(&self, n: u64) -> Duration {
        let Some(start) = self.reserve(n, Instant::now()) else { return Duration::ZERO };
        let now = Instant::now();
        if start <= now {
            return Duration::ZERO;
        }
        tokio::time::sleep_until(start).await;
        start - now
    }

    /// Books `n` bytes on the schedule at `now`: when they may start (None
    /// without a limit).
    fn reserve(&self, n: u64, now: Instant) -> Option<Instant> {
        if self.bytes_per_sec == 0 {
            return None;
        }
        let cost = Duration::from_secs_f64(n as f64 / self.bytes_per_sec as f64);
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        // An idle schedule does not bank credit: a copy that starts after a
        // pause is paced from now.
        let start = next.map_or(now, |t| t.max(now));
        *next = Some(start + cost);
        Some(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[tokio::test(start_paused = true)]
    async fn moves_to_one_node_together_read_no_faster_than_its_rate() {
        let rate = std::sync::Arc::new(CopyRate::new(4 * MIB));
        let t0 = Instant::now();
        // Two moves, 8 chunks of 1 MiB each: 16 MiB at 4 MiB/s.
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let rate = rate.clone();
                tokio::spawn(async move {
                    for _ in 0..8 {
                        rate.admit(MIB).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        // The 16th chunk starts once 15 MiB are booked: 3.75 s.
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(3_750), "{took:?}");
        assert!(took < Duration::from_millis(4_000), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_limit_nothing_waits() {
        let rate = CopyRate::new(0);
        let t0 = Instant::now();
        for _ in 0..1_000 {
            assert_eq!(rate.admit(MIB).await, Duration::ZERO);
        }
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_schedule_banks_no_credit() {
        let rate = CopyRate::new(MIB);
        rate.admit(MIB).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        // One free chunk after the pause, then the rate again.
        assert_eq!(rate.admit(MIB).await, Duration::ZERO);
        assert_eq!(rate.admit(MIB).await, Duration::from_secs(1));
    }
}
