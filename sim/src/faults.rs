//! Fault injection for tests of routers and sidecars: fail the next N requests, break
//! streams after K tokens, hang, report unhealthy. Settable at start (flags) and at run
//! time (`POST /sim/faults`). Slow start and refused connections are start-up flags
//! handled by the listener.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The faults in force, as `GET/POST /sim/faults` shows and takes them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSettings {
    /// Answer the next N generation requests with a 500.
    #[serde(default)]
    pub fail_next: u64,
    /// Break every stream (drop the connection) after this many tokens.
    #[serde(default)]
    pub fail_after_tokens: Option<u64>,
    /// Kill the whole worker process (as SIGKILL would: nothing more is written) once a
    /// stream has sent this many tokens.
    #[serde(default)]
    pub exit_after_tokens: Option<u64>,
    /// Accept generation requests and never answer them.
    #[serde(default)]
    pub hang: bool,
    /// Answer `/health` with 503.
    #[serde(default)]
    pub unhealthy: bool,
}

/// Live fault state shared by a worker's handlers.
#[derive(Debug, Default)]
pub struct Faults {
    fail_next: AtomicU64,
    fail_after_tokens: AtomicU64,
    exit_after_tokens: AtomicU64,
    hang: AtomicBool,
    unhealthy: AtomicBool,
}

const OFF: u64 = u64::MAX;

impl Faults {
    /// State from settings.
    pub fn new(settings: &FaultSettings) -> Self {
        let faults = Self::default();
        faults.set(settings);
        faults
    }

    /// Replaces the settings.
    pub fn set(&self, s: &FaultSettings) {
        self.fail_next.store(s.fail_next, Ordering::SeqCst);
        self.fail_after_tokens
            .store(s.fail_after_tokens.unwrap_or(OFF), Ordering::SeqCst);
        self.exit_after_tokens
            .store(s.exit_after_tokens.unwrap_or(OFF), Ordering::SeqCst);
        self.hang.store(s.hang, Ordering::SeqCst);
        self.unhealthy.store(s.unhealthy, Ordering::SeqCst);
    }

    /// The current settings.
    pub fn get(&self) -> FaultSettings {
        let after = self.fail_after_tokens.load(Ordering::SeqCst);
        FaultSettings {
            fail_next: self.fail_next.load(Ordering::SeqCst),
            fail_after_tokens: (after != OFF).then_some(after),
            exit_after_tokens: self.exit_after_tokens(),
            hang: self.hang.load(Ordering::SeqCst),
            unhealthy: self.unhealthy.load(Ordering::SeqCst),
        }
    }

    /// Whether this request should fail (consumes one of `fail_next`).
    pub fn take_failure(&self) -> bool {
        self.fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Tokens after which streams break, if set.
    pub fn fail_after_tokens(&self) -> Option<u64> {
        let n = self.fail_after_tokens.load(Ordering::SeqCst);
        (n != OFF).then_some(n)
    }

    /// Tokens after which the process dies, if set.
    pub fn exit_after_tokens(&self) -> Option<u64> {
        let n = self.exit_after_tokens.load(Ordering::SeqCst);
        (n != OFF).then_some(n)
    }

    /// Whether requests hang.
    pub fn hang(&self) -> bool {
        self.hang.load(Ordering::SeqCst)
    }

    /// Whether health fails.
    pub fn unhealthy(&self) -> bool {
        self.unhealthy.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_next_counts_down() {
        let f = Faults::new(&FaultSettings {
            fail_next: 2,
            ..Default::default()
        });
        assert!(f.take_failure());
        assert!(f.take_failure());
        assert!(!f.take_failure());
        assert_eq!(f.get().fail_next, 0);
    }

    #[test]
    fn settings_round_trip() {
        let s = FaultSettings {
            fail_next: 1,
            fail_after_tokens: Some(3),
            exit_after_tokens: Some(4),
            hang: true,
            unhealthy: true,
        };
        assert_eq!(Faults::new(&s).get(), s);
        assert!(serde_json::from_str::<FaultSettings>(r#"{"typo": 1}"#).is_err());
    }
}
