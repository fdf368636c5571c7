//! Every bound of the data plane, in one place.

use std::time::Duration;

/// A member silent for more than this is dead (narad-meta's, where
/// placement lives).
pub use narad_meta::limits::MEMBER_DEAD_AFTER;

/// Records per destination the dispatch window aims for; a smaller batch
/// lingers while other commits run.
pub const DISPATCH_TARGET_PER_DEST: usize = 64;
/// The window's floor (and the floor of a destination's queue cap).
pub const DISPATCH_WINDOW_MIN: usize = 4_096;
/// The window's hard cap.
pub const DISPATCH_WINDOW_MAX: usize = 65_536;
/// The dispatcher's dense strip of marks covers at most this many windows;
/// a record not yet committed that falls out of its front is tracked
/// sparsely (it pins the checkpoint, never the reader).
pub const DISPATCH_LOOKAHEAD_WINDOWS: usize = 16;
/// Commits in flight at once (hung commits aside).
pub const DISPATCH_COMMIT_SLOTS: usize = 16;
/// A commit in flight this long is hung.
pub const DISPATCH_HUNG_AFTER: Duration = Duration::from_secs(1);
/// The longest a small batch lingers.
pub const DISPATCH_LINGER_MAX: Duration = Duration::from_millis(50);
/// A failing destination's owner is pinged this often.
pub const DISPATCH_FAILURE_BACKOFF: Duration = Duration::from_secs(1);
/// A failing destination no record waits for is forgotten after this long
/// (its owner is no longer pinged).
pub const DISPATCH_FAILING_FORGET_AFTER: Duration = Duration::from_secs(60);
/// A refused commit's destination takes nothing for this long, doubling
/// with each refusal in a row ...
pub const DISPATCH_REFUSAL_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// ... up to this; a commit resets it.
pub const DISPATCH_REFUSAL_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Records of a destination failing this long go to a sibling.
pub const DISPATCH_REROUTE_GRACE: Duration = Duration::from_secs(3);
/// Skipped records are read again at least this often.
pub const DISPATCH_RESCAN_INTERVAL: Duration = Duration::from_secs(1);
/// An unresolvable destination is looked up again after this.
pub const DISPATCH_UNRESOLVED_RETRY: Duration = Duration::from_millis(10);
/// The dispatcher's idle backstop (a durable record wakes it at once).
pub const DISPATCH_IDLE_BACKSTOP: Duration = Duration::from_millis(10);
/// Budget of a full commit.
pub const DISPATCH_COMMIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Budget of a ping of a failing destination's owner, and of a trial
/// commit.
pub const DISPATCH_PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Encoded bytes per commit to a remote owner (half the 16 MiB frame).
pub const DISPATCH_REMOTE_BATCH_BYTES: usize = 8 << 20;
/// Encoded bytes per commit to any owner, the local one included (a tighter
/// owner budget, e.g. [`DISPATCH_REMOTE_BATCH_BYTES`], wins). Well under the
/// partition log's `MAX_COMMIT_BYTES` (which refuses a larger commit
/// whole), and the log's drain size, so one commit is one commit cycle.
/// A commit always carries at least one record.
pub const DISPATCH_COMMIT_MAX_BYTES: usize = 64 << 20;
/// Encoded bytes of records held (queued or in flight): the reader stops
/// reading new records at this, as it does at the record window, so a
/// backlog of big records cannot fill memory (at most this plus one record).
pub const DISPATCH_WINDOW_MAX_BYTES: usize = 256 << 20;
/// Encoded bytes one destination may queue: a full commit in flight and
/// one full commit waiting.
pub const DISPATCH_DEST_QUEUE_MAX_BYTES: usize = 2 * DISPATCH_COMMIT_MAX_BYTES;

const _: () = {
    assert!(DISPATCH_WINDOW_MIN <= DISPATCH_WINDOW_MAX);
    assert!(DISPATCH_TARGET_PER_DEST * DISPATCH_COMMIT_SLOTS <= DISPATCH_WINDOW_MIN);
    assert!(DISPATCH_LINGER_MAX.as_millis() < DISPATCH_HUNG_AFTER.as_millis());
    assert!(DISPATCH_PROBE_TIMEOUT.as_secs() < DISPATCH_COMMIT_TIMEOUT.as_secs());
    assert!(DISPATCH_REMOTE_BATCH_BYTES <= DISPATCH_COMMIT_MAX_BYTES);
    // The encoded size counts key + payload + 32, more than the log counts.
    assert!((DISPATCH_COMMIT_MAX_BYTES as u64) * 4 <= narad_log::limits::MAX_COMMIT_BYTES);
    assert!(DISPATCH_COMMIT_MAX_BYTES as u64 <= narad_log::limits::CYCLE_DRAIN_BYTES);
    assert!(DISPATCH_DEST_QUEUE_MAX_BYTES * 2 <= DISPATCH_WINDOW_MAX_BYTES);
};

/// Consumer frontiers are persisted at most this often.
pub const FRONTIER_PERSIST_INTERVAL: Duration = Duration::from_millis(100);
/// Expired leases are released (and waiters woken) at least this often.
pub const EXPIRY_PURGE_INTERVAL: Duration = Duration::from_secs(1);
/// Retention runs this often.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(60);

