//! The consume path: [`Delivered`], [`AckAction`], leasing
//! ([`Broker::consume`], [`Broker::consume_in_order`]), long polls
//! ([`Broker::wait_ready`]), reading without a lease ([`Broker::replay`])
//! and settling a lease ([`Broker::resolve`]). The leases themselves live
//! in each partition's consumer shard ([`crate::consume`]).
//!
//! Fields worked on here: `draining` (read; `begin_drain` in `open.rs`
//! sets it).
//!
//! Invariants the code relies on:
//! - What a pass leased is answered, never dropped behind an error (see
//!   `take`).
//! - A long poll reads its topic again after every wait and fails with
//!   "not found" when the topic was deleted or recreated meanwhile.
//! - On a cluster node a queue-mode take looks only at the partitions this
//!   node owns ([`Broker::owned_partitions`]); a single node builds no such
//!   set. A pinned take, `replay` and `resolve` do not check ownership: the
//!   caller routed them here.
//! - While `draining`, long polls return at once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use narad_log::ReadError;
use narad_meta::Topic;
use tracing::warn;

use super::{Broker, blocking};
use crate::consume::shard::{ResolveError, parse_receipt_handle, receipt_handle};
use crate::consume::take::{Taken, take};
use crate::error::BrokerError;
use crate::limits::{CONSUME_BATCH_BYTES, CONSUME_ERROR_WARN_EVERY};
use crate::metrics::{PartitionLabels, TopicLabels, WaitLabels};
use crate::topics::{PartitionRt, TopicRt, shard_limits};

/// One message handed to a consumer.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// Topic name.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// Key.
    pub key: Option<Bytes>,
    /// Payload.
    pub payload: Bytes,
    /// Commit time, ms.
    pub commit_time_ms: u64,
    /// Receipt handle (queue mode).
    pub receipt_handle: Option<String>,
}

/// Which partitions a consume takes from.
#[derive(Debug, Clone)]
enum Pick {
    /// Every partition this node serves, starting at the next in turn.
    Any,
    /// One (a pinned consume).
    One(u32),
    /// These, in this order (those this node does not serve are passed
    /// over).
    Order(Vec<u32>),
}

/// What to do with a leased message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckAction {
    /// Done with it.
    Ack,
    /// Keep it invisible for another visibility timeout.
    Extend,
    /// Make it visible again now.
    Nack,
}

impl Broker {
    /// Leases up to `max` messages (queue mode, or one pinned partition),
    /// waiting up to `wait` for one to become available.
    pub async fn consume(
        &self,
        topic: &str,
        partition: Option<u32>,
        wait: Duration,
        max: usize,
    ) -> Result<Vec<Delivered>, BrokerError> {
        let pick = match partition {
            Some(p) => Pick::One(p),
            None => Pick::Any,
        };
        self.consume_picked(topic, pick, wait, max).await
    }

    /// Leases up to `max` messages from `order`'s partitions, in that order
    /// (those this node serves; others are passed over), without waiting:
    /// a queue-mode consume that chose where to start (see the server's
    /// `consume_any`).
    pub async fn consume_in_order(
        &self,
        topic: &str,
        order: Vec<u32>,
        max: usize,
    ) -> Result<Vec<Delivered>, BrokerError> {
        self.consume_picked(topic, Pick::Order(order), Duration::ZERO, max).await
    }

    /// The topic's runtime, opened if need be (first touch of the topic on
    /// this node: opening does I/O).
    async fn open_rt(&self, t: &Topic) -> Result<Arc<TopicRt>, BrokerError> {
        match self.topics.get_open(t.name(), t.incarnation()) {
            Some(rt) => Ok(rt),
            None => {
                let (topics, t2) = (self.topics.clone(), t.clone());
                blocking(move || topics.topic(&t2)).await
            }
        }
    }

