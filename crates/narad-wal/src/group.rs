//! Group completion: one shared outcome for every record staged into the
//! same group commit, awaited by blocking threads (condvar) and async tasks
//! (waker) alike.
//!
//! Once a record is staged, its outcome is decided by the sync thread alone:
//! dropping a [`Pending`] (a cancelled HTTP request) does not withdraw the
//! record, so a record that became durable is never reported as failed.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::error::WalError;

#[derive(Debug, Default)]
struct State {
    outcome: Option<Result<(), WalError>>,
    wakers: Vec<Waker>,
}

/// The completion of one group commit.
#[derive(Debug, Default)]
pub(crate) struct Group {
    state: Mutex<State>,
    done: Condvar,
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the outcome and wakes every waiter. Called once.
    pub(crate) fn complete(&self, outcome: Result<(), WalError>) {
        let wakers = {
            let mut st = self.lock();
            debug_assert!(st.outcome.is_none(), "a group completes once");
            st.outcome = Some(outcome);
            std::mem::take(&mut st.wakers)
        };
        self.done.notify_all();
        for w in wakers {
            w.wake();
        }
    }

    fn wait(&self) -> Result<(), WalError> {
        let mut st = self.lock();
        loop {
            if let Some(o) = &st.outcome {
                return o.clone();
            }
            st = self.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn poll(&self, cx: &mut Context<'_>) -> Poll<Result<(), WalError>> {
        let mut st = self.lock();
        if let Some(o) = &st.outcome {
            return Poll::Ready(o.clone());
        }
        if !st.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            st.wakers.push(cx.waker().clone());
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
