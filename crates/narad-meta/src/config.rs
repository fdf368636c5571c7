//! `TopicDefaults`: the `topic` section of the server config (SPEC §8), the
//! values a create or alter falls back to when a field is 0.

use serde::{Deserialize, Serialize};

use crate::limits::{PARTITIONS_MIN, RETENTION_MS_MIN};

/// Defaults and bounds for topic options. Zero in a create or alter request
/// means "use the default from here".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopicDefaults {
    /// Partitions of a new topic (default 3).
    pub default_partitions: u32,
    /// The most partitions a topic may have (default 108).
    pub max_partitions: u32,
    /// Retention of a new topic in ms (default 604800000 = 7 days; 0 = keep
    /// forever, else at least one hour).
    pub default_retention_age_ms: u64,
    /// Visibility timeout of a new topic in ms (default 30000).
    pub default_visibility_timeout_ms: u64,
    /// Leases per partition (default 1024).
    pub default_max_in_flight_per_partition: u64,
    /// Acked-ahead entries per partition (default 1024).
    pub default_max_acked_ahead_per_partition: u64,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        TopicDefaults {
            default_partitions: 3,
            max_partitions: 108,
            default_retention_age_ms: 604_800_000,
            default_visibility_timeout_ms: 30_000,
            default_max_in_flight_per_partition: 1024,
            default_max_acked_ahead_per_partition: 1024,
        }
    }
}

impl TopicDefaults {
    /// Checks the section as a whole; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_partitions < PARTITIONS_MIN {
            return Err(format!(
                "topic.max_partitions ({}) must be >= {PARTITIONS_MIN}",
                self.max_partitions
            ));
        }
        if !(PARTITIONS_MIN..=self.max_partitions).contains(&self.default_partitions) {
            return Err(format!(
                "topic.default_partitions ({}) must be between {PARTITIONS_MIN} and \
                 topic.max_partitions ({})",
                self.default_partitions, self.max_partitions
            ));
        }
        let retention = self.default_retention_age_ms;
        if retention != 0 && retention < RETENTION_MS_MIN {
            return Err(format!(
                "topic.default_retention_age_ms ({retention}) must be 0 or at least \
                 {RETENTION_MS_MIN} (1 hour)"
            ));
        }
        let positive = [
            ("default_visibility_timeout_ms", self.default_visibility_timeout_ms),
            ("default_max_in_flight_per_partition", self.default_max_in_flight_per_partition),
            ("default_max_acked_ahead_per_partition", self.default_max_acked_ahead_per_partition),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("topic.{key} must be > 0"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_spec_values_and_valid() {
        let d = TopicDefaults::default();
        assert_eq!(
            (d.default_partitions, d.max_partitions, d.default_retention_age_ms),
            (3, 108, 604_800_000)
        );
        assert_eq!(d.default_visibility_timeout_ms, 30_000);
        assert_eq!(
            (d.default_max_in_flight_per_partition, d.default_max_acked_ahead_per_partition),
            (1024, 1024)
        );
        d.validate().unwrap();
    }

    #[test]
    fn invalid_sections_name_the_key() {
        let bad = |f: fn(&mut TopicDefaults)| {
            let mut d = TopicDefaults::default();
            f(&mut d);
            d.validate().unwrap_err()
        };
        assert!(bad(|d| d.default_retention_age_ms = 1000).contains("default_retention_age_ms"));
        assert!(bad(|d| d.default_partitions = 200).contains("default_partitions"));
        assert!(bad(|d| d.max_partitions = 2).contains("max_partitions"));
        assert!(bad(|d| d.default_visibility_timeout_ms = 0).contains("visibility"));
        let keep_forever = TopicDefaults { default_retention_age_ms: 0, ..Default::default() };
        keep_forever.validate().unwrap();
    }

    #[test]
    fn config_json_rejects_unknown_keys_and_fills_missing_ones() {
        let d: TopicDefaults = serde_json::from_str(r#"{"max_partitions": 50}"#).unwrap();
        assert_eq!((d.max_partitions, d.default_partitions), (50, 3));
        assert!(serde_json::from_str::<TopicDefaults>(r#"{"nope": 1}"#).is_err());
    }
}
