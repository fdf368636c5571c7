//! Group completion: one shared outcome for every record staged into the
//! same group commit, awaited by blocking threads and async tasks alike.
//!
//! Waiters register themselves (a parked thread or a task's waker) and are
//! woken one by one when the outcome is set; the outcome itself is read
//! without a lock, so waking a large group does not make every waiter
//! queue on one mutex.
//!
//! Once a record is staged, its outcome is decided by the sync thread alone:
//! dropping a [`Pending`] (a cancelled HTTP request) does not withdraw the
//! record, so a record that became durable is never reported as failed.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;

use crate::error::WalError;

#[derive(Debug)]
enum Waiter {
    Thread(Thread),
    Task(Waker),
}

/// The completion of one group commit.
#[derive(Debug, Default)]
pub(crate) struct Group {
    outcome: OnceLock<Result<(), WalError>>,
    waiters: Mutex<Vec<Waiter>>,
}

impl Group {
    fn waiters(&self) -> MutexGuard<'_, Vec<Waiter>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the outcome and wakes every waiter. Called once.
    pub(crate) fn complete(&self, outcome: Result<(), WalError>) {
        let first = self.outcome.set(outcome).is_ok();
        debug_assert!(first, "a group completes once");
        // Taken after the outcome is set: a waiter that registers later sees
        // the outcome when it re-checks under the same lock.
        let waiters = std::mem::take(&mut *self.waiters());
        for w in waiters {
            match w {
                Waiter::Thread(t) => t.unpark(),
                Waiter::Task(w) => w.wake(),
            }
        }
    }

    fn wait(&self) -> Result<(), WalError> {
        if let Some(o) = self.outcome.get() {
            return o.clone();
        }
        {
            let mut w = self.waiters();
            if let Some(o) = self.outcome.get() {
                return o.clone();
            }
            w.push(Waiter::Thread(std::thread::current()));
        }
        loop {
            if let Some(o) = self.outcome.get() {
                return o.clone();
            }
            // Spurious wake-ups are fine: the loop re-checks.
            std::thread::park();
        }
    }

    fn poll(&self, cx: &mut Context<'_>) -> Poll<Result<(), WalError>> {
        if let Some(o) = self.outcome.get() {
            return Poll::Ready(o.clone());
        }
        let mut w = self.waiters();
        if let Some(o) = self.outcome.get() {
            return Poll::Ready(o.clone());
        }
        let already = w.iter().any(|x| matches!(x, Waiter::Task(k) if k.will_wake(cx.waker())));
        if !already {
            w.push(Waiter::Task(cx.waker().clone()));
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
