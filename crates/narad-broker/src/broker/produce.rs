//! The produce path: [`ProduceRecord`], [`Broker::produce`] and
//! [`Broker::produce_batch`]: check a record against its topic, pick its
//! partition, append it to the ingress WAL. The dispatcher (see
//! [`crate::dispatch`]) commits it to the partition's owner later.
//!
//! Fields worked on here: `wal` (appends) and `round_robin` (the partition
//! of a record with neither key nor pinned partition).
//!
//! Invariants the code relies on:
//! - A produce answers only once its records are durable in the WAL.
//! - A cluster node takes no produce until it has reached its group's
//!   leader since it started (`check_accepting`, see
//!   [`Broker::release_produce`]).
//! - A batch is checked whole before any record is appended: one bad
//!   record refuses them all.
//! - Each record carries its topic's incarnation, so records of a deleted
//!   (or recreated) topic are discarded by the dispatcher, never committed
//!   to a newer incarnation.

use std::sync::Arc;

use bytes::Bytes;
use narad_meta::Topic;
use narad_wal::RecordRef;

use super::Broker;
use crate::error::BrokerError;
use crate::metrics::RejectionLabels;
use crate::partition::keyed_partition;

/// One record of a batch produce, already decoded from the wire.
#[derive(Debug, Clone)]
pub struct ProduceRecord {
    /// The key.
    pub key: Option<Bytes>,
    /// A pinned partition.
    pub partition: Option<u32>,
    /// The payload.
    pub payload: Bytes,
}

impl Broker {
    /// Checks a produce against its topic (delayed child, schema, pinned
    /// partition) and picks the partition.
    fn accept_one(
        &self,
        t: &Topic,
        key: Option<&[u8]>,
        partition: Option<u32>,
        payload: &[u8],
    ) -> Result<u32, BrokerError> {
        if t.is_delayed_child() {
            self.metrics
                .produce_rejections
                .get_or_create(&RejectionLabels {
                    topic: t.name().into(),
                    reason: "delayed_child".into(),
                })
                .inc();
            return Err(BrokerError::DelayedChild);
        }
        if let Some(schema) = self.meta.compiled_schema(t.name())
            && let Err(reason) = schema.validate_payload(payload)
        {
            self.metrics
                .produce_rejections
                .get_or_create(&RejectionLabels { topic: t.name().into(), reason: "schema".into() })
                .inc();
            return Err(BrokerError::Invalid(format!("invalid argument: schema: {reason}")));
        }
        match (partition, key) {
            (Some(p), _) if p >= t.partitions() => {
                Err(BrokerError::Invalid("invalid argument: partition out of range".into()))
            }
            (Some(p), _) => Ok(p),
            (None, Some(k)) => Ok(keyed_partition(k, t.partitions())),
            (None, None) => Ok(self.round_robin.pick(t.name(), t.partitions(), self.clock.mono())),
        }
    }

    /// Produces one record: answers once it is fsynced in the ingress WAL.
    pub async fn produce(
        &self,
        topic: &str,
        key: Option<Bytes>,
        partition: Option<u32>,
        payload: Bytes,
    ) -> Result<(), BrokerError> {
        self.check_accepting(topic)?;
        let t = self.topic(topic)?;
        let p = self.accept_one(&t, key.as_deref(), partition, &payload)?;
        let rec = RecordRef {
            topic,
            incarnation: Some(t.incarnation()),
            key: key.as_deref(),
            partition: p,
            accepted_at_ms: self.clock.wall_ms(),
            payload: &payload,
        };
        let pending = self.wal.append_async(&rec).map_err(|e| self.wal_error(e))?;
        pending.await.map_err(|e| self.wal_error(e))?;
        Ok(())
    }

    /// Produces a batch atomically from the client's view: every record is
    /// checked before any is appended; one failure refuses all
    /// (`message <i>: ...`). Answers once the last record is durable.
    pub async fn produce_batch(
        &self,
        topic: &str,
        records: Vec<ProduceRecord>,
    ) -> Result<usize, BrokerError> {
        self.check_accepting(topic)?;
        let t = self.topic(topic)?;
        let mut parts = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let p = self.accept_one(&t, r.key.as_deref(), r.partition, &r.payload).map_err(
                |e| match e {
                    BrokerError::Invalid(m) => BrokerError::Invalid(format!("message {i}: {m}")),
                    other => other,
                },
            )?;
            parts.push(p);
        }
        let now = self.clock.wall_ms();
        let refs: Vec<RecordRef<'_>> = records
            .iter()
            .zip(&parts)
            .map(|(r, p)| RecordRef {
                topic,
                incarnation: Some(t.incarnation()),
                key: r.key.as_deref(),
                partition: *p,
                accepted_at_ms: now,
                payload: &r.payload,
            })
            .collect();
        let pending = self.wal.append_many_async(&refs).map_err(|e| self.wal_error(e))?;
        drop(refs);
        let range = pending.await.map_err(|e| self.wal_error(e))?;
        Ok((range.end - range.start) as usize)
    }

    fn wal_error(&self, e: narad_wal::WalError) -> BrokerError {
        if let narad_wal::WalError::Record(r) = &e {
            return BrokerError::Invalid(format!("invalid argument: {r}"));
        }
        self.metrics.error("messaging", "append");
        BrokerError::Wal(Arc::new(e))
    }
}
