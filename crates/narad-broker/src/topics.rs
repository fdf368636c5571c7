//! The topics this node owns, opened: partition logs, consumer state, and
//! the wake-up signal of long-polling consumers.
//!
//! # Directory `<data>/topics/<topic>/`
//! ```text
//! incarnation            which topic incarnation the files belong to
//! p00000/ p00001/ ...    one partition log each (segments, consumer.offset)
//! ```
//! `incarnation` (24 bytes, big-endian): magic `NTOPINC1` | incarnation u64
//! | crc32c u32 over bytes [0, 16) | reserved u32 = 0. It is written
//! (temp + fsync + rename) before any partition directory, so:
//! * a directory without it holds nothing of value (a crash between
//!   creating the directory and the marker) and is cleared;
//! * a directory whose marker names another incarnation holds the files of
//!   a deleted topic whose purge did not finish (a crash after the delete):
//!   it is cleared before the new incarnation uses the name, so records of
//!   the old topic can never appear in the new one;
//! * a marker that fails its CRC stops the open: the files may be acked
//!   data of the live topic, so an operator must look.
//!
//! # Incarnations only grow
//!
//! A caller opens a topic with the record it read from the metastore a
//! moment earlier (the dispatcher's commit, a first consume, a replay that
//! reopens an idle log, a fan-out cursor opening its parent); the name may
//! have been deleted and recreated since. An open is therefore refused
//! ([`BrokerError::TopicNotFound`]; the dispatcher takes it as a refused
//! commit and resolves the records again) when a newer incarnation is open
//! under the name, when the marker on disk names a newer one, or when the
//! caller's incarnation (or a newer one) was removed in this process: it
//! never closes or clears a newer incarnation. Removal names the
//! incarnation it removes and leaves newer ones alone. All of this runs
//! under one lock, as do the close and the clear.
//!
//! Retiring a partition (its topic removed or replaced, or its log closed
//! as idle) and persisting its consumer frontier are exclusive: a frontier
//! pass that listed the partition before it was retired either finishes
//! its write before the files are removed or writes nothing.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use narad_clock::ClockRef;
use narad_fs::FsRef;
use narad_log::{ConsumerOffset, LogConfig, LogStats, PartitionLog};
use narad_meta::Topic;
use tracing::{info, warn};

use crate::consume::shard::{Nonces, Shard, ShardLimits};
use crate::consume::wake::ConsumeWake;
use crate::error::BrokerError;
use crate::metrics::BrokerMetrics;

pub(crate) const MARKER_FILE: &str = "incarnation";
const MARKER_MAGIC: &[u8; 8] = b"NTOPINC1";

/// Encodes the incarnation marker.
pub fn encode_marker(incarnation: u64) -> [u8; 24] {
    let mut b = [0u8; 24];
    b[..8].copy_from_slice(MARKER_MAGIC);
    b[8..16].copy_from_slice(&incarnation.to_be_bytes());
    let crc = crc32c::crc32c(&b[..16]);
    b[16..20].copy_from_slice(&crc.to_be_bytes());
    b
}

/// Decodes the incarnation marker; `None` if damaged.
pub fn decode_marker(b: &[u8]) -> Option<u64> {
    if b.len() != 24 || &b[..8] != MARKER_MAGIC || b[20..24] != [0; 4] {
        return None;
    }
    let crc = u32::from_be_bytes([b[16], b[17], b[18], b[19]]);
    if crc32c::crc32c(&b[..16]) != crc {
        return None;
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&b[8..16]);
    Some(u64::from_be_bytes(id))
}

/// One partition this node owns.
#[derive(Debug)]
pub struct PartitionRt {
    /// Its index.
    pub index: u32,
    /// Its log.
    pub log: Arc<PartitionLog>,
    frontier: ConsumerOffset,
    /// Held while the frontier is persisted; `true` once the partition is
    /// retired (see [`PartitionRt::retire`]): nothing is persisted after.
    frontier_gate: Mutex<bool>,
    shard: Mutex<Option<Shard>>,
    /// [`Topics::frontier_moves`]' counter, bumped by the shard.
    frontier_moves: Arc<AtomicU64>,
    /// The process's lease nonces.
    nonces: Arc<Nonces>,
    /// Wall-clock ms of the last WARN about a consume that could not take
    /// from this partition (0: none yet).
    pub(crate) consume_warned_ms: AtomicU64,
    /// Wall-clock ms of the last access through [`Topics::partition`] or
    /// [`TopicRt::partition_if_open`] (background passes do not count).
    last_access_ms: AtomicU64,
}

