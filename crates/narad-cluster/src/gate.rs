//! Who may open a node-RPC connection before it has authenticated: caps
//! on connections not yet authenticated, per source and overall, and a
//! failure budget per source, so that an online guess at the cluster
//! secret costs a connection and, soon, a back-off.
//!
//! * A *source* is an IPv4 address or an IPv6 /64 (one host's addresses).
//! * At most [`MAX_UNAUTHENTICATED_PER_SOURCE`] connections of one source and
//!   [`MAX_UNAUTHENTICATED`] in all may be in the QUIC handshake or the
//!   authentication exchange at once; more are refused in the handshake.
//!   Above [`RETRY_ABOVE_UNAUTHENTICATED`], a source whose address QUIC has
//!   not validated is sent a Retry first: a spoofed address never answers.
//! * Every connection that does not authenticate (a wrong or missing proof,
//!   malformed bytes, the deadline, an abandoned exchange) costs its source
//!   one failure of a budget of [`AUTH_FAILURE_BURST`] that refills one per
//!   [`AUTH_FAILURE_REFILL`]; a source without budget is refused until it
//!   refills.
//! * A peer address (IP and port) that authenticated before is *known*: it
//!   is held to neither the back-off nor the overall cap (a node on the same
//!   host or behind the same address as an attacker keeps reconnecting),
//!   only to address validation while the node is busy. One failure makes
//!   it unknown again.
//!
//! Invariants: `total` is the sum of every source's `pending`; a ticket
//! gives back its place exactly once (on drop); the tables are bounded by
//! [`AUTH_SOURCES_TRACKED`] entries each.

use crate::limits::{
    AUTH_FAILURE_BURST, AUTH_FAILURE_REFILL, AUTH_SOURCES_TRACKED, MAX_UNAUTHENTICATED,
    MAX_UNAUTHENTICATED_PER_SOURCE, RETRY_ABOVE_UNAUTHENTICATED,
};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a known address stays known without authenticating again.
const KNOWN_FOR: Duration = Duration::from_secs(24 * 3600);

/// What to do with a new connection attempt.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Go on with the handshake; the ticket holds its place.
    Admit(Ticket),
    /// Ask the client to prove its address first (QUIC Retry).
    Retry,
    /// Refuse it in the handshake, for this reason (a metrics label).
    Refuse(&'static str),
}

#[derive(Debug)]
struct Source {
    pending: usize,
    /// Failures the source may still make (fractional while refilling).
    budget: f64,
    refilled: Instant,
}

impl Source {
    fn new(now: Instant) -> Source {
        Source { pending: 0, budget: f64::from(AUTH_FAILURE_BURST), refilled: now }
    }

    fn refill(&mut self, now: Instant) {
        let gained =
            now.duration_since(self.refilled).as_secs_f64() / AUTH_FAILURE_REFILL.as_secs_f64();
        self.budget = (self.budget + gained).min(f64::from(AUTH_FAILURE_BURST));
        self.refilled = now;
    }

    fn idle(&self) -> bool {
        self.pending == 0 && self.budget >= f64::from(AUTH_FAILURE_BURST)
    }
}

#[derive(Debug, Default)]
struct State {
    total: usize,
    sources: HashMap<IpAddr, Source>,
    known: HashMap<SocketAddr, Instant>,
}

/// The admission state of one endpoint.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    state: Mutex<State>,
}

