//! The partition fence: the one place that says whether this node may still
//! commit into, and serve, a partition it holds a log of (SPEC §7.3, the v3
//! page's "partition handoff freeze").
//!
//! Every commit into a local partition log ([`crate::owner::LocalOwner`],
//! for this node's dispatcher and for other nodes' commits alike) passes
//! its partition's gate and holds the gate open (a read lock) until the
//! commit returned: appended, fsynced, read back. A state change takes the
//! gate exclusively, so it waits for the commits in flight and none starts
//! after it. That is what makes a freeze exact: once
//! [`Fences::freeze`] returns, the log's high watermark is final until the
//! gate opens again, and the copy a move makes of it is complete.
//!
//! States, per `(topic, incarnation, partition)`:
//!
//! | state | commits | consume, ack, replay |
//! |---|---|---|
//! | open (no entry) | pass | served |
//! | frozen for target T, deadline D | refused as [`Shut::Frozen`]: retriable, the sender tries the same partition again (never a sibling) | served (a lease or an ack the copy misses only makes a duplicate) |
//! | moved to T | refused as [`Shut::Moved`]: the sender resolves the owner again | not served: the log is a leftover, its owner is T |
//!
//! Invariants:
//! - A gate never opens by itself. A freeze's deadline only makes it
//!   *expired* ([`Fences::expired`]); whoever unfreezes it (the node, once
//!   the metastore's leader confirms the move did not complete) does so
//!   explicitly. A freeze that opened on a timer while the flip had
//!   committed would let this node accept records for a partition it no
//!   longer owns, whose log is about to be deleted: a loss of acknowledged
//!   records.
//! - Moved is final for that incarnation (only [`Fences::forget`], when the
//!   log is removed, drops it, or [`Fences::replace`], when a move's copy
//!   replaces it).
//! - A log is replaced by a move's copy only with its gate held exclusively
//!   ([`Fences::replace`]), so no commit lands in the log being replaced
//!   after the install checked that this node does not own it yet.
//! - The gate is per partition: a freeze stalls that partition's commits
//!   only, never another partition's, and no lock is held across an fsync
//!   that another partition needs.
//!
//! Gates live here, not in the partition's runtime state, because idle
//! partitions are evicted from memory and a freeze must outlive that.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// One partition of one topic incarnation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    /// The topic's name.
    pub topic: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// The partition.
    pub partition: u32,
}

impl PartitionKey {
    /// The key of `(topic, incarnation, partition)`.
    pub fn new(topic: &str, incarnation: u64, partition: u32) -> PartitionKey {
        PartitionKey { topic: topic.to_owned(), incarnation, partition }
    }
}

/// Why a gate is shut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shut {
    /// Frozen while `target` copies the partition's tail.
    Frozen {
        /// The member the partition is moving to.
        target: String,
        /// Wall-clock ms after which the freeze is expired (the node then
        /// asks the leader whether to open it or seal it).
        deadline_ms: u64,
    },
    /// Moved to `to`: the partition's owner is `to` now.
    Moved {
        /// The new owner.
        to: String,
    },
}

impl std::fmt::Display for Shut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shut::Frozen { target, .. } => write!(f, "partition frozen while it moves to {target}"),
            Shut::Moved { to } => write!(f, "partition moved to {to}"),
        }
    }
}

/// One partition's gate.
#[derive(Debug, Default)]
struct Gate {
    shut: RwLock<Option<Shut>>,
}

/// Why a freeze was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FreezeError {
    /// Another move froze it first.
    #[error("partition already frozen for a move to {0}")]
    FrozenForAnother(String),
    /// It has moved away already.
    #[error("partition already moved to {0}")]
    Moved(String),
}

/// The gates of this node's partitions.
#[derive(Debug, Default)]
pub struct Fences {
    /// Read-locked to find a partition's gate (every commit), write-locked
    /// only to add or drop one.
    gates: RwLock<HashMap<PartitionKey, Arc<Gate>>>,
    /// How many gates are shut: while none is, [`Fences::shut`] (on every
    /// consume) answers without the map's lock.
    shut_gates: AtomicUsize,
}