impl PartitionRt {
    /// The consumer state, recovered from `consumer.offset` at first touch.
    pub fn shard(&self) -> Result<MutexGuard<'_, Option<Shard>>, BrokerError> {
        let mut g = self.shard.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            let oldest = self.log.oldest_offset();
            let next = match self.frontier.load() {
                Ok(Some(last)) => last + 1,
                Ok(None) => oldest,
                Err(e) => return Err(BrokerError::internal("consume", e)),
            };
            let mut shard = Shard::tracked(next, self.frontier_moves.clone(), self.nonces.clone());
            shard.skip_below(oldest);
            *g = Some(shard);
        }
        Ok(g)
    }

    fn touch(&self, now_ms: u64) {
        self.last_access_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Whether the consumer state holds nothing that lives only in memory
    /// and nothing is left to consume: no leases, no acks ahead of the
    /// frontier, no skipped-corrupt offsets, the frontier persisted, and
    /// the next offset to deliver at the high watermark.
    /// (A frontier not yet persisted waits for the persister's next pass
    /// rather than being synced here, under the partition table's lock.)
    fn quiescent(&self) -> bool {
        let Ok(g) = self.shard() else { return false };
        let Some(s) = g.as_ref() else { return false };
        !s.is_dirty()
            && s.in_flight() == 0
            && s.acked_ahead() == 0
            && s.corrupt_ahead() == 0
            && s.next() >= self.log.high_watermark()
    }

    /// Whether the consumer frontier moved since it was last persisted (or
    /// may have: a shard held by someone else counts as moved, so a pass
    /// never skips one it could not look at).
    pub fn frontier_dirty(&self) -> bool {
        match self.shard.try_lock() {
            Ok(g) => g.as_ref().is_some_and(Shard::is_dirty),
            Err(std::sync::TryLockError::Poisoned(p)) => {
                p.into_inner().as_ref().is_some_and(Shard::is_dirty)
            }
            Err(std::sync::TryLockError::WouldBlock) => true,
        }
    }

    /// Persists the consumer frontier if it moved (temp + fsync + rename),
    /// unless the partition was retired (`Ok(false)`).
    pub fn persist_frontier(&self) -> Result<bool, BrokerError> {
        let retired = self.frontier_gate.lock().unwrap_or_else(|p| p.into_inner());
        if *retired {
            return Ok(false);
        }
        let next = {
            let mut g = self.shard.lock().unwrap_or_else(|p| p.into_inner());
            match g.as_mut().and_then(Shard::take_dirty) {
                Some(n) => n,
                None => return Ok(false),
            }
        };
        if next == 0 {
            return Ok(false);
        }
        if let Err(e) = self.frontier.store(next - 1) {
            // Mark dirty again so the next pass retries.
            if let Some(s) = self.shard.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                s.mark_dirty();
            }
            return Err(BrokerError::internal("persist consumer frontier", e));
        }
        Ok(true)
    }

    /// The consumer frontier as persisted: the last offset below which
    /// (inclusive) every record is acked, `None` before the first ack.
    pub fn persisted_frontier(&self) -> Result<Option<u64>, BrokerError> {
        self.frontier.load().map_err(|e| BrokerError::internal("read consumer frontier", e))
    }

    /// Closes the log for good and stops frontier persists: waits for one
    /// in progress, and every later one writes nothing. Called before the
    /// partition's files may be removed or reopened by another holder.
    fn retire(&self) {
        *self.frontier_gate.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.log.close();
    }
}

/// One topic this node has opened.
#[derive(Debug)]
pub struct TopicRt {
    /// Topic name.
    pub name: Arc<str>,
    /// The incarnation the files belong to.
    pub incarnation: u64,
    dir: PathBuf,
    partitions: RwLock<Vec<Option<Arc<PartitionRt>>>>,
    /// The shape of each partition whose log was closed as idle, as it was
    /// when closed (nothing changes a closed log); removed on reopen.
    evicted: Mutex<HashMap<u32, LogStats>>,
    clock: ClockRef,
    /// Wakes long-polling consumers and fan-out cursors: commits, nacks,
    /// unblocking acks, expiries.
    pub wake: Arc<ConsumeWake>,
    /// Rotation of queue-mode consumes over the partitions.
    pub consume_rr: AtomicUsize,
    closed: AtomicBool,
}

impl TopicRt {
    /// The partition if its log is open (an access: it keeps the log from
    /// being closed as idle). A partition whose log is not open has nothing
    /// to consume: it was never written since the start, or it was closed
    /// as idle with its consumer frontier at its high watermark.
    pub fn partition_if_open(&self, p: u32) -> Option<Arc<PartitionRt>> {
        let part =
            self.partitions.read().unwrap_or_else(|e| e.into_inner()).get(p as usize)?.clone()?;
        part.touch(self.clock.wall_ms());
        Some(part)
    }

    /// The partition if its log is open, for background passes: not an
    /// access, so it does not keep an idle log open.
    pub fn peek_partition(&self, p: u32) -> Option<Arc<PartitionRt>> {
        self.partitions.read().unwrap_or_else(|e| e.into_inner()).get(p as usize)?.clone()
    }

    /// Bytes of the partitions whose logs were closed as idle.
    pub fn evicted_bytes(&self) -> u64 {
        self.evicted.lock().unwrap_or_else(|e| e.into_inner()).values().map(|s| s.size_bytes).sum()
    }

