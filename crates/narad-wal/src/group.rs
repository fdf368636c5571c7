//! Group completion: one shared outcome for every record staged into the
//! same group commit, awaited by blocking threads and async tasks alike.
//!
//! Blocked threads sleep on one futex word of the group and are all woken by
//! a single `wake_all` when the outcome is set: one system call for the
//! whole group, so the sync thread is not preempted by each waiter it wakes
//! (waking 64 appenders one `unpark` at a time cost more than the fdatasync
//! they waited for). A thread marks the word before it sleeps, so a group
//! nobody sleeps on (every waiter of an HTTP server is an async task) makes
//! no system call at all. Async tasks register their wakers and are woken
//! one by one (that is a queue push, not a system call). The outcome itself
//! is read without a lock, so waking a large group does not make every
//! waiter queue on one mutex.
//!
//! Once a record is staged, its outcome is decided by the sync thread alone:
//! dropping a [`Pending`] (a cancelled HTTP request) does not withdraw the
//! record, so a record that became durable is never reported as failed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};

use crate::error::WalError;

/// [`Group::done`] before the outcome is set, while no thread sleeps on it.
const PENDING: u32 = 0;
/// [`Group::done`] once the outcome is set.
const DONE: u32 = 1;
/// [`Group::done`] before the outcome is set, once a thread may sleep on it.
const SLEEPING: u32 = 2;

/// The completion of one group commit.
#[derive(Debug, Default)]
pub(crate) struct Group {
    outcome: OnceLock<Result<(), WalError>>,
    /// The futex word blocked threads sleep on: [`PENDING`] or [`SLEEPING`],
    /// then [`DONE`] (stored after `outcome` is set).
    done: AtomicU32,
    /// Wakers of async tasks waiting for the outcome.
    tasks: Mutex<Vec<Waker>>,
}

impl Group {
    fn tasks(&self) -> MutexGuard<'_, Vec<Waker>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the outcome and wakes every waiter. Called once.
    pub(crate) fn complete(&self, outcome: Result<(), WalError>) {
        let first = self.outcome.set(outcome).is_ok();
        debug_assert!(first, "a group completes once");
        // Stored after the outcome: a thread that sees DONE sees the outcome.
        // A thread about to sleep on SLEEPING returns at once instead (the
        // futex compares the word before sleeping), so no wake-up is lost;
        // and a thread that has not marked the word yet finds DONE.
        if self.done.swap(DONE, Ordering::AcqRel) == SLEEPING {
            atomic_wait::wake_all(&self.done);
        }
        // Taken after the outcome is set: a task that registers later sees
        // the outcome when it re-checks under the same lock.
        let tasks = std::mem::take(&mut *self.tasks());
        for w in tasks {
            w.wake();
        }
    }

    fn wait(&self) -> Result<(), WalError> {
        loop {
            match self.done.load(Ordering::Acquire) {
                DONE => break,
                // Mark the word first, so `complete` knows to wake it; if
                // that fails the word changed (to DONE): look again.
                PENDING => {
                    let _ = self.done.compare_exchange(
                        PENDING,
                        SLEEPING,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                }
                // Returns at once if the word is no longer SLEEPING;
                // spurious wake-ups are fine: the loop re-checks.
                _ => atomic_wait::wait(&self.done, SLEEPING),
            }
        }
        self.outcome.get().expect("DONE is stored after the outcome").clone()
    }

    fn poll(&self, cx: &mut Context<'_>) -> Poll<Result<(), WalError>> {
        if let Some(o) = self.outcome.get() {
            return Poll::Ready(o.clone());
        }
        let mut w = self.tasks();
        if let Some(o) = self.outcome.get() {
            return Poll::Ready(o.clone());
        }
        let already = w.iter().any(|k| k.will_wake(cx.waker()));
        if !already {
            w.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// An append that is staged and waits for its group commit. Resolves to the
/// append's sequence number(s) once its bytes are durable, or to the group's
/// error. Use [`Pending::wait`] from a thread, or `.await` it from async code
/// (it never blocks the executor).
#[derive(Debug)]
#[must_use = "an append is not durable until its Pending resolves"]
pub struct Pending<T> {
    group: Arc<Group>,
    value: Option<T>,
}

impl<T> Pending<T> {
    pub(crate) fn new(group: Arc<Group>, value: T) -> Self {
        Pending { group, value: Some(value) }
    }

    /// Blocks until the group commit finished.
    pub fn wait(mut self) -> Result<T, WalError> {
        self.group.wait()?;
        Ok(self.value.take().expect("Pending resolved once"))
    }
}

impl<T: Unpin> Future for Pending<T> {
    type Output = Result<T, WalError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match this.group.poll(cx) {
            Poll::Ready(Ok(())) => {
                Poll::Ready(Ok(this.value.take().expect("Pending polled after completion")))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_blocked_thread_wakes_with_the_outcome_however_the_completion_races_its_sleep() {
        // Completion at every point of the waiters' way to sleep: before
        // they look, while they mark the word, after they sleep.
        for round in 0..200u64 {
            let g = Arc::new(Group::default());
            let waiters: Vec<_> = (0..4)
                .map(|_| {
                    let g = g.clone();
                    std::thread::spawn(move || g.wait())
                })
                .collect();
            if round % 4 == 3 {
                std::thread::sleep(Duration::from_micros(round * 5));
            }
            g.complete(Err(WalError::Closed));
            for w in waiters {
                assert!(matches!(w.join().unwrap(), Err(WalError::Closed)), "round {round}");
            }
        }
    }

    #[test]
    fn a_group_nobody_sleeps_on_is_completed_without_marking_its_word() {
        let g = Group::default();
        assert_eq!(g.done.load(Ordering::Acquire), PENDING);
        g.complete(Ok(()));
        assert_eq!(g.done.load(Ordering::Acquire), DONE);
        assert!(g.wait().is_ok(), "a late waiter returns at once");

        // A sleeper marks the word before it sleeps.
        let g = Arc::new(Group::default());
        let w = {
            let g = g.clone();
            std::thread::spawn(move || g.wait())
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while g.done.load(Ordering::Acquire) != SLEEPING {
            assert!(std::time::Instant::now() < deadline, "the waiter never marked the word");
            std::thread::yield_now();
        }
        g.complete(Ok(()));
        assert!(w.join().unwrap().is_ok());
    }
}