impl Fences {
    /// No partition shut.
    pub fn new() -> Fences {
        Fences::default()
    }

    fn gate(&self, key: &PartitionKey) -> Arc<Gate> {
        if let Some(gate) = self.existing(key) {
            return gate;
        }
        let mut gates = self.gates.write().unwrap_or_else(|p| p.into_inner());
        gates.entry(key.clone()).or_default().clone()
    }

    fn existing(&self, key: &PartitionKey) -> Option<Arc<Gate>> {
        self.gates.read().unwrap_or_else(|p| p.into_inner()).get(key).cloned()
    }

    /// Runs `commit` through `key`'s gate, holding it open until `commit`
    /// returns; `Err` (and `commit` not run) when the gate is shut.
    pub fn pass<T>(&self, key: &PartitionKey, commit: impl FnOnce() -> T) -> Result<T, Shut> {
        let gate = self.gate(key);
        let open: RwLockReadGuard<'_, Option<Shut>> =
            gate.shut.read().unwrap_or_else(|p| p.into_inner());
        if let Some(shut) = open.as_ref() {
            return Err(shut.clone());
        }
        let committed = commit();
        // State changes wait for this.
        drop(open);
        Ok(committed)
    }

    /// Why `key`'s gate is shut, if it is (a read for consume, ack and
    /// replay, which need not hold it).
    pub fn shut(&self, key: &PartitionKey) -> Option<Shut> {
        if self.shut_gates.load(Ordering::Acquire) == 0 {
            return None;
        }
        let gate = self.existing(key)?;
        gate.shut.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Freezes `key` for a move to `target` until `deadline_ms`: waits for
    /// the commits in flight, then `at_rest` runs with the gate shut (it
    /// reads the final high watermark). Freezing again for the same target
    /// moves the deadline (a retried PrepareHandoff).
    pub fn freeze<T>(
        &self,
        key: &PartitionKey,
        target: &str,
        deadline_ms: u64,
        at_rest: impl FnOnce() -> T,
    ) -> Result<T, FreezeError> {
        let gate = self.gate(key);
        let mut shut = gate.shut.write().unwrap_or_else(|p| p.into_inner());
        match shut.as_ref() {
            None => {}
            Some(Shut::Frozen { target: t, .. }) if t == target => {}
            Some(Shut::Frozen { target: t, .. }) => {
                return Err(FreezeError::FrozenForAnother(t.clone()));
            }
            Some(Shut::Moved { to }) => return Err(FreezeError::Moved(to.clone())),
        }
        if shut.is_none() {
            self.shut_gates.fetch_add(1, Ordering::AcqRel);
        }
        *shut = Some(Shut::Frozen { target: target.to_owned(), deadline_ms });
        Ok(at_rest())
    }

    /// Opens `key`'s gate if it is frozen for `target` (the move was
    /// aborted); whether it was.
    pub fn unfreeze(&self, key: &PartitionKey, target: &str) -> bool {
        let Some(gate) = self.existing(key) else { return false };
        let mut shut = gate.shut.write().unwrap_or_else(|p| p.into_inner());
        if matches!(shut.as_ref(), Some(Shut::Frozen { target: t, .. }) if t == target) {
            *shut = None;
            self.shut_gates.fetch_sub(1, Ordering::AcqRel);
            return true;
        }
        false
    }

    /// Seals `key` as moved to `to` (the flip committed): final.
    pub fn seal_moved(&self, key: &PartitionKey, to: &str) {
        let gate = self.gate(key);
        let mut shut = gate.shut.write().unwrap_or_else(|p| p.into_inner());
        if shut.is_none() {
            self.shut_gates.fetch_add(1, Ordering::AcqRel);
        }
        *shut = Some(Shut::Moved { to: to.to_owned() });
    }

    /// Drops `key`'s gate (its log is removed).
    pub fn forget(&self, key: &PartitionKey) {
        let gate = self.gates.write().unwrap_or_else(|p| p.into_inner()).remove(key);
        if let Some(gate) = gate {
            let mut shut = gate.shut.write().unwrap_or_else(|p| p.into_inner());
            if shut.take().is_some() {
                self.shut_gates.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Runs `install` (which replaces `key`'s log with a verified copy)
    /// holding `key`'s gate exclusively: it waits for the commits in
    /// flight, and no commit starts until it returned. When it succeeded
    /// the gate is dropped (the log it guarded is gone; a seal or freeze of
    /// the old log says nothing of the new one). A check `install` makes
    /// first (the node's replica does not name it the owner) thus holds
    /// until the log is replaced: a commit that the owner's replica let in
    /// has either landed before the check, which then sees the ownership,
    /// or waits and lands in the new log.
    pub fn replace<T, E>(
        &self,
        key: &PartitionKey,
        install: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let gate = self.gate(key);
        let mut shut = gate.shut.write().unwrap_or_else(|p| p.into_inner());
        let installed = install()?;
        if shut.take().is_some() {
            self.shut_gates.fetch_sub(1, Ordering::AcqRel);
        }
        let mut gates = self.gates.write().unwrap_or_else(|p| p.into_inner());
        if gates.get(key).is_some_and(|g| Arc::ptr_eq(g, &gate)) {
            gates.remove(key);
        }
        Ok(installed)
    }

    /// The frozen partitions whose deadline passed at `now_ms`, with the
    /// target each was frozen for.
    pub fn expired(&self, now_ms: u64) -> Vec<(PartitionKey, String)> {
        let gates: Vec<(PartitionKey, Arc<Gate>)> = self
            .gates
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, g)| (k.clone(), g.clone()))
            .collect();
        let mut out = Vec::new();
        for (key, gate) in gates {
            if let Some(Shut::Frozen { target, deadline_ms }) =
                gate.shut.read().unwrap_or_else(|p| p.into_inner()).as_ref()
                && *deadline_ms <= now_ms
            {
                out.push((key, target.clone()));
            }
        }
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    fn key(p: u32) -> PartitionKey {
        PartitionKey::new("t", 7, p)
    }

    /// A commit through `key`'s gate, in flight when this returns: it
    /// holds the gate 200 ms (the fsync a state change must wait for),
    /// then sets the flag.
    fn commit_in_flight(
        fences: &Arc<Fences>,
        key: PartitionKey,
    ) -> (std::thread::JoinHandle<()>, Arc<AtomicBool>) {
        let committing = Arc::new(Barrier::new(2));
        let done = Arc::new(AtomicBool::new(false));
        let commit = {
            let (fences, committing, done) = (fences.clone(), committing.clone(), done.clone());
            std::thread::spawn(move || {
                fences
                    .pass(&key, || {
                        committing.wait();
                        std::thread::sleep(Duration::from_millis(200));
                        done.store(true, Ordering::SeqCst);
                    })
                    .unwrap();
            })
        };
        committing.wait();
        (commit, done)
    }

    #[test]
    fn a_freeze_waits_for_the_commit_in_flight_and_refuses_the_next() {
        let fences = Arc::new(Fences::new());
        let (commit, done) = commit_in_flight(&fences, key(0));
        let saw_done = fences.freeze(&key(0), "n4", 1_000, || done.load(Ordering::SeqCst)).unwrap();
        assert!(saw_done, "the freeze ran only after the commit in flight returned");
        commit.join().unwrap();
        let refused = fences.pass(&key(0), || ()).unwrap_err();
        assert_eq!(refused, Shut::Frozen { target: "n4".into(), deadline_ms: 1_000 });
        // Other partitions, and another incarnation of this one, pass.
        fences.pass(&key(1), || ()).unwrap();
        fences.pass(&PartitionKey::new("t", 8, 0), || ()).unwrap();
    }

    #[test]
    fn a_freeze_opens_only_when_told_and_never_by_its_deadline() {
        let fences = Fences::new();
        fences.freeze(&key(0), "n4", 1_000, || ()).unwrap();
        assert_eq!(fences.expired(999), vec![]);
        assert_eq!(fences.expired(1_000), vec![(key(0), "n4".to_owned())]);
        assert!(fences.pass(&key(0), || ()).is_err(), "expired is still shut");
        // Frozen for n4: another target cannot freeze it, nor open it.
        let e = fences.freeze(&key(0), "n5", 5_000, || ()).unwrap_err();
        assert_eq!(e, FreezeError::FrozenForAnother("n4".into()));
        assert!(!fences.unfreeze(&key(0), "n5"));
        // The same target again moves the deadline (a retried freeze).
        fences.freeze(&key(0), "n4", 9_000, || ()).unwrap();
        assert_eq!(fences.expired(5_000), vec![]);
        assert!(fences.unfreeze(&key(0), "n4"));
        fences.pass(&key(0), || ()).unwrap();
        assert_eq!(fences.shut(&key(0)), None);
    }

    #[test]
    fn a_sealed_partition_refuses_commits_and_freezes_until_forgotten() {
        let fences = Fences::new();
        fences.freeze(&key(0), "n4", 1_000, || ()).unwrap();
        fences.seal_moved(&key(0), "n4");
        assert_eq!(fences.pass(&key(0), || ()).unwrap_err(), Shut::Moved { to: "n4".into() });
        assert_eq!(
            fences.freeze(&key(0), "n4", 1, || ()).unwrap_err(),
            FreezeError::Moved("n4".into())
        );
        assert!(!fences.unfreeze(&key(0), "n4"), "moved is final");
        assert_eq!(fences.expired(u64::MAX), vec![], "a sealed partition is not an expired freeze");
        assert_eq!(fences.shut(&key(0)), Some(Shut::Moved { to: "n4".into() }));
        fences.forget(&key(0));
        fences.pass(&key(0), || ()).unwrap();
        assert_eq!(fences.shut(&key(0)), None);
        assert_eq!(fences.shut_gates.load(Ordering::SeqCst), 0, "every shut gate counted back");
    }

    #[test]
    fn a_replaced_log_waits_for_the_commit_in_flight_holds_the_next_and_opens_after() {
        let fences = Arc::new(Fences::new());
        let (commit, done) = commit_in_flight(&fences, key(0));
        let installing = Arc::new(Barrier::new(2));
        let later = Arc::new(AtomicBool::new(false));
        let next = {
            let (fences, installing, later) = (fences.clone(), installing.clone(), later.clone());
            std::thread::spawn(move || {
                installing.wait();
                // Starts while the replacement runs: passes only after it.
                fences.pass(&key(0), || later.load(Ordering::SeqCst)).unwrap()
            })
        };
        let saw_done = fences
            .replace(&key(0), || {
                let saw = done.load(Ordering::SeqCst);
                installing.wait();
                std::thread::sleep(Duration::from_millis(200));
                later.store(true, Ordering::SeqCst);
                Ok::<_, ()>(saw)
            })
            .unwrap();
        assert!(saw_done, "the replacement ran only after the commit in flight returned");
        commit.join().unwrap();
        assert!(next.join().unwrap(), "a commit that came during the replacement waited for it");
        // A sealed gate is dropped by a replacement that succeeded, and
        // kept by one that failed.
        fences.seal_moved(&key(2), "n4");
        assert_eq!(fences.replace(&key(2), || Err::<(), _>("verify failed")), Err("verify failed"));
        assert_eq!(fences.shut(&key(2)), Some(Shut::Moved { to: "n4".into() }));
        fences.replace(&key(2), || Ok::<_, ()>(())).unwrap();
        fences.pass(&key(2), || ()).unwrap();
        assert_eq!(fences.shut_gates.load(Ordering::SeqCst), 0, "every shut gate counted back");
    }
}