    /// Whether partition `p`'s log was closed as idle (and not reopened).
    pub fn was_evicted(&self, p: u32) -> bool {
        self.evicted.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&p)
    }

    /// The shape of partition `p`'s log: read from the log if it is open,
    /// else as it was when it was closed as idle; `None` if it was not
    /// opened since the start. Not an access.
    pub fn partition_stats(&self, p: u32) -> Option<LogStats> {
        match self.peek_partition(p) {
            Some(part) => Some(part.log.stats()),
            None => self.evicted.lock().unwrap_or_else(|e| e.into_inner()).get(&p).copied(),
        }
    }

    /// The open partitions.
    pub fn open_partitions(&self) -> Vec<Arc<PartitionRt>> {
        self.partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The open partitions whose consumer frontier moved since it was last
    /// persisted (see [`PartitionRt::frontier_dirty`]). The frontier pass
    /// runs every 100 ms over every open partition: it clones none of the
    /// idle ones.
    pub fn frontier_dirty_partitions(&self) -> Vec<Arc<PartitionRt>> {
        self.partitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
            .filter(|p| p.frontier_dirty())
            .cloned()
            .collect()
    }

    /// Whether the topic was removed (deleted or replaced).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// Limits of a topic's consumer shards.
pub fn shard_limits(t: &Topic) -> ShardLimits {
    ShardLimits {
        max_in_flight: t.max_in_flight_per_partition() as usize,
        max_acked_ahead: t.max_acked_ahead_per_partition() as usize,
        visibility_ms: t.visibility_timeout_ms(),
    }
}

/// The map of opened topics.
#[derive(Debug)]
pub struct Topics {
    fs: FsRef,
    root: PathBuf,
    log_config: LogConfig,
    clock: ClockRef,
    map: RwLock<BTreeMap<String, Arc<TopicRt>>>,
    /// Serializes opening and removing (both do I/O). Holds, per name, the
    /// newest incarnation removed in this process while no newer one is
    /// open: opens of it or an older one are refused.
    open_lock: Mutex<HashMap<String, u64>>,
    open_logs: AtomicUsize,
    /// Where commit cycles are reported, if anywhere.
    metrics: Option<Arc<BrokerMetrics>>,
    /// Bumped by every consumer frontier move of every partition.
    frontier_moves: Arc<AtomicU64>,
    /// Lease nonces of every shard (see [`Nonces`]).
    nonces: Arc<Nonces>,
    /// Where a partition's new log starts when this node owns it with a
    /// start offset (see [`BaseOffsets`]).
    base_offsets: Option<BaseOffsets>,
}

/// The offset at which this node's log of `(topic, incarnation,
/// partition)` must start, when this node owns the partition and its
/// assignment names one (`Assignment::base_offset`: the partition of a
/// member removed for good, `narad cluster remove --force`); `None`
/// otherwise.
///
/// [`Topics::partition`] asks it whenever it opens a log, so the log is
/// created at that offset (first segment base, high watermark and consumer
/// frontier) by the same open that any commit or consume goes through: no
/// commit can land at a lower offset first. A log this node already holds
/// whose oldest offset is below it is a leftover of an earlier ownership
/// (it owned the partition before a move to the removed member): its
/// records were copied to the member that is gone, its offsets are behind
/// the ones the cluster has seen since, and appending to it would hand them
/// out again, so it is removed and a new log is created at the start offset
/// (or at its high watermark, if that is higher). A log created at the
/// start offset never has an oldest offset below it (retention only
/// raises it), so a restart keeps it.
#[derive(Clone)]
pub struct BaseOffsets(pub Arc<BaseOffsetFn>);

/// `(topic, incarnation, partition)` → the start offset, if any.
pub type BaseOffsetFn = dyn Fn(&str, u64, u32) -> Option<u64> + Send + Sync;

/// The [`BaseOffsets`] of node `me` over the metastore `meta`: an
/// assignment's start offset, when `me` owns the partition of that
/// incarnation.
pub fn base_offsets_of(meta: &Arc<narad_meta::MetaStore>, me: &str) -> BaseOffsets {
    let (meta, me) = (Arc::downgrade(meta), me.to_owned());
    BaseOffsets(Arc::new(move |topic, incarnation, p| {
        let state = meta.upgrade()?.snapshot();
        if state.topic(topic)?.incarnation() != incarnation {
            return None;
        }
        state.assignment(topic, p).filter(|a| a.owner_id == me).and_then(|a| a.base_offset)
    }))
}

impl std::fmt::Debug for BaseOffsets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BaseOffsets")
    }
}

fn partition_dir(topic_dir: &Path, p: u32) -> PathBuf {
    topic_dir.join(format!("p{p:05}"))
}

impl Topics {
    /// The topics under `<data>/topics`.
    pub fn new(fs: FsRef, data_dir: &Path, log_config: LogConfig, clock: ClockRef) -> Topics {
        Topics {
            fs,
            root: data_dir.join("topics"),
            log_config,
            map: RwLock::new(BTreeMap::new()),
            open_lock: Mutex::new(HashMap::new()),
            open_logs: AtomicUsize::new(0),
            metrics: None,
            frontier_moves: Arc::default(),
            nonces: Arc::new(Nonces::seeded(clock.wall_ms())),
            clock,
            base_offsets: None,
        }
    }

    /// Creates missing partition logs at their assignment's start offset
    /// (see [`BaseOffsets`]).
    pub fn with_base_offsets(mut self, base_offsets: BaseOffsets) -> Topics {
        self.base_offsets = Some(base_offsets);
        self
    }

    /// The start offset `partition` of `topic` must have here, if any.
    fn base_offset(&self, topic: &Topic, p: u32) -> Option<u64> {
        self.base_offsets.as_ref().and_then(|f| (f.0)(topic.name(), topic.incarnation(), p))
    }

