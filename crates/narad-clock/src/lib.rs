//! Time, passed in.
//!
//! Every decision in narad that depends on time (commit times, retention,
//! leases, dispatcher linger and reroute grace) reads it through [`Clock`], so
//! tests can drive it: [`ManualClock`] moves only when told, and can move the
//! wall clock backwards to prove that commit times never do.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of wall-clock and monotonic time.
pub trait Clock: Send + Sync + Debug {
    /// Wall-clock time in milliseconds since the Unix epoch. May jump, even
    /// backwards.
    fn wall_ms(&self) -> u64;

    /// Monotonic time since an arbitrary, fixed origin. Never goes backwards.
    fn mono(&self) -> Duration;
}

/// A shared clock.
pub type ClockRef = Arc<dyn Clock>;

/// The operating system's clocks.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A system clock whose monotonic origin is now.
    pub fn new() -> Self {
        SystemClock { origin: Instant::now() }
    }

    /// A shared system clock.
    pub fn shared() -> ClockRef {
        Arc::new(SystemClock::new())
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn wall_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }

    fn mono(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that moves only when told. Cloning shares the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    wall_ms: Arc<AtomicU64>,
    mono_ns: Arc<AtomicU64>,
}

impl ManualClock {
    /// A manual clock at the given wall time and monotonic zero.
    pub fn new(wall_ms: u64) -> Self {
        ManualClock { wall_ms: Arc::new(AtomicU64::new(wall_ms)), mono_ns: Arc::default() }
    }

    /// Moves both clocks forward.
    pub fn advance(&self, by: Duration) {
        self.wall_ms.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
        self.mono_ns.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Sets the wall clock (it may go backwards); the monotonic clock is
    /// unaffected.
    pub fn set_wall_ms(&self, ms: u64) {
        self.wall_ms.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn wall_ms(&self) -> u64 {
        self.wall_ms.load(Ordering::SeqCst)
    }

    fn mono(&self) -> Duration {
        Duration::from_nanos(self.mono_ns.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_wall_may_go_back() {
        let c = ManualClock::new(1_000);
        assert_eq!((c.wall_ms(), c.mono()), (1_000, Duration::ZERO));
        c.advance(Duration::from_millis(250));
        assert_eq!((c.wall_ms(), c.mono()), (1_250, Duration::from_millis(250)));
        c.set_wall_ms(10);
        assert_eq!((c.wall_ms(), c.mono()), (10, Duration::from_millis(250)));
    }

    #[test]
    fn system_clock_is_monotonic() {
        let c = SystemClock::new();
        let a = c.mono();
        assert!(c.mono() >= a);
        assert!(c.wall_ms() > 1_600_000_000_000);
    }
}
