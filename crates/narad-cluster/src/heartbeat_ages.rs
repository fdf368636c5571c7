//! How long each member has been silent, by the leader's own monotonic
//! clock (SPEC §7.2's dead-marking).
//!
//! A heartbeat carries its sender's wall-clock time (`last_heartbeat`,
//! Unix seconds). Comparing that with the leader's wall clock would let a
//! node's clock decide its fate: one 30 s behind would look silent while
//! it beats (marked dead, revived, marked dead again), one ahead would
//! stay alive for its skew after dying. So the leader never compares
//! clocks: it notes, on its monotonic clock, when it first saw each
//! member's `last_heartbeat` take its current value, and a member is
//! overdue once that value has not changed for [`MEMBER_DEAD_AFTER`].
//! Any change counts, and the value itself stays in the record only to
//! tell beats apart (and for `MemberDead`'s check that no beat landed
//! since the plan); so a sender never repeats one (`members::beat_value`:
//! always above its last, even when its clock stepped back).
//!
//! The ages live only on the leader, in memory: a node that starts to
//! lead (or leads again) knows nothing of the past and gives every member
//! a full [`MEMBER_DEAD_AFTER`] from its first look, so a member that died
//! around a leader change is marked at most that much later. The error of
//! one observation is at most one controller tick.

use std::collections::HashMap;
use std::time::Duration;

use narad_meta::{Member, MetaState};

use crate::limits::MEMBER_DEAD_AFTER;

/// The leader's record of when each member's heartbeat last changed.
#[derive(Debug, Default)]
pub struct HeartbeatAges {
    /// Member id → (its `last_heartbeat` as last seen, the monotonic time
    /// it was first seen with that value).
    seen: HashMap<String, (i64, Duration)>,
}

impl HeartbeatAges {
    /// Notes `state`'s heartbeats at monotonic time `now`: a member seen
    /// for the first time, or whose `last_heartbeat` changed, was heard
    /// from at `now`. Members gone from `state` are forgotten.
    pub fn observe(&mut self, state: &MetaState, now: Duration) {
        self.seen.retain(|id, _| state.member(id).is_some());
        for m in state.members() {
            match self.seen.get_mut(&m.id) {
                Some((value, _)) if *value == m.last_heartbeat => {}
                Some(entry) => *entry = (m.last_heartbeat, now),
                None => {
                    self.seen.insert(m.id.clone(), (m.last_heartbeat, now));
                }
            }
        }
    }

    /// Whether `m` has been silent for more than [`MEMBER_DEAD_AFTER`] at
    /// monotonic time `now`. A member (or a value) not observed yet is not
    /// overdue: it gets its full grace from the next observation.
    pub fn overdue(&self, m: &Member, now: Duration) -> bool {
        match self.seen.get(&m.id) {
            Some((value, since)) if *value == m.last_heartbeat => {
                now.saturating_sub(*since) > MEMBER_DEAD_AFTER
            }
            _ => false,
        }
    }

    /// Forgets everything (this node stopped leading): the next term
    /// starts every member at a full grace.
    pub fn clear(&mut self) {
        self.seen.clear();
    }
}