/// The source a peer address belongs to.
fn source_of(addr: SocketAddr) -> IpAddr {
    match addr.ip().to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & (!0u128 << 64))),
        v4 => v4,
    }
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides on a connection attempt from `addr` (`validated`: QUIC has
    /// proven the client owns the address).
    pub(crate) fn admit(self: &Arc<Self>, addr: SocketAddr, validated: bool) -> Admission {
        self.admit_at(addr, validated, Instant::now())
    }

    fn admit_at(self: &Arc<Self>, addr: SocketAddr, validated: bool, now: Instant) -> Admission {
        let mut s = self.lock();
        let known = s.known.get(&addr).is_some_and(|t| now.duration_since(*t) < KNOWN_FOR);
        let busy = s.total >= RETRY_ABOVE_UNAUTHENTICATED;
        if busy && !validated {
            return Admission::Retry;
        }
        let key = source_of(addr);
        if !known {
            if s.total >= MAX_UNAUTHENTICATED {
                return Admission::Refuse("busy");
            }
            if !s.sources.contains_key(&key) && s.sources.len() >= AUTH_SOURCES_TRACKED {
                s.sources.retain(|_, src| {
                    src.refill(now);
                    !src.idle()
                });
                if s.sources.len() >= AUTH_SOURCES_TRACKED {
                    return Admission::Refuse("busy");
                }
            }
            let src = s.sources.entry(key).or_insert_with(|| Source::new(now));
            src.refill(now);
            if src.budget < 1.0 {
                return Admission::Refuse("backoff");
            }
            if src.pending >= MAX_UNAUTHENTICATED_PER_SOURCE {
                return Admission::Refuse("busy");
            }
        }
        s.sources.entry(key).or_insert_with(|| Source::new(now)).pending += 1;
        s.total += 1;
        Admission::Admit(Ticket { gate: self.clone(), addr, key, done: false })
    }

    /// Connections not yet authenticated.
    pub(crate) fn unauthenticated(&self) -> usize {
        self.lock().total
    }

    fn release(&self, key: IpAddr) {
        let mut s = self.lock();
        s.total = s.total.saturating_sub(1);
        if let Some(src) = s.sources.get_mut(&key) {
            src.pending = src.pending.saturating_sub(1);
            if src.idle() {
                s.sources.remove(&key);
            }
        }
    }
}

/// A place among the connections not yet authenticated.
#[derive(Debug)]
pub(crate) struct Ticket {
    gate: Arc<Gate>,
    addr: SocketAddr,
    key: IpAddr,
    done: bool,
}

impl Ticket {
    /// The peer authenticated: its address is known from now on.
    pub(crate) fn succeeded(mut self) {
        let now = Instant::now();
        let mut s = self.gate.lock();
        if s.known.len() >= AUTH_SOURCES_TRACKED && !s.known.contains_key(&self.addr) {
            s.known.retain(|_, t| now.duration_since(*t) < KNOWN_FOR);
            if s.known.len() >= AUTH_SOURCES_TRACKED
                && let Some(oldest) = s.known.iter().min_by_key(|(_, t)| **t).map(|(a, _)| *a)
            {
                s.known.remove(&oldest);
            }
        }
        s.known.insert(self.addr, now);
        drop(s);
        self.done = true;
    }

    /// The peer did not authenticate: it costs its source one failure and
    /// its address is no longer known.
    pub(crate) fn failed(mut self) {
        self.charge(Instant::now());
    }

