//! Token buckets: the per-user produce and consume rate limits, and the
//! failed-password throttle of [`crate::auth`].
//!
//! A bucket holds up to `burst` tokens and gains `rate` tokens per second;
//! a request takes one. An empty bucket answers how long until the next
//! token, which becomes the `Retry-After` of the 429.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::{LimitsConfig, Rate};

/// One token bucket. Starts full.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens at `now`.
    pub fn full(burst: f64, now: Instant) -> TokenBucket {
        TokenBucket { tokens: burst, last: now }
    }

    fn refill(&mut self, rate: f64, burst: f64, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last = now;
    }

    /// Takes a token, or says how long until one is there.
    pub fn take(&mut self, rate: f64, burst: f64, now: Instant) -> Result<(), Duration> {
        self.refill(rate, burst, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(self.wait(rate))
        }
    }

    /// Whether a token is there (without taking it), else how long until one is.
    pub fn peek(&mut self, rate: f64, burst: f64, now: Instant) -> Result<(), Duration> {
        self.refill(rate, burst, now);
        if self.tokens >= 1.0 { Ok(()) } else { Err(self.wait(rate)) }
    }

    /// Gives back a token taken by [`Self::take`] (never above `burst`).
    pub fn refund(&mut self, burst: f64) {
        self.tokens = (self.tokens + 1.0).min(burst);
    }

    /// Whether the bucket is full again (and so can be forgotten).
    pub fn is_full(&mut self, rate: f64, burst: f64, now: Instant) -> bool {
        self.refill(rate, burst, now);
        self.tokens >= burst
    }

    fn wait(&self, rate: f64) -> Duration {
        Duration::from_secs_f64(((1.0 - self.tokens) / rate).max(0.0))
    }
}

/// The seconds of a `Retry-After` header for a wait: rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// What a rate limit applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `POST .../produce` and `.../produce/batch`.
    Produce,
    /// `GET .../consume`.
    Consume,
}

impl Op {
    /// The metric label and the error text.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Produce => "produce",
            Op::Consume => "consume",
        }
    }
}

/// More buckets than this and the full ones are forgotten.
const BUCKETS_SOFT_MAX: usize = 10_000;

/// The per-user rate limits.
#[derive(Debug)]
pub struct RateLimiter {
    limits: LimitsConfig,
    buckets: Mutex<HashMap<(String, Op), TokenBucket>>,
}

fn rate_of(r: &Rate, op: Op) -> (f64, f64) {
    let (rate, burst) = match op {
        Op::Produce => (r.produce_rate, r.produce_burst),
        Op::Consume => (r.consume_rate, r.consume_burst),
    };
    let burst = if burst == 0 { rate.ceil().max(1.0) } else { f64::from(burst) };
    (rate, burst)
}

impl RateLimiter {
    /// Limits from the `limits` section.
    pub fn new(limits: LimitsConfig) -> RateLimiter {
        RateLimiter { limits, buckets: Mutex::new(HashMap::new()) }
    }

    /// Whether no user has any limit (the access layer then skips them).
    pub fn is_unlimited(&self) -> bool {
        let none = |r: &Rate| r.produce_rate <= 0.0 && r.consume_rate <= 0.0;
        none(&self.limits.global()) && self.limits.users.values().all(none)
    }

    /// Takes a token for `user` doing `op`, or says how long to wait.
    /// Users without a limit for `op` never wait and cost no lock.
    pub fn check(&self, user: &str, op: Op, now: Instant) -> Result<(), Duration> {
        let r = self.limits.users.get(user).copied().unwrap_or_else(|| self.limits.global());
        let (rate, burst) = rate_of(&r, op);
        if rate <= 0.0 {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() > BUCKETS_SOFT_MAX {
            buckets.retain(|(u, o), b| {
                let r = self.limits.users.get(u).copied().unwrap_or_else(|| self.limits.global());
                let (rate, burst) = rate_of(&r, *o);
                !b.is_full(rate, burst, now)
            });
        }
        buckets
            .entry((user.to_owned(), op))
            .or_insert_with(|| TokenBucket::full(burst, now))
            .take(rate, burst, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_one_token_per_period() {
        let t0 = Instant::now();
        let mut b = TokenBucket::full(5.0, t0);
        for _ in 0..5 {
            b.take(1.0 / 12.0, 5.0, t0).unwrap();
        }
        let wait = b.take(1.0 / 12.0, 5.0, t0).unwrap_err();
        assert_eq!(wait.as_secs(), 12);
        assert!(b.take(1.0 / 12.0, 5.0, t0 + Duration::from_secs(11)).is_err());
        b.take(1.0 / 12.0, 5.0, t0 + Duration::from_secs(12)).unwrap();
        assert!(b.peek(1.0 / 12.0, 5.0, t0 + Duration::from_secs(12)).is_err());
        b.refund(5.0);
        b.peek(1.0 / 12.0, 5.0, t0 + Duration::from_secs(12)).unwrap();
        assert!(b.is_full(1.0 / 12.0, 5.0, t0 + Duration::from_secs(200)));
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::from_millis(100)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(12)), 12);
        assert_eq!(retry_after_secs(Duration::from_millis(12_001)), 13);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }

    #[test]
    fn limits_are_per_user_with_overrides_and_zero_is_unlimited() {
        let mut limits = LimitsConfig { produce_rate: 1.0, produce_burst: 2, ..Default::default() };
        limits.users.insert("vip".into(), Rate { produce_rate: 0.0, ..Default::default() });
        let l = RateLimiter::new(limits);
        let t0 = Instant::now();
        l.check("a", Op::Produce, t0).unwrap();
        l.check("a", Op::Produce, t0).unwrap();
        assert!(l.check("a", Op::Produce, t0).is_err());
        l.check("b", Op::Produce, t0).unwrap();
        for _ in 0..100 {
            l.check("vip", Op::Produce, t0).unwrap();
            l.check("a", Op::Consume, t0).unwrap();
        }
        l.check("a", Op::Produce, t0 + Duration::from_secs(1)).unwrap();
        assert!(!l.is_unlimited());
        assert!(RateLimiter::new(LimitsConfig::default()).is_unlimited());
    }
}
