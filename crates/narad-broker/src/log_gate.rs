//! A rate limit for one kind of log line that can repeat for every attempt
//! of something failing (a commit to a dead owner): at most one line per
//! interval, and the line says how many were held back since the last one.
//!
//! The clock is the caller's (`now` is a monotonic reading, as
//! [`narad_clock::Clock::mono`] gives), so tests drive it by hand.

use std::time::Duration;

/// Lets one line out per `every`; counts the ones it holds back.
#[derive(Debug, Clone)]
pub(crate) struct LogGate {
    every: Duration,
    /// When the last line went out.
    last: Option<Duration>,
    /// Lines held back since then.
    suppressed: u64,
}

impl LogGate {
    /// A gate that lets one line out per `every`.
    pub(crate) const fn every(every: Duration) -> LogGate {
        LogGate { every, last: None, suppressed: 0 }
    }

    /// Counts one event at `now`; `Some(lines held back since the last one
    /// went out)` when this one may be written.
    pub(crate) fn hit(&mut self, now: Duration) -> Option<u64> {
        if self.last.is_some_and(|t| now.saturating_sub(t) < self.every) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::LogGate;

    #[test]
    fn one_line_per_interval_and_it_counts_the_lines_held_back() {
        let s = Duration::from_secs;
        let mut g = LogGate::every(s(10));
        assert_eq!(g.hit(s(100)), Some(0), "the first line goes out");
        assert_eq!(g.hit(s(101)), None);
        assert_eq!(g.hit(s(109)), None);
        assert_eq!(g.hit(s(110)), Some(2), "an interval later, with the two held back");
        assert_eq!(g.hit(s(111)), None);
        assert_eq!(g.hit(s(500)), Some(1));
        // A clock reading that goes backwards holds lines back, never panics.
        assert_eq!(g.hit(s(1)), None);
    }
}