    fn charge(&mut self, now: Instant) {
        let mut s = self.gate.lock();
        s.known.remove(&self.addr);
        let src = s.sources.entry(self.key).or_insert_with(|| Source::new(now));
        src.refill(now);
        src.budget = (src.budget - 1.0).max(0.0);
        drop(s);
        self.done = true;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            // Neither outcome was reported (the task ended early): a
            // connection that did not authenticate.
            self.charge(Instant::now());
        }
        self.gate.release(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn admitted(a: Admission) -> Ticket {
        match a {
            Admission::Admit(t) => t,
            other => panic!("expected admission, got {other:?}"),
        }
    }

    fn refused(a: Admission) -> &'static str {
        match a {
            Admission::Refuse(r) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_source_is_capped_in_connections_not_yet_authenticated() {
        let g = Arc::new(Gate::default());
        let held: Vec<Ticket> = (0..MAX_UNAUTHENTICATED_PER_SOURCE)
            .map(|i| admitted(g.admit(addr(&format!("10.0.0.1:{}", 1000 + i)), true)))
            .collect();
        assert_eq!(refused(g.admit(addr("10.0.0.1:2000"), true)), "busy");
        // Another source is not affected.
        drop(admitted(g.admit(addr("10.0.0.2:1000"), true)));
        drop(held);
        assert_eq!(g.unauthenticated(), 0);
        drop(admitted(g.admit(addr("10.0.0.1:2000"), true)));
    }

    #[test]
    fn every_source_together_is_capped_and_unvalidated_addresses_get_a_retry_when_busy() {
        let g = Arc::new(Gate::default());
        let mut held = Vec::new();
        for i in 0..MAX_UNAUTHENTICATED {
            let a = addr(&format!("10.1.{}.{}:7000", i / 200, i % 200 + 1));
            held.push(admitted(g.admit(a, true)));
        }
        assert_eq!(g.unauthenticated(), MAX_UNAUTHENTICATED);
        assert_eq!(refused(g.admit(addr("10.2.0.1:7000"), true)), "busy");
        assert!(matches!(g.admit(addr("10.2.0.1:7000"), false), Admission::Retry));
        held.truncate(RETRY_ABOVE_UNAUTHENTICATED - 1);
        drop(admitted(g.admit(addr("10.2.0.1:7000"), false)));
    }

    #[test]
    fn failed_proofs_spend_a_budget_that_refills_over_time() {
        let g = Arc::new(Gate::default());
        let t0 = Instant::now();
        for i in 0..AUTH_FAILURE_BURST {
            let mut t = admitted(g.admit_at(addr(&format!("10.0.0.9:{}", 100 + i)), true, t0));
            t.charge(t0);
        }
        assert_eq!(refused(g.admit_at(addr("10.0.0.9:999"), true, t0)), "backoff");
        // One refill later, one more guess; then the back-off again.
        let t1 = t0 + AUTH_FAILURE_REFILL;
        let mut t = admitted(g.admit_at(addr("10.0.0.9:999"), true, t1));
        t.charge(t1);
        assert_eq!(refused(g.admit_at(addr("10.0.0.9:998"), true, t1)), "backoff");
    }

    #[test]
    fn a_known_address_passes_its_sources_back_off_until_it_fails_once() {
        let g = Arc::new(Gate::default());
        let node = addr("127.0.0.1:7101");
        admitted(g.admit(node, true)).succeeded();
        for i in 0..AUTH_FAILURE_BURST {
            admitted(g.admit(addr(&format!("127.0.0.1:{}", 40000 + i)), true)).failed();
        }
        assert_eq!(refused(g.admit(addr("127.0.0.1:40999"), true)), "backoff");
        admitted(g.admit(node, true)).succeeded();
        admitted(g.admit(node, true)).failed();
        assert_eq!(refused(g.admit(node, true)), "backoff");
    }

    #[test]
    fn a_ticket_dropped_without_an_outcome_counts_as_a_failure() {
        let g = Arc::new(Gate::default());
        for i in 0..AUTH_FAILURE_BURST {
            drop(admitted(g.admit(addr(&format!("10.0.0.5:{}", 100 + i)), true)));
        }
        assert_eq!(refused(g.admit(addr("10.0.0.5:1"), true)), "backoff");
        assert_eq!(g.unauthenticated(), 0);
    }

    #[test]
    fn ipv6_sources_are_a_64_bit_prefix() {
        assert_eq!(source_of(addr("[2001:db8::1]:1")), source_of(addr("[2001:db8::ffff:2]:9")));
        assert_ne!(source_of(addr("[2001:db8::1]:1")), source_of(addr("[2001:db8:0:1::1]:1")));
        assert_eq!(
            source_of(addr("[::ffff:10.0.0.1]:1")),
            source_of(addr("10.0.0.1:2")),
            "a v4-mapped address is its v4 source"
        );
    }
}
