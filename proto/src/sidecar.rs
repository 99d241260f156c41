//! The engine sidecar's contract with the pod the operator renders around it.

/// The header a `/drain` caller outside the Pod's loopback sends (the kubelet's
/// `preStop` hook, from the node).
pub const DRAIN_TOKEN_HEADER: &str = "x-infera-drain-token";

/// The environment variable the sidecar reads the drain token from (never a flag: argv
/// is visible to every process of the Pod).
pub const DRAIN_TOKEN_ENV: &str = "INFERA_DRAIN_TOKEN";

/// The environment variable naming the revision of the engine spec a worker runs; the
/// sidecar registers it as the record's `revision` (environment only: engines have a
/// `--revision` flag of their own).
pub const REVISION_ENV: &str = "INFERA_ENGINE_REVISION";

/// Where the sidecar (on its status port) lists the tokenizer files its engine uses,
/// as a [`TokenizerManifest`]; each file is at `TOKENIZER_PATH/<name>`. A gateway that
/// cannot see the model volume fetches its tokenizer there.
pub const TOKENIZER_PATH: &str = "/tokenizer";

/// The tokenizer a worker's engine uses: its digest (the record's `tokenizer_digest`
/// rule, [`crate::tokenizer`]) and the files a router needs to rebuild it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenizerManifest {
    /// The digest of the files.
    pub digest: String,
    /// File names (tokenizer files only), each served at `TOKENIZER_PATH/<name>`.
    pub files: Vec<String>,
}