    async fn consume_picked(
        &self,
        topic: &str,
        pick: Pick,
        wait: Duration,
        max: usize,
    ) -> Result<Vec<Delivered>, BrokerError> {
        let started = self.clock.mono();
        let deadline = started + wait;
        let t = self.topic(topic)?;
        if let Pick::One(p) = pick
            && p >= t.partitions()
        {
            return Err(BrokerError::Invalid("invalid partition".into()));
        }
        let rt = self.open_rt(&t).await?;
        let mut t = t;
        let any = matches!(pick, Pick::Any);
        loop {
            let notified = rt.wake.waiter(!any);
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (got, full) = self.take(&t, &rt, &pick, max).inspect_err(|_| {
                // Other partitions may still hold what woke us.
                rt.wake.pass_on();
            })?;
            if full && any {
                // Stopped at a limit, not because nothing was left.
                rt.wake.pass_on();
            }
            let now = self.clock.mono();
            if !got.is_empty() || now >= deadline || self.draining.load(Ordering::Acquire) {
                let outcome = match (got.is_empty(), wait.is_zero()) {
                    (false, true) | (true, true) => "no_wait",
                    (false, false) => "hit",
                    (true, false) => "timeout",
                };
                self.metrics
                    .consume_wait_seconds
                    .0
                    .get_or_create(&WaitLabels { topic: topic.into(), outcome: outcome.into() })
                    .observe((now - started).as_secs_f64());
                if got.is_empty() {
                    self.metrics
                        .consume_empty
                        .get_or_create(&TopicLabels { topic: topic.into() })
                        .inc();
                }
                return Ok(got);
            }
            t = self.nap(topic, &rt, notified.as_mut(), deadline - now).await?;
        }
    }

    /// How many messages a consume could lease now from each partition of
    /// `topic` this node serves (on a cluster node: those it owns), in
    /// partition order. A partition whose log is not open has none.
    pub fn ready_counts(&self, topic: &str) -> Result<Vec<(u32, u64)>, BrokerError> {
        let t = self.topic(topic)?;
        let rt = self.topics.get_open(t.name(), t.incarnation());
        Ok(self.ready_in(&t, rt.as_deref()))
    }

    fn ready_in(&self, t: &Topic, rt: Option<&TopicRt>) -> Vec<(u32, u64)> {
        let limits = shard_limits(t);
        let now_ms = self.clock.wall_ms();
        let owned = self.owned_partitions(t);
        owned
            .into_iter()
            .map(|p| {
                let Some(part) = rt.and_then(|rt| rt.peek_partition(p)) else { return (p, 0) };
                let hwm = part.log.high_watermark();
                let n = match part.shard() {
                    Ok(mut g) => g.as_mut().map_or(0, |s| {
                        s.purge_expired(now_ms);
                        s.ready(hwm, &limits)
                    }),
                    Err(_) => 0,
                };
                (p, n)
            })
            .collect()
    }

    /// [`Broker::ready_counts`] once some partition has a message ready,
    /// or once `wait` is over (node RPC ReadyCounts: another node serving
    /// a queue-mode consume waits on it). It leases nothing, and waits as
    /// a partition waiter does, so it never takes the wake-up meant for a
    /// consumer of this node.
    pub async fn wait_ready(
        &self,
        topic: &str,
        wait: Duration,
    ) -> Result<Vec<(u32, u64)>, BrokerError> {
        let deadline = self.clock.mono() + wait;
        let mut t = self.topic(topic)?;
        let rt = self.open_rt(&t).await?;
        loop {
            let notified = rt.wake.waiter(true);
            tokio::pin!(notified);
            notified.as_mut().enable();
            let counts = self.ready_in(&t, Some(&rt));
            let now = self.clock.mono();
            if counts.iter().any(|(_, n)| *n > 0)
                || now >= deadline
                || self.draining.load(Ordering::Acquire)
            {
                return Ok(counts);
            }
            t = self.nap(topic, &rt, notified.as_mut(), deadline - now).await?;
        }
    }

