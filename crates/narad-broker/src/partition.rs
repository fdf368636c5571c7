//! Choosing a record's partition at accept time.
//!
//! * A pinned partition (`?partition=`) is used as is (range-checked by the
//!   caller).
//! * A keyed record goes to `FNV-1a-32(key) % partitions`.
//! * A keyless record stores no key and is placed round-robin: each topic
//!   has its own rotation on this node, starting at a random partition;
//!   rotations of topics not used for a while are forgotten, so the map
//!   stays small.

use foldhash::{HashMap, HashMapExt};
use std::sync::Mutex;
use std::time::Duration;

/// FNV-1a, 32 bits, of `key`.
pub fn fnv1a32(key: &[u8]) -> u32 {
    let mut h: u32 = 2_166_136_261;
    for &b in key {
        h ^= u32::from(b);
        h = h.wrapping_mul(16_777_619);
    }
    h
}

/// The partition of a keyed record.
pub fn keyed_partition(key: &[u8], partitions: u32) -> u32 {
    fnv1a32(key) % partitions.max(1)
}

/// Per-topic round-robin for keyless records.
#[derive(Debug)]
pub struct RoundRobin {
    inner: Mutex<RoundRobinState>,
    idle_after: Duration,
}

#[derive(Debug)]
struct RoundRobinState {
    next: HashMap<String, (u32, Duration)>,
    seed: u64,
    last_sweep: Duration,
}

impl RoundRobin {
    /// A picker whose rotations are forgotten after `idle_after` unused;
    /// `seed` randomizes each rotation's starting point.
    pub fn new(seed: u64, idle_after: Duration) -> RoundRobin {
        RoundRobin {
            inner: Mutex::new(RoundRobinState {
                next: HashMap::new(),
                seed,
                last_sweep: Duration::ZERO,
            }),
            idle_after,
        }
    }

    /// The next partition of `topic`'s rotation; `now` is monotonic time.
    pub fn pick(&self, topic: &str, partitions: u32, now: Duration) -> u32 {
        let partitions = partitions.max(1);
        let mut st = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_sub(st.last_sweep) >= self.idle_after {
            let idle = self.idle_after;
            st.next.retain(|_, (_, used)| now.saturating_sub(*used) < idle);
            st.last_sweep = now;
        }
        if let Some((n, used)) = st.next.get_mut(topic) {
            let p = *n % partitions;
            *n = n.wrapping_add(1);
            *used = now;
            return p;
        }
        // A random start: splitmix the seed with the topic's hash.
        st.seed = st.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = st.seed ^ u64::from(fnv1a32(topic.as_bytes()));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let start = ((z ^ (z >> 31)) % u64::from(partitions)) as u32;
        st.next.insert(topic.to_owned(), (start.wrapping_add(1), now));
        start
    }

    /// How many topics have a live rotation.
    pub fn tracked(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).next.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_spec_vectors() {
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"customer-42"), 4_268_273_086);
        assert_eq!(keyed_partition(b"customer-42", 3), 1);
        assert_eq!(keyed_partition(b"customer-42", 8), 6);
        assert_eq!(fnv1a32(b"c1"), 2_284_445_657);
        assert_eq!(keyed_partition(b"c1", 3), 2);
    }

    #[test]
    fn keyless_records_rotate_over_every_partition() {
        let rr = RoundRobin::new(7, Duration::from_secs(60));
        let picks: Vec<u32> = (0..6).map(|_| rr.pick("t", 3, Duration::ZERO)).collect();
        let mut counts = [0; 3];
        for p in &picks {
            counts[*p as usize] += 1;
        }
        assert_eq!(counts, [2, 2, 2]);
        assert_eq!((picks[0] + 1) % 3, picks[1]);
    }

    #[test]
    fn idle_rotations_are_forgotten() {
        let rr = RoundRobin::new(1, Duration::from_secs(10));
        rr.pick("a", 3, Duration::ZERO);
        rr.pick("b", 3, Duration::from_secs(5));
        assert_eq!(rr.tracked(), 2);
        rr.pick("b", 3, Duration::from_secs(12));
        assert_eq!(rr.tracked(), 1);
    }

    #[test]
    fn starting_points_differ_between_topics() {
        let rr = RoundRobin::new(99, Duration::from_secs(60));
        let starts: std::collections::HashSet<u32> =
            (0..50).map(|i| rr.pick(&format!("topic-{i}"), 8, Duration::ZERO)).collect();
        assert!(starts.len() > 3);
    }
}
