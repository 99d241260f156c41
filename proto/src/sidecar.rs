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
    /// Chat template files (`chat_template.jinja`,
    /// `additional_chat_templates/<name>.jinja`: [`crate::tokenizer::chat_template_name`]),
    /// each served at `TOKENIZER_PATH/<path>`. Apart from `files`, so a gateway of an
    /// earlier release, which refuses a manifest listing a file that is not a tokenizer
    /// file, still loads the tokenizer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chat_templates: Vec<String>,
    /// The digest of the chat templates ([`crate::tokenizer::compute_named_digest`]),
    /// outside `digest` as templates were outside the earlier compat key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_templates_digest: Option<String>,
}

/// Where the sidecar (on its status port) takes a prefetch hint for the kvd beside its
/// engine (`POST`, a [`PrefetchHintRequest`]): it sends kvd one `prefetch_hint` frame and
/// answers 202 `{"accepted": true, "n_keys": N}`, or 503 when it has no kvd (no
/// `--kvd-socket`) or kvd is unreachable. Callers outside the Pod's loopback send
/// [`DRAIN_TOKEN_HEADER`], as for `/drain`; a gateway forwards its
/// `POST /v1/cache/prewarm` here.
pub const KVD_PREFETCH_PATH: &str = "/kvd/prefetch";

/// A prefetch hint for kvd, as JSON: kvd's `prefetch_hint` fields, the keys as hex.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PrefetchHintRequest {
    /// The block keys, hex (8 bytes each: kvd's keys; others match nothing).
    pub keys: Vec<String>,
    /// The model the keys belong to.
    pub model: String,
    /// The engine compatibility key ("" = none given).
    #[serde(default)]
    pub compat_key: String,
    /// How long warmed entries are worth keeping, in milliseconds.
    pub deadline_ms: u64,
}
