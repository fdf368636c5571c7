//! Whether a peer is suspect (issue 36): a call to it failed in transport
//! (no dial, no reply in time, a lost connection, a ping unanswered while a
//! call was in flight) and no frame has come back from it since.
//!
//! One notion for the whole node: every call to the peer feeds it (the
//! dispatcher's commits and pings, Raft, forwarded consumes and acks), and
//! any answer from the peer clears it. What a caller does with it is the
//! caller's choice: forwarded consumes and acks and a topic's figures
//! answer at once rather than wait on a peer that is probably gone
//! ([`crate::Peer::suspicion`]); Raft and commits keep trying.
//!
//! A suspect peer is pinged every [`SUSPECT_PING_EVERY`] (the transport
//! does it): the first pong clears it. A suspicion nobody asked about or
//! renewed for [`SUSPECT_FORGET_AFTER`] is dropped (the next call tries
//! for real), so a peer gone for good is not dialled forever.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a suspect peer is pinged.
pub const SUSPECT_PING_EVERY: Duration = Duration::from_secs(1);

/// A suspicion nobody asked about or renewed this long is dropped.
pub const SUSPECT_FORGET_AFTER: Duration = Duration::from_secs(30);

/// Why and since when a peer is suspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspicion {
    /// When the call that made it suspect failed.
    pub since: Instant,
    /// That call's failure.
    pub why: String,
    /// When a caller last asked about it or a call renewed it.
    asked: Instant,
}

/// One peer's suspicion, if any.
#[derive(Debug, Default)]
pub(crate) struct SuspectState {
    inner: Mutex<Option<Suspicion>>,
}

impl SuspectState {
    /// A call failed in transport at `now`: true when the peer was not
    /// suspect before.
    pub(crate) fn mark(&self, why: &str, now: Instant) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match g.as_mut() {
            Some(s) => {
                s.asked = now;
                false
            }
            None => {
                *g = Some(Suspicion { since: now, why: why.to_owned(), asked: now });
                true
            }
        }
    }

    /// The peer answered: true when it was suspect.
    pub(crate) fn clear(&self) -> bool {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).take().is_some()
    }

    /// The suspicion, if any; a caller asking keeps it from being forgotten.
    pub(crate) fn ask(&self, now: Instant) -> Option<Suspicion> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let s = g.as_mut()?;
        s.asked = now;
        Some(s.clone())
    }

    /// Whether the peer is suspect, without counting as asked.
    pub(crate) fn is_suspect(&self) -> bool {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Drops a suspicion nobody asked about or renewed for
    /// [`SUSPECT_FORGET_AFTER`] by `now`: true when it did.
    pub(crate) fn forget_stale(&self, now: Instant) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_some_and(|s| now.duration_since(s.asked) >= SUSPECT_FORGET_AFTER) {
            *g = None;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_makes_a_peer_suspect_until_it_answers_or_nobody_asks() {
        let s = SuspectState::default();
        let t0 = Instant::now();
        assert!(s.ask(t0).is_none());
        assert!(s.mark("dial: no handshake", t0), "newly suspect");
        assert!(!s.mark("timeout", t0 + Duration::from_secs(1)), "already suspect");
        let got = s.ask(t0 + Duration::from_secs(2)).unwrap();
        assert_eq!((got.since, got.why.as_str()), (t0, "dial: no handshake"), "the first failure");
        assert!(!s.forget_stale(t0 + SUSPECT_FORGET_AFTER), "asked 2 s in");
        assert!(s.forget_stale(t0 + Duration::from_secs(2) + SUSPECT_FORGET_AFTER));
        assert!(!s.is_suspect());
        s.mark("timeout", t0);
        assert!(s.clear(), "an answer clears it");
        assert!(!s.clear() && !s.is_suspect());
    }
}
