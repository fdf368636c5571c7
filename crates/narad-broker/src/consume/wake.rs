//! Wake-ups for the tasks that wait on a topic: long-polling consumers and
//! fan-out cursors.
//!
//! Two kinds of waiter, woken differently:
//!
//! * **Any-partition consumers** (queue mode without `partition`) can take
//!   from every partition, so one of them is enough for whatever just became
//!   available. They are woken one at a time ([`Notify::notify_one`]): a
//!   commit, a nack or an ack that unblocked a partition wakes one; a
//!   consumer that comes back with a full batch ([`ConsumeWake::pass_on`])
//!   wakes the next, because there may be more. A wake-up that was sent but
//!   not received (the request ended first) is passed on by tokio when the
//!   waiter drops, and a wake-up with nobody waiting is kept for the next
//!   consumer, so records never sit unseen while a consumer waits.
//! * **Partition waiters** (consumers pinned to one partition, fan-out
//!   cursors) only care about their own partition, so a wake-up sent to one
//!   of them could be lost on a waiter of another partition. They are all
//!   woken ([`Notify::notify_waiters`]) and each looks at its own.
//!
//! Before this split every commit and every ack woke every waiter of the
//! topic: with 16 idle consumers, each commit cycle and each ack made 16
//! tasks take every partition's shard lock to find, all but one of them,
//! nothing.

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

/// The wake-ups of one topic's waiters.
#[derive(Debug, Default)]
pub struct ConsumeWake {
    any: Notify,
    pinned: Notify,
}

impl ConsumeWake {
    /// A new set with nobody waiting.
    pub fn new() -> Self {
        Self::default()
    }

    /// The future a waiter awaits: `pinned` for a waiter that only looks at
    /// one partition. Call `enable` on it before looking, so a wake-up sent
    /// between the look and the wait is not missed.
    pub fn waiter(&self, pinned: bool) -> Notified<'_> {
        if pinned { self.pinned.notified() } else { self.any.notified() }
    }

    /// Something became takeable (a commit, a nack, an ack that freed a
    /// blocked partition): one any-partition consumer and every partition
    /// waiter look.
    pub fn available(&self) {
        self.any.notify_one();
        self.pinned.notify_waiters();
    }

    /// An any-partition consumer took a full batch, so more may be
    /// available: the next one looks.
    pub fn pass_on(&self) {
        self.any.notify_one();
    }

    /// Everyone looks: leases expired, limits changed, the topic closed or
    /// the node drains.
    pub fn everyone(&self) {
        self.any.notify_waiters();
        self.pinned.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    fn ready(f: std::pin::Pin<&mut Notified<'_>>) -> bool {
        f.poll(&mut Context::from_waker(Waker::noop())) == Poll::Ready(())
    }

    #[test]
    fn available_wakes_one_any_partition_consumer_and_every_partition_waiter() {
        let w = ConsumeWake::new();
        let mut a1 = pin!(w.waiter(false));
        let mut a2 = pin!(w.waiter(false));
        let mut p1 = pin!(w.waiter(true));
        let mut p2 = pin!(w.waiter(true));
        for f in [a1.as_mut(), a2.as_mut(), p1.as_mut(), p2.as_mut()] {
            assert!(!f.enable());
        }
        w.available();
        assert!(ready(a1.as_mut()));
        assert!(!ready(a2.as_mut()), "a second any-partition consumer stays parked");
        assert!(ready(p1.as_mut()) && ready(p2.as_mut()));
        w.pass_on();
        assert!(ready(a2.as_mut()), "a full batch passes the wake-up on");
    }

    #[test]
    fn a_wake_up_nobody_received_goes_to_the_next_consumer() {
        let w = ConsumeWake::new();
        {
            let mut gone = Box::pin(w.waiter(false));
            assert!(!gone.as_mut().enable());
            let mut next = pin!(w.waiter(false));
            assert!(!next.as_mut().enable());
            w.available();
            // `gone` was woken but its request ended before it looked.
            drop(gone);
            assert!(ready(next.as_mut()), "the dropped waiter's wake-up is passed on");
        }
        // With nobody waiting, the wake-up is kept for the next consumer.
        w.available();
        let mut late = pin!(w.waiter(false));
        assert!(late.as_mut().enable());
    }

    #[test]
    fn everyone_wakes_every_waiter() {
        let w = ConsumeWake::new();
        let mut a1 = pin!(w.waiter(false));
        let mut a2 = pin!(w.waiter(false));
        let mut p = pin!(w.waiter(true));
        for f in [a1.as_mut(), a2.as_mut(), p.as_mut()] {
            assert!(!f.enable());
        }
        w.everyone();
        assert!(ready(a1.as_mut()) && ready(a2.as_mut()) && ready(p.as_mut()));
    }
}
