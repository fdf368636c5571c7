//! Membership (SPEC §7.2): every node's heartbeat, and the controller that
//! runs on the leader.
//!
//! [`Membership::start`] runs two tasks until [`Membership::stop`]:
//!
//! * **heartbeat**, on every node, at once and then every
//!   [`HEARTBEAT_INTERVAL`]: upserts this node's member record (MemberJoin:
//!   alive, `last_heartbeat` = the clock's wall time in Unix seconds) through
//!   the metastore, whose replicator forwards it to the leader when this node
//!   is not the leader. A member marked dead comes back alive with its next
//!   heartbeat (the upsert replaces the record);
//! * **controller**, every [`CONTROLLER_INTERVAL`], acting only while
//!   [`LeaderView::is_leader`]: proposes [`crate::controller::plan`]'s
//!   commands one by one (marks overdue members dead, places unassigned
//!   partitions). Overdue is judged by the leader's own monotonic clock:
//!   how long a member's heartbeat value has not changed
//!   ([`crate::heartbeat_ages`]), never by comparing the member's clock
//!   with the leader's. It stops at the first refusal or on losing leadership; the
//!   next tick plans again from the state as it then is.
//!
//! Proposals block (a commit waits for an fsync or for consensus), so both
//! run on blocking threads; stopping does not wait for one in flight.
//! Failures are counted in `narad_errors_total{component="cluster",
//! kind="heartbeat"|"controller"}` and logged at WARN, at most once per
//! [`MEMBERSHIP_WARN_INTERVAL`] each (the rest counted into the next line).
//! Every node refreshes `narad_cluster_members{status="alive"|"dead"}` from
//! its metastore after each heartbeat and each controller tick.

use std::sync::{Arc, Mutex};

use narad_clock::ClockRef;
use narad_meta::{Command, Member, MemberStatus, MetaError, MetaStore, MetaWriter};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior, interval_at};

use crate::auth::WarnLimiter;
use crate::controller::plan_with;
use crate::heartbeat_ages::HeartbeatAges;
use crate::limits::{
    CONTROLLER_INTERVAL, HEARTBEAT_INTERVAL, MEMBER_DEAD_AFTER, MEMBERSHIP_WARN_INTERVAL,
};

/// Whether this node currently leads the control plane (the Raft node on
/// a cluster; always true where one node decides alone).
pub trait LeaderView: Send + Sync {
    /// True while this node is the leader.
    fn is_leader(&self) -> bool;
}

/// `{status}` of `cluster_members`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberStatusLabels {
    /// `alive` or `dead`.
    pub status: String,
}

/// The running heartbeat and controller tasks. Dropping it stops them too
/// (without waiting).
#[derive(Debug)]
pub struct Membership {
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// What both tasks share.
struct Ctx {
    meta: Arc<MetaStore>,
    me: Member,
    leader: Arc<dyn LeaderView>,
    clock: ClockRef,
    /// While this node leads: when each member's heartbeat last changed.
    ages: Mutex<HeartbeatAges>,
    members: Family<MemberStatusLabels, Gauge>,
    errors: ErrorSink,
    heartbeat_warn: WarnLimiter,
    controller_warn: WarnLimiter,
}

/// Where membership counts its failures: called with `(component, kind)`
/// (`"cluster"`, `"heartbeat"` or `"controller"`). The server passes the
/// broker's `errors_total` family, so this crate needs no broker types.
pub type ErrorSink = Arc<dyn Fn(&str, &str) + Send + Sync>;

impl Membership {
    /// Starts heartbeating `me` (its `status` and `last_heartbeat` are
    /// stamped at each beat) and, while `leader` says so, the controller.
    /// Registers `cluster_members{status}` in `registry`; failures are
    /// handed to `errors` as `("cluster", kind)` (the server counts them in
    /// the broker's `errors_total{component, kind}`).
    /// Must be called inside a tokio runtime.
    pub fn start(
        meta: Arc<MetaStore>,
        me: Member,
        leader: Arc<dyn LeaderView>,
        clock: ClockRef,
        registry: &mut Registry,
        errors: ErrorSink,
    ) -> Membership {
        let members = Family::<MemberStatusLabels, Gauge>::default();
        registry.register(
            "cluster_members",
            "Cluster members by status, as this node's metastore holds them",
            members.clone(),
        );
        let ctx = Arc::new(Ctx {
            meta,
            me,
            leader,
            clock,
            ages: Mutex::default(),
            members,
            errors,
            heartbeat_warn: WarnLimiter::every(MEMBERSHIP_WARN_INTERVAL),
            controller_warn: WarnLimiter::every(MEMBERSHIP_WARN_INTERVAL),
        });
        ctx.refresh_members();
        let (stop, stopped) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(heartbeat_loop(ctx.clone(), stopped.clone())),
            tokio::spawn(controller_loop(ctx, stopped)),
        ];
        Membership { stop, tasks: Mutex::new(tasks) }
    }

