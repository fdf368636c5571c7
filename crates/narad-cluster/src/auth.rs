//! How a peer proves it belongs to the cluster: with a cluster secret,
//! every stream opens with an Auth frame carrying
//! HMAC-SHA256(secret, `narad-cluster-auth-v1`), compared in constant
//! time; with cluster TLS files, mutual TLS against the cluster CA.

use crate::error::{Error, Result};
use crate::limits::{AUTH_TAG_LEN, AUTH_WARN_INTERVAL};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// The message the HMAC is taken over.
pub const AUTH_CONTEXT: &[u8] = b"narad-cluster-auth-v1";

/// The shared cluster secret (`NARAD_CLUSTER_SECRET`). Its Debug never
/// shows it.
#[derive(Clone)]
pub struct ClusterSecret {
    tag: [u8; AUTH_TAG_LEN],
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// A secret; an empty one is refused.
    pub fn new(secret: &[u8]) -> Result<ClusterSecret> {
        if secret.is_empty() {
            return Err(Error::Config("the cluster secret is empty".into()));
        }
        let mut mac = Hmac::<Sha256>::new_from_slice(secret)
            .map_err(|e| Error::Config(format!("cluster secret: {e}")))?;
        mac.update(AUTH_CONTEXT);
        Ok(ClusterSecret { tag: mac.finalize().into_bytes().into() })
    }

    /// The Auth frame's payload.
    pub fn tag(&self) -> [u8; AUTH_TAG_LEN] {
        self.tag
    }

    /// Whether `presented` is this secret's tag (constant time).
    pub fn verify(&self, presented: &[u8]) -> bool {
        presented.len() == AUTH_TAG_LEN && bool::from(self.tag.ct_eq(presented))
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

/// How nodes authenticate each other.
#[derive(Debug, Clone, Default)]
pub struct ClusterAuth {
    /// The HMAC secret every stream must present first.
    pub secret: Option<ClusterSecret>,
    /// Mutual TLS against a cluster CA (else an ephemeral self-signed
    /// server certificate that clients do not verify).
    pub tls: Option<TlsFiles>,
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
    fn the_tag_is_hmac_sha256_of_the_context_and_verifies_in_constant_time() {
        // HMAC-SHA256(key "secret", "narad-cluster-auth-v1"), checked-in.
        let s = ClusterSecret::new(b"secret").unwrap();
        let golden: [u8; 32] = GOLDEN_TAG;
        assert_eq!(s.tag(), golden);
        assert!(s.verify(&golden));
        let mut wrong = golden;
        wrong[31] ^= 1;
        assert!(!s.verify(&wrong));
        assert!(!s.verify(&golden[..31]));
        assert!(!s.verify(&[]));
        assert!(!ClusterSecret::new(b"other").unwrap().verify(&golden));
        assert!(ClusterSecret::new(b"").is_err());
        assert_eq!(format!("{s:?}"), "ClusterSecret(..)");
    }

    /// Computed independently (Python's hmac module).
    const GOLDEN_TAG: [u8; 32] = [
        0x00, 0xe7, 0x38, 0xdd, 0x84, 0x99, 0x20, 0x06, 0xfd, 0x78, 0x17, 0xdd, 0xbc, 0x75, 0x00,
        0xc3, //
        0xf2, 0x8d, 0x4b, 0x38, 0xd2, 0x68, 0xff, 0x7b, 0xef, 0xb7, 0xae, 0xd6, 0xac, 0xd0, 0xdf,
        0x91,
    ];

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