    /// A long poll's wait between two looks: until `notified` fires, the
    /// next lease of `rt` expires or `left` is over. Then `topic` is read
    /// again: it may have been deleted or altered meanwhile.
    async fn nap<F: std::future::Future>(
        &self,
        topic: &str,
        rt: &TopicRt,
        notified: std::pin::Pin<&mut F>,
        left: Duration,
    ) -> Result<Arc<Topic>, BrokerError> {
        let next_expiry = self
            .next_expiry(rt)
            .map(|ms| Duration::from_millis(ms.saturating_sub(self.clock.wall_ms())));
        let sleep = left.min(next_expiry.unwrap_or(Duration::MAX));
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(sleep) => {}
        }
        let t = self.topic(topic)?;
        if rt.is_closed() || t.incarnation() != rt.incarnation {
            return Err(BrokerError::TopicNotFound);
        }
        Ok(t)
    }

    fn next_expiry(&self, rt: &TopicRt) -> Option<u64> {
        rt.open_partitions()
            .iter()
            .filter_map(|p| {
                p.shard().ok().and_then(|mut g| g.as_mut().and_then(|s| s.next_expiry()))
            })
            .min()
    }

    /// One pass over the partitions: reserve, then read. The flag says
    /// whether the pass stopped at a limit (`max` records or
    /// [`CONSUME_BATCH_BYTES`]) rather than because nothing takeable was
    /// left.
    ///
    /// A partition that fails (its consumer state cannot be loaded, a read
    /// fails with an I/O error) is passed over in queue mode: the others
    /// still serve, and the pass fails only if every partition did. A
    /// pinned take fails only if it leased nothing. Either way what was
    /// leased is answered, never dropped behind an error.
    fn take(
        &self,
        t: &Topic,
        rt: &TopicRt,
        pick: &Pick,
        max: usize,
    ) -> Result<(Vec<Delivered>, bool), BrokerError> {
        let n = t.partitions();
        let order: Vec<u32> = match pick {
            Pick::One(p) => vec![*p],
            Pick::Order(order) => {
                let owned = self.meta.is_replicated().then(|| self.owned_partitions(t));
                order
                    .iter()
                    .copied()
                    .filter(|p| *p < n && owned.as_ref().is_none_or(|o| o.contains(p)))
                    .collect()
            }
            Pick::Any => {
                let start = rt.consume_rr.fetch_add(1, Ordering::Relaxed) as u32 % n.max(1);
                // Only a cluster node filters (a single node owns them all:
                // no set built on its consume path).
                let owned = self.meta.is_replicated().then(|| self.owned_partitions(t));
                (0..n)
                    .map(|i| (start + i) % n)
                    .filter(|p| owned.as_ref().is_none_or(|o| o.contains(p)))
                    .collect()
            }
        };
        let limits = shard_limits(t);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let (mut tried, mut failures, mut first_error) = (0usize, 0usize, None);
        for p in order {
            let Some(part) = rt.partition_if_open(p) else { continue };
            if self.moved_away(t, p).is_some() {
                continue; // a leftover of a move: its owner serves it
            }
            tried += 1;
            let failed =
                self.take_from(&rt.name, &part, &limits, max - out.len(), &mut bytes, &mut out);
            if let Some(e) = failed {
                failures += 1;
                self.partition_failed(&rt.name, &part, &e);
                first_error.get_or_insert(e);
            }
            if out.len() >= max || bytes >= CONSUME_BATCH_BYTES {
                return Ok((out, true));
            }
        }
        match first_error {
            Some(e) if out.is_empty() && failures == tried => Err(e),
            _ => Ok((out, false)),
        }
    }

    /// Counts a partition a consume could not take from, and warns (at most
    /// every [`CONSUME_ERROR_WARN_EVERY`] per partition: a client polling a
    /// bad partition must not flood the log).
    fn partition_failed(&self, topic: &Arc<str>, part: &PartitionRt, e: &BrokerError) {
        self.metrics.error("messaging", "consume");
        self.metrics
            .consume_partition_errors
            .get_or_create(&PartitionLabels::new(topic, part.index))
            .inc();
        let now = self.clock.wall_ms();
        let last = part.consume_warned_ms.load(Ordering::Relaxed);
        let every = CONSUME_ERROR_WARN_EVERY.as_millis() as u64;
        if (last == 0 || now.saturating_sub(last) >= every)
            && part
                .consume_warned_ms
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            warn!(topic = %topic, partition = part.index, error = %e, "consume passes over a partition it cannot read");
        }
    }

    /// Leases from one partition into `out`; returns why it stopped early,
    /// if it failed (what it leased before is in `out` all the same).
    fn take_from(
        &self,
        topic: &Arc<str>,
        part: &PartitionRt,
        limits: &crate::consume::shard::ShardLimits,
        max: usize,
        bytes: &mut usize,
        out: &mut Vec<Delivered>,
    ) -> Option<BrokerError> {
        let labels = PartitionLabels::new(topic, part.index);
        let budget = CONSUME_BATCH_BYTES.saturating_sub(*bytes);
        let Taken { leased, skipped, failed } =
            take(topic, part, limits, self.clock.wall_ms(), max, budget);
        if skipped.corrupt + skipped.dropped > 0 {
            self.metrics
                .consumer_corrupt_skipped
                .get_or_create(&labels)
                .inc_by(skipped.corrupt + skipped.dropped);
        }
        for l in leased {
            let r = l.record;
            *bytes += r.payload.len();
            self.metrics.messages_consumed.get_or_create(&labels).inc();
            self.metrics.bytes_consumed.get_or_create(&labels).inc_by(r.payload.len() as u64);
            out.push(Delivered {
                topic: topic.clone(),
                partition: part.index,
                offset: r.offset,
                key: r.key,
                payload: r.payload,
                commit_time_ms: r.commit_time_ms,
                receipt_handle: Some(receipt_handle(part.index, r.offset, l.nonce)),
            });
        }
        failed
    }

    /// Reads without leasing (replay mode): up to `max` records from
    /// `offset`.
    pub async fn replay(
        self: &Arc<Self>,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<Delivered>, BrokerError> {
        let t = self.topic(topic)?;
        if partition >= t.partitions() {
            return Err(BrokerError::Invalid("invalid partition".into()));
        }
        if let Some(to) = self.moved_away(&t, partition) {
            return Err(BrokerError::NotOwner(format!("partition {partition} moved to {to}")));
        }
        let Some(rt) = self.topics.get_open(t.name(), t.incarnation()) else {
            return Ok(Vec::new()); // nothing was ever committed here
        };
        let part = match rt.partition_if_open(partition) {
            Some(part) => part,
            // Closed as idle: reopen it (recovery reads its files) on the
            // blocking pool, not on this runtime worker.
            None if rt.was_evicted(partition) => {
                let (me, t) = (self.clone(), t.clone());
                blocking(move || me.topics.partition(&t, partition)).await?
            }
            None => return Ok(Vec::new()), // nothing was ever committed here
        };
        if offset >= part.log.high_watermark() {
            return Ok(Vec::new());
        }
        let batch =
            part.log.read(offset, max, CONSUME_BATCH_BYTES as u64).map_err(|e| match e {
                ReadError::Gone { oldest, .. } => BrokerError::AgedOut { offset, oldest },
                other => BrokerError::internal("consume", other),
            })?;
        let topic: Arc<str> = t.name().into();
        let labels = PartitionLabels::new(&topic, partition);
        let mut out = Vec::new();
        for r in batch.records {
            if out.is_empty() && r.offset != offset {
                return Err(BrokerError::Unreadable(offset));
            }
            self.metrics.messages_consumed.get_or_create(&labels).inc();
            self.metrics.bytes_consumed.get_or_create(&labels).inc_by(r.payload.len() as u64);
            out.push(Delivered {
                topic: topic.clone(),
                partition,
                offset: r.offset,
                key: r.key,
                payload: r.payload,
                commit_time_ms: r.commit_time_ms,
                receipt_handle: None,
            });
        }
        if out.is_empty() {
            return Err(BrokerError::Unreadable(offset));
        }
        Ok(out)
    }

    /// Acks, extends or nacks the lease named by `handle`.
    pub fn resolve(&self, topic: &str, handle: &str, action: AckAction) -> Result<(), BrokerError> {
        let (p, offset, nonce) = parse_receipt_handle(handle)
            .ok_or_else(|| BrokerError::Invalid("receipt handle is malformed".into()))?;
        let t = self.topic(topic)?;
        if let Some(to) = self.moved_away(&t, p) {
            // The lease died with the move: the record comes back on `to`
            // after its visibility timeout.
            return Err(BrokerError::NotOwner(format!("partition {p} moved to {to}")));
        }
        let Some(rt) = self.topics.get_open(t.name(), t.incarnation()) else {
            return Err(BrokerError::StaleHandle);
        };
        let Some(part) = rt.partition_if_open(p) else { return Err(BrokerError::StaleHandle) };
        let limits = shard_limits(&t);
        let now = self.clock.wall_ms();
        let (result, freed) = {
            let mut g = part.shard()?;
            let shard = g.as_mut().expect("shard() fills the slot");
            // An ack frees nothing a consumer could take unless leases
            // expired just now or the partition was at one of its limits;
            // a nack always does.
            let expired = shard.purge_expired(now) > 0;
            let was_blocked = shard.blocked(&limits);
            let result = match action {
                AckAction::Ack => shard.ack(offset, nonce, now, &limits).map(drop),
                AckAction::Extend => shard.extend(offset, nonce, now, &limits),
                AckAction::Nack => shard.nack(offset, nonce, now),
            };
            let freed = match action {
                AckAction::Ack => expired || (was_blocked && result.is_ok()),
                AckAction::Extend => expired,
                AckAction::Nack => expired || result.is_ok(),
            };
            (result, freed)
        };
        if freed {
            rt.wake.available();
        }
        match result {
            Ok(()) => {
                let labels = TopicLabels { topic: topic.into() };
                match action {
                    AckAction::Extend => {
                        self.metrics.ack_extended.get_or_create(&labels).inc();
                    }
                    AckAction::Nack => {
                        self.metrics.nack.get_or_create(&labels).inc();
                    }
                    AckAction::Ack => {}
                }
                Ok(())
            }
            Err(ResolveError::Stale) => Err(BrokerError::StaleHandle),
            Err(ResolveError::AheadFull) => {
                self.metrics
                    .ack_rejected
                    .get_or_create(&crate::metrics::ReasonLabels { reason: "cap".into() })
                    .inc();
                Err(BrokerError::AckedAheadFull)
            }
        }
    }
}