    /// Stops both tasks and waits for them to end (a proposal already on a
    /// blocking thread finishes there on its own).
    pub async fn stop(&self) {
        self.stop.send_replace(true);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "membership task failed");
            }
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl Ctx {
    fn now_s(&self) -> i64 {
        (self.clock.wall_ms() / 1000) as i64
    }

    /// Sets `cluster_members{status}` from the local metastore.
    fn refresh_members(&self) {
        let state = self.meta.snapshot();
        let alive = state.members().filter(|m| m.status == MemberStatus::Alive).count();
        let dead = state.members().count() - alive;
        for (status, n) in [("alive", alive), ("dead", dead)] {
            let labels = MemberStatusLabels { status: status.to_owned() };
            self.members.get_or_create(&labels).set(n as i64);
        }
    }

    /// Counts a failure of `activity` and logs it, rate-limited.
    fn failed(&self, activity: Activity, error: &dyn std::fmt::Display) {
        let kind = activity.kind();
        (self.errors)("cluster", kind);
        let limiter = match activity {
            Activity::Heartbeat => &self.heartbeat_warn,
            Activity::Controller => &self.controller_warn,
        };
        if let Some(suppressed) = limiter.allow() {
            tracing::warn!(
                node_id = %self.me.id,
                kind,
                error = %error,
                suppressed,
                "cluster membership {kind} failed"
            );
        }
    }
}

impl Ctx {
    /// The `failing`-th failed heartbeat in a row: counted always, at WARN
    /// from the second (a member is marked dead only after many missed
    /// beats), at INFO when it is the first.
    fn beat_failed(&self, failing: u32, error: &dyn std::fmt::Display) {
        if failing >= 2 {
            self.failed(Activity::Heartbeat, error);
            return;
        }
        (self.errors)("cluster", Activity::Heartbeat.kind());
        tracing::info!(node_id = %self.me.id, error = %error,
            "cluster membership heartbeat failed; the next beat retries");
    }
}

/// What failed, for the error counter's `kind` and the log.
#[derive(Debug, Clone, Copy)]
enum Activity {
    Heartbeat,
    Controller,
}

impl Activity {
    fn kind(self) -> &'static str {
        match self {
            Activity::Heartbeat => "heartbeat",
            Activity::Controller => "controller",
        }
    }
}

/// Resolves once the stop flag is set or its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Runs `f` on a blocking thread; `None` when stopped first.
async fn blocking<T: Send + 'static>(
    stop: &mut watch::Receiver<bool>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<Result<T, tokio::task::JoinError>> {
    let task = tokio::task::spawn_blocking(f);
    tokio::select! {
        joined = task => Some(joined),
        () = stopped(stop) => None,
    }
}

