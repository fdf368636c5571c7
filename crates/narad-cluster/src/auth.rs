//! How nodes authenticate each other: with a cluster secret, the
//! connection handshake of `handshake.rs` (mutual HMAC proofs bound to the
//! TLS session, once per connection, the server first); with cluster TLS
//! files, mutual TLS against the cluster CA; both when both are set.

use crate::error::{Error, Result};
use crate::handshake::derive_key;
use crate::limits::{AUTH_WARN_INTERVAL, MIN_SECRET_CHARS};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A cluster secret (`NARAD_CLUSTER_SECRET`), kept only as the key derived
/// from it. Its Debug never shows it.
#[derive(Clone)]
pub struct ClusterSecret {
    key: [u8; 32],
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// A secret of at least [`MIN_SECRET_CHARS`] characters; a shorter one
    /// is refused with the rule and how to make a good one.
    pub fn new(secret: &[u8]) -> Result<ClusterSecret> {
        let chars = String::from_utf8_lossy(secret).chars().count();
        if chars < MIN_SECRET_CHARS {
            return Err(Error::Config(format!(
                "the cluster secret has {chars} characters; it must have at least \
                 {MIN_SECRET_CHARS} (generate one with `openssl rand -hex 32`)"
            )));
        }
        Ok(ClusterSecret { key: derive_key(secret) })
    }

    /// The key proofs are made with (HMAC-SHA256(secret, `narad-cluster-key-v2`)).
    pub(crate) fn key(&self) -> [u8; 32] {
        self.key
    }
}

/// The cluster TLS files (`security.cluster_tls_{cert,key,ca}_file`): all
/// three or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This node's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The cluster CA that signs every node's certificate (PEM).
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The files from three optional settings: all set, or none.
    pub fn from_options(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Option<TlsFiles>> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles { cert, key, ca })),
            (cert, key, ca) => {
                let missing: Vec<&str> =
                    [("cert", cert.is_none()), ("key", key.is_none()), ("ca", ca.is_none())]
                        .into_iter()
                        .filter_map(|(n, m)| m.then_some(n))
                        .collect();
                Err(Error::Config(format!(
                    "security.cluster_tls_{{cert,key,ca}}_file must be set all or none; missing: {}",
                    missing.join(", ")
                )))
            }
        }
    }
}

/// How nodes authenticate each other, and the id this node proves itself as.
#[derive(Debug, Clone, Default)]
pub struct ClusterAuth {
    /// The secret this node proves with and requires of its peers.
    pub secret: Option<ClusterSecret>,
    /// During a rotation, the secret being replaced: accepted from peers
    /// and proved with as well (`NARAD_CLUSTER_SECRET_PREVIOUS`).
    pub previous_secret: Option<ClusterSecret>,
    /// Mutual TLS against a cluster CA (else an ephemeral self-signed
    /// certificate, and the secret authenticates).
    pub tls: Option<TlsFiles>,
    /// This node's id, sent (and, with a secret, proved) in the handshake;
    /// empty is sent as `-`.
    pub node_id: String,
}

impl ClusterAuth {
    /// The id this node presents in the handshake.
    pub(crate) fn presented_id(&self) -> &str {
        if self.node_id.is_empty() { "-" } else { &self.node_id }
    }
}

/// One WARN per interval ([`AUTH_WARN_INTERVAL`] by default); the ones in
/// between are counted and reported with the next.
#[derive(Debug)]
pub(crate) struct WarnLimiter {
    interval: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl Default for WarnLimiter {
    fn default() -> Self {
        WarnLimiter::every(AUTH_WARN_INTERVAL)
    }
}

impl WarnLimiter {
    /// A limiter that lets one warning out per `interval`.
    pub(crate) fn every(interval: Duration) -> Self {
        WarnLimiter { interval, state: Mutex::new((None, 0)) }
    }

    /// `Some(suppressed since the last warning)` when a warning may go out now.
    pub(crate) fn allow(&self) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match s.0 {
            Some(last) if now.duration_since(last) < self.interval => {
                s.1 += 1;
                None
            }
            _ => {
                let suppressed = s.1;
                *s = (Some(now), 0);
                Some(suppressed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_shorter_than_32_characters_is_refused_naming_the_rule() {
        let e = ClusterSecret::new(b"a").unwrap_err().to_string();
        assert!(e.contains("1 characters") && e.contains("at least 32"), "{e}");
        assert!(e.contains("openssl rand -hex 32"), "{e}");
        assert!(ClusterSecret::new(&[b'x'; 31]).is_err());
        assert!(ClusterSecret::new(b"").is_err());
        let s = ClusterSecret::new(&[b'x'; 32]).unwrap();
        assert_eq!(format!("{s:?}"), "ClusterSecret(..)");
        // 32 characters, not bytes: 31 two-byte characters are too few.
        assert!(ClusterSecret::new("é".repeat(31).as_bytes()).is_err());
    }

    #[test]
    fn tls_files_are_all_or_none() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(TlsFiles::from_options(None, None, None).unwrap(), None);
        assert!(TlsFiles::from_options(p("c"), p("k"), p("a")).unwrap().is_some());
        let e = TlsFiles::from_options(p("c"), None, p("a")).unwrap_err().to_string();
        assert!(e.contains("all or none") && e.contains("missing: key"), "{e}");
        let e = TlsFiles::from_options(None, None, p("a")).unwrap_err().to_string();
        assert!(e.contains("missing: cert, key"), "{e}");
    }

    #[test]
    fn warnings_are_rate_limited_and_count_what_they_held_back() {
        let l = WarnLimiter::default();
        assert_eq!(l.allow(), Some(0));
        assert_eq!(l.allow(), None);
        assert_eq!(l.allow(), None);
        l.state.lock().unwrap().0 = Some(Instant::now() - AUTH_WARN_INTERVAL);
        assert_eq!(l.allow(), Some(2));
    }
}
