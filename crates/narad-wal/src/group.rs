//! Group completion: one shared outcome for every record staged into the
//! same group commit, awaited by blocking threads and async tasks alike.
//!
//! Blocked threads sleep on one futex word of the group and are all woken by
//! a single `wake_all` when the outcome is set: one system call for the
//! whole group, so the sync thread is not preempted by each waiter it wakes
//! (waking 64 appenders one `unpark` at a time cost more than the fdatasync
//! they waited for). Async tasks register their wakers and are woken one by
//! one (that is a queue push, not a system call). The outcome itself is read
//! without a lock, so waking a large group does not make every waiter queue
//! on one mutex.
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

/// [`Group::done`] before the outcome is set.
const PENDING: u32 = 0;
/// [`Group::done`] once the outcome is set.
const DONE: u32 = 1;

/// The completion of one group commit.
#[derive(Debug, Default)]
pub(crate) struct Group {
    outcome: OnceLock<Result<(), WalError>>,
    /// The futex word blocked threads sleep on: [`PENDING`], then [`DONE`]
    /// (stored after `outcome` is set).
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
        // A thread about to sleep on PENDING returns at once instead (the
        // futex compares the word before sleeping), so no wake-up is lost.
        self.done.store(DONE, Ordering::Release);
        atomic_wait::wake_all(&self.done);
        // Taken after the outcome is set: a task that registers later sees
        // the outcome when it re-checks under the same lock.
        let tasks = std::mem::take(&mut *self.tasks());
        for w in tasks {
            w.wake();
        }
    }

    fn wait(&self) -> Result<(), WalError> {
        while self.done.load(Ordering::Acquire) == PENDING {
            // Returns at once if the word is no longer PENDING; spurious
            // wake-ups are fine: the loop re-checks.
            atomic_wait::wait(&self.done, PENDING);
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