/// The `last_heartbeat` of a beat sent at wall-clock second `now_s`
/// after one carrying `last_sent`: the clock's value, but always above the
/// last one sent, so a clock stepped back never repeats a value and every
/// beat is a change the leader's [`HeartbeatAges`] sees (a repeat could
/// equal the value it held and look like silence: the metastore
/// simulation's seeds 3601 and 13789). The value runs ahead of a clock
/// stepped back until the clock catches up; nothing compares it with
/// another clock.
///
/// [`HeartbeatAges`]: crate::heartbeat_ages::HeartbeatAges
pub fn beat_value(now_s: i64, last_sent: Option<i64>) -> i64 {
    last_sent.map_or(now_s, |last| now_s.max(last.saturating_add(1)))
}

async fn heartbeat_loop(ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>) {
    let mut tick = interval_at(Instant::now(), HEARTBEAT_INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // A previous life's beats count as sent (a restart after a step back).
    let mut last_sent = ctx.meta.snapshot().member(&ctx.me.id).map(|m| m.last_heartbeat);
    // Consecutive failed beats: one alone is routine (an election, a
    // leader handing over as it stops) and is logged at INFO.
    let mut failing = 0u32;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stopped(&mut stop) => return,
        }
        let value = beat_value(ctx.now_s(), last_sent);
        last_sent = Some(value);
        let member =
            Member { status: MemberStatus::Alive, last_heartbeat: value, ..ctx.me.clone() };
        let meta = ctx.meta.clone();
        match blocking(&mut stop, move || meta.member_join(member)).await {
            None => return,
            Some(Ok(Ok(_))) => failing = 0,
            Some(Ok(Err(e))) => {
                failing += 1;
                ctx.beat_failed(failing, &e);
            }
            Some(Err(panicked)) => {
                failing += 1;
                ctx.beat_failed(failing, &panicked);
            }
        }
        ctx.refresh_members();
    }
}

async fn controller_loop(ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>) {
    let mut tick = interval_at(Instant::now() + CONTROLLER_INTERVAL, CONTROLLER_INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stopped(&mut stop) => return,
        }
        if ctx.leader.is_leader() {
            let (c, halt) = (ctx.clone(), stop.clone());
            match blocking(&mut stop, move || controller_tick(&c, &halt)).await {
                None => return,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => ctx.failed(Activity::Controller, &e),
                Some(Err(panicked)) => ctx.failed(Activity::Controller, &panicked),
            }
        } else {
            ctx.ages.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
        ctx.refresh_members();
    }
}

/// One controller tick: plan on the current state and propose each
/// command, while still leader and not stopped. Blocking.
fn controller_tick(ctx: &Ctx, stop: &watch::Receiver<bool>) -> Result<(), MetaError> {
    let state = ctx.meta.snapshot();
    let now = ctx.clock.mono();
    let commands = {
        let mut ages = ctx.ages.lock().unwrap_or_else(|p| p.into_inner());
        ages.observe(&state, now);
        plan_with(&state, &|m| ages.overdue(m, now))
    };
    for command in commands {
        if *stop.borrow() || !ctx.leader.is_leader() {
            return Ok(());
        }
        match &command {
            // An operator should look: a node has been silent for 30 s
            // (openraft's own RPC failures to it are logged at DEBUG).
            Command::MemberDead(d) => tracing::warn!(
                member = %d.id,
                silent_over_s = MEMBER_DEAD_AFTER.as_secs(),
                "marking cluster member dead: no heartbeat"
            ),
            Command::AssignPartitions(a) => tracing::info!(
                topic = %a.topic,
                partitions = a.assignments.len(),
                "assigning unassigned partitions"
            ),
            _ => {}
        }
        match ctx.meta.propose(command) {
            // The member heartbeated after this tick's view: it is alive,
            // and the rest of the plan still holds (it only left the
            // member out of the ring).
            Err(MetaError::Conflict(why)) => {
                tracing::info!(reason = %why, "member not marked dead: it heartbeated meanwhile");
            }
            other => {
                other?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "members_tests.rs"]
mod tests;