    /// Opens partition `p`'s log in `dir`, at its start offset when it has
    /// one and this node holds no log of it from the owner that started
    /// it (see [`BaseOffsets`]). Under the open lock.
    fn open_log(&self, topic: &Topic, p: u32, dir: &Path) -> Result<PartitionLog, BrokerError> {
        fn err(e: impl std::fmt::Display) -> BrokerError {
            BrokerError::internal("open partition log", e)
        }
        let open = || {
            PartitionLog::open(
                self.fs.clone(),
                dir.to_path_buf(),
                self.log_config.clone(),
                self.clock.clone(),
            )
            .map_err(err)
        };
        let Some(base) = self.base_offset(topic, p) else { return open() };
        let has_segments = self.fs.exists(dir).map_err(err)?
            && self.fs.list_dir(dir).map_err(err)?.iter().any(|e| {
                !e.is_dir && narad_log::segment::parse_segment_file_name(&e.name).is_some()
            });
        let mut start = base;
        if has_segments {
            let log = open()?;
            if log.oldest_offset() >= base {
                return Ok(log);
            }
            let (oldest, hwm) = (log.oldest_offset(), log.high_watermark());
            log.close();
            drop(log);
            warn!(
                topic = %topic.name(), partition = p, oldest, high_watermark = hwm, start_offset = base,
                "partition log here is a leftover of an earlier ownership, behind the start offset \
                 its owner was removed at: removed, and a new log starts at the start offset"
            );
            self.fs.remove_dir_all(dir).map_err(err)?;
            start = base.max(hwm);
        }
        info!(topic = %topic.name(), partition = p, start_offset = start,
            "partition log created at its start offset (its earlier owner was removed)");
        PartitionLog::create_at(
            self.fs.clone(),
            dir.to_path_buf(),
            self.log_config.clone(),
            self.clock.clone(),
            start,
        )
        .map_err(err)
    }

    /// Reports every log's commit cycles to `metrics` (the storage flush
    /// and fsync histograms).
    pub fn with_metrics(mut self, metrics: Arc<BrokerMetrics>) -> Topics {
        self.metrics = Some(metrics);
        self
    }

    /// How many partition logs are open.
    pub fn open_logs(&self) -> usize {
        self.open_logs.load(Ordering::Relaxed)
    }

    /// How many times a consumer frontier moved (or a failed persist put one
    /// back), in any partition: while it stays the same, no partition has
    /// become dirty. A move sets the partition's flag before it bumps this
    /// count, so a pass that reads the count and then looks at the
    /// partitions finds every move the count includes.
    pub fn frontier_moves(&self) -> u64 {
        self.frontier_moves.load(Ordering::Acquire)
    }

