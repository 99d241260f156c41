//! The engine sidecar's contract with the pod the operator renders around it.

/// The header a `/drain` caller outside the Pod's loopback sends (the kubelet's
/// `preStop` hook, from the node).
pub const DRAIN_TOKEN_HEADER: &str = "x-infera-drain-token";

/// The environment variable the sidecar reads the drain token from (never a flag: argv
/// is visible to every process of the Pod).
pub const DRAIN_TOKEN_ENV: &str = "INFERA_DRAIN_TOKEN";