/// How often partition logs are checked for idleness (SPEC §5.7).
pub const IDLE_EVICTION_INTERVAL: Duration = Duration::from_secs(60);

/// The shortest non-zero `storage.idle_log_eviction_ms` (SPEC §5.7).
pub const MIN_IDLE_LOG_EVICTION_MS: u64 = 60_000;

/// A fan-out cursor that finds no file of its link's epoch (its parent
/// partition's owner could not anchor it at the attach: it was down, or the
/// partition came later) starts at the first record committed at or after
/// the link's attach time less this margin. Commit times are the owner's
/// wall clock and the attach time another node's: without the margin, an
/// owner whose clock runs behind would skip records it committed after the
/// attach. With it the child may get up to this much of the parent's
/// records from before the attach (extra copies, never a gap) while the
/// clocks agree within it.
pub const FANOUT_ANCHOR_CLOCK_MARGIN: Duration = Duration::from_secs(300);

/// The default `storage.idle_log_eviction_ms`: 30 minutes.
pub const DEFAULT_IDLE_LOG_EVICTION_MS: u64 = 1_800_000;
/// Per-partition gauges are refreshed this often.
pub const METRICS_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// The metrics poll walks the data directory (for `data_dir_size_bytes`)
/// on about one poll per this many entries it met last time: a stat per
/// entry every 5 s was a quarter of an idle node's CPU with 1,000 topics.
pub const DATA_DIR_WALK_ENTRIES_PER_POLL: u64 = 1_000;
/// ... and at least once every this many polls plus one (1 min).
pub const DATA_DIR_WALK_MAX_SKIP: u32 = 11;
/// A batch consume returns at most this many payload bytes.
pub const CONSUME_BATCH_BYTES: usize = 8 << 20;
/// At most one WARN per partition this often for a consume that cannot
/// read it (a client polling a bad partition must not flood the log).
pub const CONSUME_ERROR_WARN_EVERY: Duration = Duration::from_secs(10);
/// A batch consume returns at most this many messages.
pub const CONSUME_BATCH_MAX: usize = 100;

/// A fan-out cursor reads at most this many parent records at a time.
pub const FANOUT_SLAB_RECORDS: usize = 4_096;
/// ... and about this many bytes.
pub const FANOUT_SLAB_BYTES: u64 = 4 << 20;
/// An idle cursor re-checks at least this often (a commit wakes it first).
pub const FANOUT_IDLE_WAIT: Duration = Duration::from_secs(1);
/// An idle delayed cursor sleeps at most this long at a time.
pub const FANOUT_DELAY_SLEEP_MAX: Duration = Duration::from_secs(30);
/// Wait after a failed parent read or a failed cursor store.
pub const FANOUT_RETRY_BACKOFF: Duration = Duration::from_secs(1);
/// A child partition whose commit failed (or that has no owner) is tried
/// again by that cursor after this long, doubling with each failure in a
/// row up to [`FANOUT_COMMIT_BACKOFF_MAX`], reset by a commit.
pub const FANOUT_COMMIT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait between two tries of a failing child partition.
pub const FANOUT_COMMIT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// After this long of failed commits into a child partition whose owner is
/// alive, a cursor moves its keyless records to a sibling (the dispatcher's
/// grace: the same rule for produce and fan-out).
pub const FANOUT_REROUTE_GRACE: Duration = DISPATCH_REROUTE_GRACE;
/// A cursor has at most this many child commits in flight (one per child
/// partition of its slab).
pub const FANOUT_COMMITS_IN_FLIGHT: usize = 8;
/// At most one "fan-out commit failed" WARN per cursor this often (with
/// the count of those held back).
pub const FANOUT_COMMIT_WARN_EVERY: Duration = Duration::from_secs(10);
/// How often links are reconciled with running cursors.
pub const FANOUT_RECONCILE_INTERVAL: Duration = Duration::from_secs(1);
/// The wait before restarting a fan-out cursor that ended while its link
/// holds; it doubles with each restart in a row, up to
/// [`FANOUT_RESTART_BACKOFF_MAX`].
pub const FANOUT_RESTART_BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest wait between restarts of a fan-out cursor.
pub const FANOUT_RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a link change waits for each cursor of a dissolved link to
/// stop before it removes the file anyway.
pub const FANOUT_STOP_WAIT: Duration = Duration::from_secs(5);
/// Reconcile passes between two sweeps for orphaned cursor files (the
/// first pass after start sweeps too).
pub const FANOUT_SWEEP_EVERY: u64 = 30;

const _: () = {
    assert!(FANOUT_COMMIT_BACKOFF_MIN.as_millis() > 0);
    assert!(FANOUT_COMMIT_BACKOFF_MIN.as_millis() <= FANOUT_COMMIT_BACKOFF_MAX.as_millis());
    assert!(FANOUT_COMMITS_IN_FLIGHT >= 1);
    assert!(FANOUT_IDLE_WAIT.as_millis() <= FANOUT_DELAY_SLEEP_MAX.as_millis());
    assert!(FANOUT_SWEEP_EVERY >= 1);
    assert!(FANOUT_RESTART_BACKOFF_MIN.as_millis() <= FANOUT_RESTART_BACKOFF_MAX.as_millis());
};