    /// Every opened topic, in name order.
    pub fn all(&self) -> Vec<Arc<TopicRt>> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// The opened topic `name`, if it is open at `incarnation`.
    pub fn get_open(&self, name: &str, incarnation: u64) -> Option<Arc<TopicRt>> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.get(name).filter(|t| t.incarnation == incarnation).cloned()
    }

    /// The partition `p` of `topic`, opening the topic and the log if
    /// needed (blocking I/O: call from a blocking context).
    pub fn partition(&self, topic: &Topic, p: u32) -> Result<Arc<PartitionRt>, BrokerError> {
        let rt = self.topic(topic)?;
        let behind = |part: &PartitionRt| {
            self.base_offset(topic, p).is_some_and(|base| part.log.oldest_offset() < base)
        };
        if let Some(part) = rt.partition_if_open(p).filter(|part| !behind(part)) {
            return Ok(part);
        }
        let _g = self.open_lock.lock().unwrap_or_else(|e| e.into_inner());
        if rt.is_closed() {
            return Err(BrokerError::TopicNotFound);
        }
        if let Some(part) = rt.partition_if_open(p) {
            if !behind(&part) {
                return Ok(part);
            }
            // A leftover of an earlier ownership, open since: closed here,
            // and `open_log` replaces it (see [`BaseOffsets`]).
            let mut parts = rt.partitions.write().unwrap_or_else(|e| e.into_inner());
            if let Some(old) = parts.get_mut(p as usize).and_then(Option::take) {
                old.retire();
                self.open_logs.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let dir = partition_dir(&rt.dir, p);
        let log = self.open_log(topic, p, &dir)?;
        let wake = rt.wake.clone();
        log.set_commit_listener(Some(Box::new(move |_hwm| wake.available())));
        if let Some(m) = &self.metrics {
            log.set_cycle_observer(Some(m.cycle_observer(&rt.name, p)));
        }
        let part = Arc::new(PartitionRt {
            index: p,
            log: Arc::new(log),
            frontier: ConsumerOffset::new(self.fs.clone(), &dir, rt.incarnation),
            frontier_gate: Mutex::new(false),
            shard: Mutex::new(None),
            frontier_moves: self.frontier_moves.clone(),
            nonces: self.nonces.clone(),
            consume_warned_ms: AtomicU64::new(0),
            last_access_ms: AtomicU64::new(self.clock.wall_ms()),
        });
        let mut parts = rt.partitions.write().unwrap_or_else(|e| e.into_inner());
        if parts.len() <= p as usize {
            parts.resize(p as usize + 1, None);
        }
        parts[p as usize] = Some(part.clone());
        rt.evicted.lock().unwrap_or_else(|e| e.into_inner()).remove(&p);
        self.open_logs.fetch_add(1, Ordering::Relaxed);
        Ok(part)
    }

    /// The opened topic for `topic`'s incarnation, opening (and clearing
    /// leftovers of older incarnations) if needed; refused
    /// ([`BrokerError::TopicNotFound`]) if the incarnation was superseded
    /// (see the module header).
    pub fn topic(&self, topic: &Topic) -> Result<Arc<TopicRt>, BrokerError> {
        if let Some(rt) = self.get_open(topic.name(), topic.incarnation()) {
            return Ok(rt);
        }
        let mut removed = self.open_lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rt) = self.get_open(topic.name(), topic.incarnation()) {
            return Ok(rt);
        }
        let open = self.map.read().unwrap_or_else(|e| e.into_inner()).get(topic.name()).cloned();
        let newer =
            open.map(|rt| rt.incarnation).into_iter().chain(removed.get(topic.name()).copied());
        if let Some(newer) = newer.filter(|id| *id >= topic.incarnation()).max() {
            return Err(self.superseded(topic.name(), topic.incarnation(), newer));
        }
        let dir = self.root.join(topic.name());
        // Refused before anything is closed if the disk holds a newer one.
        self.check_marker(&dir, topic.incarnation())?;
        // An older incarnation under this name is open: retire it first.
        let old = self.map.write().unwrap_or_else(|e| e.into_inner()).remove(topic.name());
        if let Some(old) = old {
            self.close_rt(&old);
        }
        self.prepare_dir(&dir, topic.incarnation())?;
        removed.remove(topic.name());
        let rt = Arc::new(TopicRt {
            name: topic.name().into(),
            incarnation: topic.incarnation(),
            dir,
            partitions: RwLock::new(Vec::new()),
            evicted: Mutex::new(HashMap::new()),
            clock: self.clock.clone(),
            wake: Arc::new(ConsumeWake::new()),
            consume_rr: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        });
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(topic.name().to_owned(), rt.clone());
        Ok(rt)
    }

    /// Refuses an open of `incarnation` (counted, logged) because
    /// `newer` is open, was removed, or owns the directory.
    fn superseded(&self, name: &str, incarnation: u64, newer: u64) -> BrokerError {
        if let Some(m) = &self.metrics {
            m.error("messaging", "superseded_incarnation");
        }
        info!(
            topic = name,
            incarnation,
            newer,
            "refused to open a topic incarnation that was deleted (the name was reused)"
        );
        BrokerError::TopicNotFound
    }

    /// The incarnation the marker in `dir` names: `Ok(None)` without a
    /// directory, `Ok(Some(None))` without a marker; an error for a damaged
    /// marker.
    fn read_marker(
        &self,
        dir: &Path,
        op: &'static str,
    ) -> Result<Option<Option<u64>>, BrokerError> {
        let io = |e: std::io::Error| BrokerError::internal(op, format!("{}: {e}", dir.display()));
        if !self.fs.exists(dir).map_err(io)? {
            return Ok(None);
        }
        let marker = dir.join(MARKER_FILE);
        if !self.fs.exists(&marker).map_err(io)? {
            return Ok(Some(None));
        }
        let b = narad_fs::read_small_file(&*self.fs, &marker, 64).map_err(io)?;
        match decode_marker(&b) {
            Some(id) => Ok(Some(Some(id))),
            None => Err(BrokerError::internal(
                op,
                format!(
                    "{} is damaged; refusing to guess which topic owns {}",
                    marker.display(),
                    dir.display()
                ),
            )),
        }
    }

    /// Refuses an open of `incarnation` when the directory belongs to a
    /// newer one.
    fn check_marker(&self, dir: &Path, incarnation: u64) -> Result<(), BrokerError> {
        match self.read_marker(dir, "open topic")? {
            Some(Some(found)) if found > incarnation => {
                let name = dir.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
                Err(self.superseded(&name, incarnation, found))
            }
            _ => Ok(()),
        }
    }

    fn prepare_dir(&self, dir: &Path, incarnation: u64) -> Result<(), BrokerError> {
        let io = |e: std::io::Error| {
            BrokerError::internal("open topic", format!("{}: {e}", dir.display()))
        };
        let marker = dir.join(MARKER_FILE);
        if let Some(found) = self.read_marker(dir, "open topic")? {
            if found == Some(incarnation) {
                return Ok(());
            }
            if let Some(newer) = found.filter(|id| *id > incarnation) {
                let name = dir.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
                return Err(self.superseded(&name, incarnation, newer));
            }
            warn!(
                dir = %dir.display(),
                found = ?found,
                live = incarnation,
                "removing the files of an earlier incarnation of this topic"
            );
            self.fs.remove_dir_all(dir).map_err(io)?;
        }
        self.fs.create_dir_all(dir).map_err(io)?;
        narad_fs::write_file_atomic(&*self.fs, &marker, &encode_marker(incarnation)).map_err(io)
    }

    fn close_rt(&self, rt: &TopicRt) {
        rt.closed.store(true, Ordering::Release);
        for part in rt.open_partitions() {
            part.retire();
            self.open_logs.fetch_sub(1, Ordering::Relaxed);
        }
        rt.wake.everyone();
    }

    /// Closes the logs unaccessed for `idle_ms` (SPEC §5.7, called every
    /// minute), when closing loses nothing and nobody notices:
    /// * `retention_ms(topic)` (the live topic's retention; `None` skips
    ///   the topic) is 0 or the log has one segment, so no retention pass
    ///   is owed to a closed log;
    /// * nothing else holds the partition or its log (checked under the
    ///   partition table's write lock, which every accessor needs to get
    ///   one, so no commit, read or ack can start on it meanwhile);
    /// * its consumer state is [quiescent](PartitionRt::quiescent), so a
    ///   consume that skips unopened partitions misses nothing and no
    ///   receipt handle points into it.
    ///
    /// The log reopens on its next commit or replay (its stats are kept
    /// meanwhile). Runs under the open lock, so a reopen waits until the
    /// close has finished. Returns the logs closed.
    pub fn evict_idle(
        &self,
        idle_ms: u64,
        retention_ms: &dyn Fn(&TopicRt) -> Option<u64>,
    ) -> usize {
        let now = self.clock.wall_ms();
        let mut closed = 0;
        for rt in self.all() {
            let Some(retention) = retention_ms(&rt) else { continue };
            let slots = rt.partitions.read().unwrap_or_else(|e| e.into_inner()).len();
            for p in 0..slots {
                let _g = self.open_lock.lock().unwrap_or_else(|e| e.into_inner());
                if rt.is_closed() {
                    break;
                }
                let mut parts = rt.partitions.write().unwrap_or_else(|e| e.into_inner());
                let Some(Some(part)) = parts.get(p) else { continue };
                let idle =
                    now.saturating_sub(part.last_access_ms.load(Ordering::Relaxed)) >= idle_ms;
                let unshared = Arc::strong_count(part) == 1 && Arc::strong_count(&part.log) == 1;
                if !idle || !unshared {
                    continue;
                }
                let stats = part.log.stats();
                if (retention != 0 && stats.segments > 1) || !part.quiescent() {
                    continue;
                }
                let part = parts[p].take().expect("checked above");
                drop(parts);
                rt.evicted.lock().unwrap_or_else(|e| e.into_inner()).insert(p as u32, stats);
                part.retire();
                self.open_logs.fetch_sub(1, Ordering::Relaxed);
                closed += 1;
                info!(topic = %rt.name, partition = p, "closed an idle partition log");
            }
        }
        closed
    }

    /// Starts staging a copy of partition `p` of `topic` for a move to
    /// this node, under `<data>/moves/` (never under `topics/`: a staged
    /// copy is no log of this node's until [`Topics::install_partition`]);
    /// an earlier, abandoned copy of it is removed first.
    pub fn incoming_copy(
        &self,
        topic: &Topic,
        p: u32,
    ) -> Result<narad_log::copy::IncomingCopy, BrokerError> {
        let dir = self.staging_dir(topic.name(), topic.incarnation(), p);
        narad_log::copy::IncomingCopy::create(self.fs.clone(), &dir)
            .map_err(|e| BrokerError::internal("stage partition copy", e))
    }

    /// `<data>/moves/`: the staged copies of partitions moving here.
    fn staging_root(&self) -> PathBuf {
        self.root.parent().unwrap_or(&self.root).join("moves")
    }

    fn staging_dir(&self, topic: &str, incarnation: u64, p: u32) -> PathBuf {
        self.staging_root().join(format!("{topic}-{incarnation}-p{p:05}"))
    }

    /// Removes the staged copy of partition `p` (a move to this node that
    /// ended without its flip), if there is one. Answers whether there was.
    pub fn discard_staged_copy(
        &self,
        topic: &str,
        incarnation: u64,
        p: u32,
    ) -> Result<bool, BrokerError> {
        let dir = self.staging_dir(topic, incarnation, p);
        let err = |e| BrokerError::internal("remove a staged partition copy", e);
        if !self.fs.exists(&dir).map_err(err)? {
            return Ok(false);
        }
        self.fs.remove_dir_all(&dir).map_err(err)?;
        Ok(true)
    }

    /// Removes every staged copy (at start: no move runs yet, and one that
    /// is still planned starts its copy over). Answers how many there were.
    pub fn discard_staged_copies(&self) -> Result<usize, BrokerError> {
        let root = self.staging_root();
        let err = |e| BrokerError::internal("remove staged partition copies", e);
        if !self.fs.exists(&root).map_err(err)? {
            return Ok(0);
        }
        let entries = self.fs.list_dir(&root).map_err(err)?;
        for e in &entries {
            let path = root.join(&e.name);
            if e.is_dir {
                self.fs.remove_dir_all(&path).map_err(err)?;
            } else {
                self.fs.remove_file(&path).map_err(err)?;
            }
        }
        Ok(entries.len())
    }

    /// The log configuration partitions open with (a staged copy is
    /// verified with it).
    pub fn log_config(&self) -> &LogConfig {
        &self.log_config
    }

    /// Installs a verified copy of partition `p` of `topic` (staged at
    /// `staged` by [`narad_log::copy::IncomingCopy`]) as this node's log of
    /// it, with `frontier` (the last acked offset of the source, if any) as
    /// its consumer frontier. Whatever this node held of the partition
    /// before (a leftover of an earlier ownership, open or on disk) is
    /// closed and removed first: the caller is the move's destination, so
    /// this node does not own the partition and nothing here serves it.
    /// Runs under the open lock, so no open of the partition races it.
    pub fn install_partition(
        &self,
        topic: &Topic,
        p: u32,
        staged: &Path,
        frontier: Option<u64>,
    ) -> Result<(), BrokerError> {
        let rt = self.topic(topic)?;
        let _g = self.open_lock.lock().unwrap_or_else(|e| e.into_inner());
        if rt.is_closed() {
            return Err(BrokerError::TopicNotFound);
        }
        let leftover = {
            let mut parts = rt.partitions.write().unwrap_or_else(|e| e.into_inner());
            parts.get_mut(p as usize).and_then(Option::take)
        };
        if let Some(part) = leftover {
            part.retire();
            self.open_logs.fetch_sub(1, Ordering::Relaxed);
        }
        rt.evicted.lock().unwrap_or_else(|e| e.into_inner()).remove(&p);
        let dir = partition_dir(&rt.dir, p);
        let exists =
            self.fs.exists(&dir).map_err(|e| BrokerError::internal("install partition", e))?;
        if exists {
            self.fs
                .remove_dir_all(&dir)
                .map_err(|e| BrokerError::internal("install partition", e))?;
        }
        if let Some(last) = frontier {
            ConsumerOffset::new(self.fs.clone(), staged, rt.incarnation)
                .store(last)
                .map_err(|e| BrokerError::internal("install partition", e))?;
        }
        narad_log::copy::install(&*self.fs, staged, &dir)
            .map_err(|e| BrokerError::internal("install partition", e))
    }

    /// The partitions of the open topic `topic` whose directories exist on
    /// this node's disk (blocking I/O).
    pub fn partitions_on_disk(&self, topic: &Topic) -> Result<Vec<u32>, BrokerError> {
        let Some(rt) = self.get_open(topic.name(), topic.incarnation()) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for p in 0..topic.partitions() {
            let there = self
                .fs
                .exists(&partition_dir(&rt.dir, p))
                .map_err(|e| BrokerError::internal("list partition directories", e))?;
            if there {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// The fan-out cursors stored in partition `p`'s directory for the
    /// attachments `links` (child name, attach epoch): where each child's
    /// cursor will resume (blocking I/O). Attachments without a file are
    /// left out.
    pub fn fanout_cursors(
        &self,
        topic: &Topic,
        p: u32,
        links: &[(String, u64)],
    ) -> Result<Vec<crate::fanout::cursor_file::CursorState>, BrokerError> {
        let rt = self.topic(topic)?;
        let dir = partition_dir(&rt.dir, p);
        let mut out = Vec::new();
        for (child, epoch) in links {
            let found = crate::fanout::cursor_file::peek(&*self.fs, &dir, child, *epoch)
                .map_err(|e| BrokerError::internal("read fan-out cursor", e))?;
            out.extend(found);
        }
        Ok(out)
    }

    /// Stores `cursors` in partition `p`'s directory (a move's destination,
    /// after its install and before the flip, so the cursors resume where
    /// the source's were). A file already there that is further along is
    /// kept.
    pub fn seed_fanout_cursors(
        &self,
        topic: &Topic,
        p: u32,
        cursors: &[crate::fanout::cursor_file::CursorState],
    ) -> Result<(), BrokerError> {
        use crate::fanout::cursor_file;
        let rt = self.topic(topic)?;
        let dir = partition_dir(&rt.dir, p);
        for c in cursors {
            let path = cursor_file::path(&dir, c.epoch);
            let read = narad_fs::read_small_file(&*self.fs, &path, cursor_file::FILE_BYTES as u64);
            let held = match read {
                Ok(b) => cursor_file::decode(&b).filter(|h| h.epoch == c.epoch),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(BrokerError::internal("read fan-out cursor", e)),
            };
            if held.is_some_and(|h| h.next_offset >= c.next_offset) {
                continue;
            }
            cursor_file::store(&*self.fs, &path, *c)
                .map_err(|e| BrokerError::internal("store fan-out cursor", e))?;
        }
        Ok(())
    }

    /// Removes this node's copy of partition `p` of `topic`, a leftover of
    /// an ownership that moved away: closes its log if open and deletes its
    /// directory. `still_leftover` is asked again under the open lock
    /// (which [`Topics::install_partition`] and every open take), so a
    /// move back to this node never races the removal. Returns whether
    /// files were removed.
    pub fn discard_partition(
        &self,
        topic: &Topic,
        p: u32,
        still_leftover: impl FnOnce() -> bool,
    ) -> Result<bool, BrokerError> {
        let Some(rt) = self.get_open(topic.name(), topic.incarnation()) else {
            return Ok(false);
        };
        let _g = self.open_lock.lock().unwrap_or_else(|e| e.into_inner());
        if rt.is_closed() || !still_leftover() {
            return Ok(false);
        }
        let open = {
            let mut parts = rt.partitions.write().unwrap_or_else(|e| e.into_inner());
            parts.get_mut(p as usize).and_then(Option::take)
        };
        if let Some(part) = open {
            part.retire();
            self.open_logs.fetch_sub(1, Ordering::Relaxed);
        }
        rt.evicted.lock().unwrap_or_else(|e| e.into_inner()).remove(&p);
        let dir = partition_dir(&rt.dir, p);
        let exists =
            self.fs.exists(&dir).map_err(|e| BrokerError::internal("discard partition", e))?;
        if exists {
            self.fs
                .remove_dir_all(&dir)
                .map_err(|e| BrokerError::internal("discard partition", e))?;
        }
        Ok(exists)
    }

    /// Closes the logs of incarnation `incarnation` of topic `name`, or of
    /// an older one (queued commits fail), and deletes its files; a newer
    /// incarnation (the name was recreated meanwhile) is left alone, open
    /// or on disk. Later opens of `incarnation` or older are refused.
    pub fn remove(&self, name: &str, incarnation: u64) -> Result<(), BrokerError> {
        let mut removed = self.open_lock.lock().unwrap_or_else(|e| e.into_inner());
        let open = self.map.read().unwrap_or_else(|e| e.into_inner()).get(name).cloned();
        if let Some(rt) = open.filter(|rt| rt.incarnation > incarnation) {
            info!(
                topic = name,
                incarnation,
                newer = rt.incarnation,
                "a newer incarnation of the topic is open: left alone"
            );
            return Ok(());
        }
        let dir = self.root.join(name);
        // Without a newer incarnation open, a damaged marker names this one
        // or an older one (a newer one on disk would have been opened at
        // startup, which a damaged marker stops): its files go too.
        let on_disk = match self.read_marker(&dir, "delete topic") {
            Ok(found) => found,
            Err(_) => Some(None),
        };
        if let Some(Some(newer)) = on_disk.filter(|f| f.is_some_and(|id| id > incarnation)) {
            info!(
                topic = name,
                incarnation, newer, "the topic's files belong to a newer incarnation: left alone"
            );
            return Ok(());
        }
        let floor = removed.entry(name.to_owned()).or_insert(incarnation);
        *floor = (*floor).max(incarnation);
        self.close_and_clear(name, on_disk.is_some())?;
        info!(topic = name, incarnation, "deleted the topic's files");
        Ok(())
    }

    /// Closes whatever is open under `name` and deletes the directory if
    /// `on_disk` (call under the open lock).
    fn close_and_clear(&self, name: &str, on_disk: bool) -> Result<(), BrokerError> {
        let old = self.map.write().unwrap_or_else(|e| e.into_inner()).remove(name);
        if let Some(rt) = old {
            self.close_rt(&rt);
        }
        let dir = self.root.join(name);
        if on_disk {
            self.fs.remove_dir_all(&dir).map_err(|e| {
                BrokerError::internal("delete topic", format!("{}: {e}", dir.display()))
            })?;
        }
        Ok(())
    }

    /// Opens every partition of every topic found on disk that the
    /// metastore knows (recovering each log, so damage stops the start),
    /// and removes directories of topics the metastore does not know, or,
    /// with `defer_unknown` (a replicated metastore, which may be behind
    /// its group), leaves them and returns their names: they go only once
    /// the group's leader confirms the topic is gone
    /// ([`Topics::remove_confirmed_orphan`]).
    pub fn open_at_startup(
        &self,
        live: &[Arc<Topic>],
        defer_unknown: bool,
    ) -> Result<Vec<String>, BrokerError> {
        let names: HashMap<&str, &Arc<Topic>> = live.iter().map(|t| (t.name(), t)).collect();
        let mut deferred = Vec::new();
        if !self.fs.exists(&self.root).map_err(|e| BrokerError::internal("open topics", e))? {
            self.fs
                .create_dir_all(&self.root)
                .map_err(|e| BrokerError::internal("open topics", e))?;
            return Ok(deferred);
        }
        let entries =
            self.fs.list_dir(&self.root).map_err(|e| BrokerError::internal("open topics", e))?;
        for e in entries.into_iter().filter(|e| e.is_dir) {
            match names.get(e.name.as_str()) {
                None if defer_unknown => {
                    info!(topic = %e.name, "files of a topic this replica does not know: kept until the leader confirms it is gone");
                    deferred.push(e.name);
                }
                None => {
                    warn!(topic = %e.name, "removing files of a topic the metastore does not know (an unfinished delete)");
                    let _g = self.open_lock.lock().unwrap_or_else(|e| e.into_inner());
                    self.close_and_clear(&e.name, true)?;
                }
                Some(t) => {
                    let rt = self.topic(t).map_err(|err| match err {
                        BrokerError::TopicNotFound => BrokerError::internal(
                            "open topics",
                            format!(
                                "{} belongs to a newer incarnation of topic {} than the \
                                 metastore's {} (a rolled-back metastore?); refusing to \
                                 remove it",
                                self.root.join(&e.name).display(),
                                t.name(),
                                t.incarnation()
                            ),
                        ),
                        other => other,
                    })?;
                    let parts = self
                        .fs
                        .list_dir(&rt.dir)
                        .map_err(|e| BrokerError::internal("open topics", e))?;
                    for pe in parts.into_iter().filter(|p| p.is_dir) {
                        let Some(p) = pe.name.strip_prefix('p').and_then(|n| n.parse::<u32>().ok())
                        else {
                            continue;
                        };
                        if p < t.partitions() {
                            self.partition(t, p)?;
                        }
                    }
                }
            }
        }
        Ok(deferred)
    }

    /// Removes the directory `name` kept at start-up once the leader
    /// confirmed the topic is gone, unless this replica knows the topic by
    /// now (`known`, read under the open lock: then the directory is the
    /// topic's, or an older incarnation's that opening it replaces).
    /// Returns whether it removed anything.
    pub fn remove_confirmed_orphan(
        &self,
        name: &str,
        known: impl FnOnce() -> bool,
    ) -> Result<bool, BrokerError> {
        let _g = self.open_lock.lock().unwrap_or_else(|e| e.into_inner());
        if known() {
            return Ok(false);
        }
        let dir = self.root.join(name);
        let on_disk = self.fs.exists(&dir).map_err(|e| BrokerError::internal("delete topic", e))?;
        self.close_and_clear(name, on_disk)?;
        if on_disk {
            warn!(topic = name, "removed the files of a topic the leader confirmed deleted");
        }
        Ok(on_disk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incarnation_marker_matches_golden_bytes_and_rejects_damage() {
        let m = encode_marker(0x0102_0304_0506_0708);
        let golden: [u8; 24] = [
            b'N', b'T', b'O', b'P', b'I', b'N', b'C', b'1', 1, 2, 3, 4, 5, 6, 7, 8, //
            0x21, 0xEB, 0x92, 0x89, 0, 0, 0, 0, // crc32c, checked independently
        ];
        assert_eq!(m, golden);
        assert_eq!(decode_marker(&m), Some(0x0102_0304_0506_0708));
        for i in 0..24 {
            let mut bad = m;
            bad[i] ^= 0x40;
            assert_eq!(decode_marker(&bad), None, "byte {i}");
        }
    }
}
