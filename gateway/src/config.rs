//! The gateway's command line: the earlier server's flag names, each with an `INFERA_*`
//! environment variable (flag > environment > default). Every flag of the earlier
//! `python -m infera.server` is accepted and takes effect, except `--router-backend`,
//! which chose between its Python router and the Rust one this gateway is: accepted,
//! with a one-line notice at start ([`compute_earlier_flag_notices`]).
//!
//! Where a default differs from the earlier `python -m infera.server`'s, the difference
//! is logged once at start ([`compute_earlier_default_differences`]) and listed in the
//! README's migration table, so an earlier command line never changes behaviour
//! silently.

use crate::route::rotation::PolicyKind;
use crate::workers::breaker::BreakerConfig;
use clap::{Parser, ValueEnum};
use infera_etcd_conn::EtcdSecurity;
use infera_proto::discovery::DEFAULT_ETCD_PREFIX;
use infera_proto::retention::Retention;
use std::path::PathBuf;
use std::time::Duration;

/// `--router-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RouterMode {
    /// Pick workers per request (mixed, or prefill/decode pairs).
    Auto,
    /// Honour `x-worker-instance-id` / `x-prefill-instance-id` from an external picker.
    Direct,
}

/// `--router-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Score workers by cached prefix and load.
    KvAware,
    /// Rotate.
    RoundRobin,
    /// Uniformly at random.
    Random,
}

/// `--discovery-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiscoveryBackend {
    /// Watch worker records under an etcd prefix.
    Etcd,
    /// Read worker records from Pod annotations.
    Kubernetes,
    /// Read worker records from a YAML or JSON file (re-read when it changes).
    Static,
}

/// `--kv-event-transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvEventTransport {
    /// Subscribe to each engine's ZMQ publisher.
    Zmq,
    /// Consume the sidecars' NATS JetStream relay.
    Nats,
}

/// `--router-backend`: the earlier server's choice between its Python router and its
/// Rust one. This gateway is a Rust router; either value is accepted and chooses nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RouterBackend {
    /// The earlier server's in-process asyncio router.
    Python,
    /// The earlier `infera-router` binary the server exec'd.
    Rust,
}

/// An earlier on/off switch as the earlier server read its environment: `1`, `true` or
/// `yes` (any case) turn it on, anything else leaves it off.
fn earlier_switch(value: &str) -> Result<bool, std::convert::Infallible> {
    Ok(matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes"
    ))
}

/// The NATS server when neither a flag nor the environment names one.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// `--request-transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RequestTransportArg {
    /// HTTP to each worker's URL.
    Http,
    /// Workers registering `request_transport: nats` are reached on their NATS subject
    /// (`infera.req.<tok>`); the others over HTTP.
    Nats,
}

/// `--default-retention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RetentionArg {
    /// Do not keep.
    None,
    /// Keep only while convenient.
    Ephemeral,
    /// Minutes.
    Short,
    /// Hours.
    Long,
}

impl From<RetentionArg> for Retention {
    fn from(r: RetentionArg) -> Self {
        match r {
            RetentionArg::None => Retention::None,
            RetentionArg::Ephemeral => Retention::Ephemeral,
            RetentionArg::Short => Retention::Short,
            RetentionArg::Long => Retention::Long,
        }
    }
}

/// Infera gateway: serves the OpenAI API (and Anthropic's /v1/messages) and routes each
/// request to an engine worker discovered in etcd, in Kubernetes Pod annotations, or in a
/// static file.
#[derive(Debug, Clone, Parser)]
#[command(name = "infera-gateway", version, about, long_about = None)]
pub struct GatewayConfig {
    /// Address to listen on.
    #[arg(long, env = "INFERA_HOST", default_value = "0.0.0.0")]
    pub host: String,

    /// Port to listen on.
    #[arg(long, env = "INFERA_PORT", default_value_t = 8000)]
    pub port: u16,

    /// auto: pick workers per request (mixed, or prefill/decode pairs); direct: send to
    /// the workers an external endpoint picker named in `x-worker-instance-id` (mixed or
    /// decode) and `x-prefill-instance-id` (prefill), without failover; requests without
    /// them are routed as in auto.
    #[arg(long, env = "INFERA_ROUTER_MODE", value_enum, default_value_t = RouterMode::Auto)]
    pub router_mode: RouterMode,

    /// Load-balancing policy. kv-aware sends each request to the worker holding most of
    /// its prefix (from the engines' KV events), weighed against load.
    #[arg(long, env = "INFERA_ROUTER_POLICY", value_enum, default_value_t = PolicyArg::RoundRobin)]
    pub router_policy: PolicyArg,

    /// Tokenizer for kv-aware routing: a model folder (tokenizer.json, tokenizer_config.json
    /// and the chat templates: chat_template.jinja, additional_chat_templates/), a
    /// tokenizer.json file, or a Hugging Face model id (ORG/NAME, no such local path),
    /// whose tokenizer files are fetched from --hf-endpoint in the background ($HF_TOKEN
    /// for gated models) while routing weighs load. A folder with only a tiktoken
    /// vocabulary is routed by bytes, with a warning.
    #[arg(long, env = "INFERA_ROUTER_TOKENIZER_PATH")]
    pub router_tokenizer_path: Option<PathBuf>,

    /// Where a model id given as --router-tokenizer-path is fetched from.
    #[arg(long, env = "HF_ENDPOINT", default_value = "https://huggingface.co")]
    pub hf_endpoint: String,

    /// Fetch the tokenizer for kv-aware routing from the workers instead: the engine
    /// sidecar on this port serves the files its engine loads (`GET /tokenizer`), so the
    /// gateway needs no model volume. Until one worker has served it, prompts are not
    /// matched to cached prefixes (routing weighs load alone); `GET /infera/tokenizer`
    /// tells where it stands.
    #[arg(
        long,
        env = "INFERA_ROUTER_TOKENIZER_FROM_WORKERS",
        value_name = "SIDECAR_PORT",
        conflicts_with = "router_tokenizer_path"
    )]
    pub router_tokenizer_from_workers: Option<u16>,

    /// Where worker records come from.
    #[arg(long, env = "INFERA_DISCOVERY_BACKEND", value_enum, default_value_t = DiscoveryBackend::Etcd)]
    pub discovery_backend: DiscoveryBackend,

    /// etcd endpoint(s), repeatable or comma-separated.
    #[arg(
        long = "etcd-endpoint",
        env = "INFERA_ETCD_ENDPOINT",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_endpoints: Vec<String>,

    /// etcd prefix of worker records.
    #[arg(long, env = "INFERA_ETCD_PREFIX", default_value = DEFAULT_ETCD_PREFIX)]
    pub etcd_prefix: String,

    /// PEM CA that signed etcd's certificate (https:// endpoints), e.g. `ca.crt` of a
    /// mounted Secret. Files are read again on every reconnect.
    #[arg(long, env = "INFERA_ETCD_CA_FILE")]
    pub etcd_ca_file: Option<PathBuf>,

    /// PEM client certificate for etcd's --client-cert-auth (with --etcd-key-file).
    #[arg(long, env = "INFERA_ETCD_CERT_FILE")]
    pub etcd_cert_file: Option<PathBuf>,

    /// PEM private key of --etcd-cert-file.
    #[arg(long, env = "INFERA_ETCD_KEY_FILE")]
    pub etcd_key_file: Option<PathBuf>,

    /// etcd user, when etcd has auth enabled (with --etcd-password-file).
    #[arg(long, env = "INFERA_ETCD_USER")]
    pub etcd_user: Option<String>,

    /// File holding the etcd user's password.
    #[arg(long, env = "INFERA_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,

    /// Seconds to keep routing to the last known workers when etcd comes back empty (it
    /// restarted without its data): each worker whose sidecar registers again within
    /// this time stays without a gap, the others leave at its end. About the workers'
    /// lease TTL; 0 takes an empty etcd at its word.
    #[arg(long, env = "INFERA_EMPTY_RESYNC_GRACE_S", default_value_t = 30.0)]
    pub empty_resync_grace_s: f64,

    /// File of worker records (a YAML or JSON list) for --discovery-backend static.
    #[arg(long, env = "INFERA_STATIC_WORKERS")]
    pub static_workers: Option<PathBuf>,

    /// Label selector of worker Pods (kubernetes discovery), e.g.
    /// `infera.amd.com/deployment=llama`.
    #[arg(long, env = "INFERA_K8S_LABEL_SELECTOR")]
    pub k8s_label_selector: Option<String>,

    /// Namespace of worker Pods (kubernetes discovery); unset: the gateway's own
    /// namespace in a cluster (else the kubeconfig context's, else `default`).
    #[arg(long, env = "INFERA_K8S_NAMESPACE")]
    pub k8s_namespace: Option<String>,

    /// Kubeconfig for kubernetes discovery; unset: `KUBECONFIG` or `~/.kube/config`,
    /// then the in-cluster service account.
    #[arg(long, env = "INFERA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Where kv-aware routing reads engine KV events from.
    #[arg(long, env = "INFERA_KV_EVENT_TRANSPORT", value_enum, default_value_t = KvEventTransport::Zmq)]
    pub kv_event_transport: KvEventTransport,

    /// NATS server URL (NATS KV events, the NATS request plane); unset: the earlier
    /// server's `$NATS_SERVER`, then `$NATS_URL`, then `nats://127.0.0.1:4222`.
    #[arg(long, env = "INFERA_NATS_SERVER")]
    pub nats_server: Option<String>,

    /// How requests reach workers: `http` to each worker's URL, or `nats` (the earlier
    /// server's default), where workers that registered `request_transport: nats` are
    /// reached on their NATS subject and the others still over HTTP.
    #[arg(long, env = "INFERA_REQUEST_TRANSPORT", value_enum, default_value_t = RequestTransportArg::Http)]
    pub request_transport: RequestTransportArg,

    /// NATS requests: seconds to wait for a worker's next reply frame before answering
    /// 504 and cancelling it on the worker (reset by every frame; 0 waits forever).
    #[arg(long, env = "INFERA_NATS_REQ_IDLE_TIMEOUT", default_value_t = 900.0)]
    pub nats_req_idle_timeout: f64,

    /// NATS requests: seconds a whole request may take before it is answered 504 (or
    /// its stream ended) and cancelled on the worker (0: no cap).
    #[arg(long, env = "INFERA_NATS_REQ_MAX_DURATION", default_value_t = 0.0)]
    pub nats_req_max_duration: f64,

    /// NATS requests: admission backlog per worker. Above 0, requests go through the
    /// `INFERA_REQUESTS` JetStream work queue, a worker holding this many unanswered
    /// requests gets no more, and with every worker full the client gets 429 (the
    /// workers run with the same value). 0: plain NATS, no admission.
    #[arg(long, env = "INFERA_NATS_REQ_MAX_PENDING", default_value_t = 0)]
    pub nats_req_max_pending: u64,

    /// Times a streamed generation may move to another worker when its worker fails or
    /// drains mid-stream (over HTTP or NATS): the prompt plus what was generated, the
    /// token budget reduced by it, continued so the client reads one stream. 0: never
    /// (the stream ends with an error event).
    #[arg(long, env = "INFERA_MIGRATION_LIMIT", default_value_t = 0)]
    pub migration_limit: u32,

    /// kv-aware weight of uncached blocks against load.
    #[arg(long, env = "INFERA_KV_OVERLAP_WEIGHT", default_value_t = 1.0)]
    pub kv_overlap_weight: f64,

    /// kv-aware weight on prefill legs.
    #[arg(long, env = "INFERA_KV_PREFILL_OVERLAP_WEIGHT", default_value_t = 20.0)]
    pub kv_prefill_overlap_weight: f64,

    /// kv-aware weight on decode legs.
    #[arg(long, env = "INFERA_KV_DECODE_OVERLAP_WEIGHT", default_value_t = 2.0)]
    pub kv_decode_overlap_weight: f64,

    /// kv-aware: ignore KV events and route on the router's own history of picks
    /// (the approximate mode workers without events get anyway), for comparison.
    #[arg(long, env = "INFERA_KV_APPROXIMATE")]
    pub kv_approximate: bool,

    /// Accepted for the earlier server's command lines, where it chose between its Python
    /// router and the Rust `infera-router` it exec'd. This gateway is a Rust router, so
    /// either value chooses nothing (a notice at start says so).
    #[arg(long, env = "INFERA_ROUTER_BACKEND", value_enum)]
    pub router_backend: Option<RouterBackend>,

    /// kvd's Unix socket on this machine: `POST /v1/cache/prewarm` leaves each hint there
    /// (one `prefetch_hint` frame), as the earlier server did. Unset: hints go to the kvd
    /// beside each active worker of the hint's model, through its engine sidecar
    /// (--worker-sidecar-port); with neither, prewarm answers 503.
    #[arg(long, env = "INFERA_KVD_SOCKET_PATH")]
    pub kvd_socket_path: Option<PathBuf>,

    /// The engine sidecars' status port: `POST /v1/cache/prewarm` forwards hints to each
    /// worker's sidecar there (`POST /kvd/prefetch`, which leaves them with the kvd beside
    /// its engine), presenting `$INFERA_DRAIN_TOKEN` as `x-infera-drain-token` (the
    /// sidecar authorises it as it does `/drain`). Default: the port of
    /// --router-tokenizer-from-workers.
    #[arg(long, env = "INFERA_WORKER_SIDECAR_PORT")]
    pub worker_sidecar_port: Option<u16>,

    /// Serve `POST /v1/admin/profile/start` and `/stop`: each is forwarded to the
    /// matching active workers' engines (`/start_profile`, `/stop_profile`), selected by
    /// `worker_id`, `model` and `role` in the query or the JSON body; the rest of the body
    /// goes to the engine. Off: 403. `INFERA_ENABLE_PROFILING` of 1, true or yes turns it
    /// on, as for the earlier server.
    #[arg(
        long,
        env = "INFERA_ENABLE_PROFILING",
        value_parser = earlier_switch,
        action = clap::ArgAction::SetTrue
    )]
    pub enable_profiling: bool,

    /// Serve `GET` and `POST /v1/admin/scale`: read and set the worker counts of the
    /// InferaDeployment this gateway belongs to (--deployment). The gateway's account
    /// needs `get` and `patch` on it: the operator grants exactly that with
    /// `spec.gateway.scalingApi: true`, which also sets this flag. Off: 403.
    /// `INFERA_ENABLE_SCALING_API` of 1, true or yes turns it on.
    #[arg(
        long,
        env = "INFERA_ENABLE_SCALING_API",
        value_parser = earlier_switch,
        action = clap::ArgAction::SetTrue
    )]
    pub enable_scaling_api: bool,

    /// The InferaDeployment this gateway serves (in --k8s-namespace, else the gateway's
    /// own namespace): what `/v1/admin/scale` scales. The operator sets it with
    /// `spec.gateway.scalingApi`; unset (a gateway the operator did not make),
    /// `/v1/admin/scale` answers 409.
    #[arg(long, env = "INFERA_DEPLOYMENT")]
    pub deployment: Option<String>,

    /// Retries on another worker before the first response byte.
    #[arg(long, env = "INFERA_REQUEST_MAX_RETRIES", default_value_t = 1)]
    pub request_max_retries: u32,

    /// Consecutive faults that open a worker's circuit breaker (0: breakers off, as for
    /// the earlier server).
    #[arg(long, env = "INFERA_BREAKER_FAILURE_THRESHOLD", default_value_t = 3)]
    pub breaker_failure_threshold: u32,

    /// First breaker cooldown, seconds.
    #[arg(long, env = "INFERA_BREAKER_COOLDOWN_S", default_value_t = 5.0)]
    pub breaker_cooldown_s: f64,

    /// Longest breaker cooldown, seconds.
    #[arg(long, env = "INFERA_BREAKER_MAX_COOLDOWN_S", default_value_t = 60.0)]
    pub breaker_max_cooldown_s: f64,

    /// Seconds to wait for a worker's response headers before answering 504.
    #[arg(long, env = "INFERA_REQUEST_TIMEOUT_S", default_value_t = 600.0)]
    pub request_timeout_s: f64,

    /// Seconds to wait for a TCP connection to a worker.
    #[arg(long, env = "INFERA_CONNECT_TIMEOUT_S", default_value_t = 3.0)]
    pub connect_timeout_s: f64,

    /// Seconds between health checks of every worker (`GET /health`); 0: none. A worker
    /// failing --health-check-failures in a row takes no traffic and its requests in
    /// flight end with an error, until it passes one again.
    #[arg(long, env = "INFERA_HEALTH_CHECK_INTERVAL_S", default_value_t = 5.0)]
    pub health_check_interval_s: f64,

    /// Seconds a health check waits for its answer.
    #[arg(long, env = "INFERA_HEALTH_CHECK_TIMEOUT_S", default_value_t = 5.0)]
    pub health_check_timeout_s: f64,

    /// Failed health checks in a row that take a worker out of routing.
    #[arg(long, env = "INFERA_HEALTH_CHECK_FAILURES", default_value_t = 3)]
    pub health_check_failures: u32,

    /// Seconds a stream may stay silent before it is ended with an error event.
    #[arg(long, env = "INFERA_STREAM_IDLE_TIMEOUT_S", default_value_t = 600.0)]
    pub stream_idle_timeout_s: f64,

    /// Export OpenTelemetry spans over OTLP/HTTP (protobuf) to this URL, the whole path
    /// included (`http://otel-collector:4318/v1/traces`): per request its routing, its
    /// first byte and its completion, and a client span per request to a worker, whose
    /// W3C `traceparent` the engine continues. Off by default; without it a client's
    /// `traceparent` is passed through to the engine unchanged.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")]
    pub otlp_traces_endpoint: Option<String>,

    /// Log one JSON object per line (on stderr) instead of text.
    #[arg(long, env = "INFERA_LOG_JSON")]
    pub log_json: bool,

    /// Largest request body accepted, bytes.
    #[arg(long, env = "INFERA_MAX_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Seconds a client has to send its whole request body (408 after).
    #[arg(long, env = "INFERA_BODY_READ_TIMEOUT_S", default_value_t = 30.0)]
    pub body_read_timeout_s: f64,

    /// Seconds a client has to send a request's headers, counted from when its
    /// connection is ready for the next request: idle keep-alive connections close after
    /// it too. Also bounds the TLS handshake.
    #[arg(long, env = "INFERA_HEADER_READ_TIMEOUT_S", default_value_t = 30.0)]
    pub header_read_timeout_s: f64,

    /// Connections open at once; past it new ones wait in the listen backlog until one
    /// closes. 0: no limit.
    #[arg(long, env = "INFERA_MAX_CONNECTIONS", default_value_t = 8192)]
    pub max_connections: usize,

    /// Serve HTTPS with this PEM certificate chain (with --tls-key-file), e.g. `tls.crt`
    /// of a mounted `kubernetes.io/tls` Secret. Renewed files are served within 30 s.
    #[arg(long, env = "INFERA_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// The PEM private key of --tls-cert-file (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "INFERA_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,

    /// Also serve the endpoint picker of the Gateway API Inference Extension on this
    /// port: a Gateway in front of an InferencePool (Envoy's ext_proc filter, and the
    /// gateways built on it) asks it which worker takes each request, chosen with this
    /// gateway's discovery, policy and kv state. GAIE's port is 9002. Off unless set.
    #[arg(long, env = "INFERA_EPP_PORT")]
    pub epp_port: Option<u16>,

    /// The endpoint picker's plaintext gRPC health port (services `liveness`,
    /// `readiness`, `inference-extension`, the ext_proc service and `""`; ready once
    /// discovery has synced). Also served on --epp-port.
    #[arg(long, env = "INFERA_EPP_HEALTH_PORT", default_value_t = 9003)]
    pub epp_health_port: u16,

    /// TLS on --epp-port, as GAIE's reference picker serves it: the certificate of
    /// --epp-tls-cert-file, else a self-signed one made at start (GAIE gateways do not
    /// verify it). `--epp-secure-serving false` serves plaintext h2.
    #[arg(long, env = "INFERA_EPP_SECURE_SERVING", default_value_t = true, action = clap::ArgAction::Set)]
    pub epp_secure_serving: bool,

    /// PEM certificate chain for --epp-port (with --epp-tls-key-file).
    #[arg(long, env = "INFERA_EPP_TLS_CERT_FILE", requires = "epp_tls_key_file")]
    pub epp_tls_cert_file: Option<PathBuf>,

    /// The PEM private key of --epp-tls-cert-file.
    #[arg(long, env = "INFERA_EPP_TLS_KEY_FILE", requires = "epp_tls_cert_file")]
    pub epp_tls_key_file: Option<PathBuf>,

    /// The port written into picked endpoints instead of the worker's own (the earlier
    /// picker's --destination-port: a frontend beside each engine, e.g. a gateway in
    /// direct mode). Default: the port of the worker's URL.
    #[arg(long, env = "INFERA_EPP_DESTINATION_PORT")]
    pub epp_destination_port: Option<u16>,

    /// Fallback endpoints listed after the picked one, in the order the picker would try
    /// them (Envoy's override_host policy goes down the list on a retry). Prefill/decode
    /// pairs have none.
    #[arg(long, env = "INFERA_EPP_FALLBACKS", default_value_t = 2)]
    pub epp_fallbacks: usize,

    /// With kubernetes discovery, take the worker Pods from this InferencePool
    /// (`inference.networking.k8s.io/v1`, in --k8s-namespace): its `selector.matchLabels`
    /// replace --k8s-label-selector and its `targetPorts` those of --epp-target-ports.
    /// Read at start. Needs `get` on inferencepools.
    #[arg(long, env = "INFERA_EPP_POOL_NAME")]
    pub epp_pool_name: Option<String>,

    /// With kubernetes discovery, route Ready Pods that have no Infera sidecar (no
    /// worker record: a stock vLLM or SGLang someone else deployed) on these ports,
    /// each port an endpoint, for any model, by load and the prefixes of the picker's
    /// own picks. Pods with a sidecar bring their records as always.
    #[arg(long, env = "INFERA_EPP_TARGET_PORTS", value_delimiter = ',')]
    pub epp_target_ports: Vec<u16>,

    /// Requests the picker lets a worker have in flight; when every candidate has that
    /// many, the request is refused with 429 (GAIE's "all full"). 0: no cap.
    #[arg(long, env = "INFERA_EPP_MAX_INFLIGHT_PER_WORKER", default_value_t = 0)]
    pub epp_max_inflight_per_worker: u64,

    /// Flow control.
    #[command(flatten)]
    pub flow: crate::flow::config::FlowArgs,

    /// Requests served at once (from arrival to the last byte of the answer, streams
    /// included); more are refused at once with 429 and `Retry-After`. 0: no limit.
    #[arg(long, env = "INFERA_MAX_CONCURRENT_REQUESTS", default_value_t = 1024)]
    pub max_concurrent_requests: usize,

    /// Most JSON values a request body may hold (token ids, messages, content parts and
    /// their fields): refused with 400 before parsing, so no body within the byte limit
    /// can grow past a few tens of megabytes once parsed. 262,144 fits a 256k-token
    /// prompt given as ids.
    #[arg(long, env = "INFERA_MAX_REQUEST_VALUES", default_value_t = 262_144)]
    pub max_request_values: usize,

    /// Deepest nesting of lists and objects in a request body (refused with 400).
    #[arg(long, env = "INFERA_MAX_REQUEST_DEPTH", default_value_t = 32)]
    pub max_request_depth: usize,

    /// Require an API key on `/metrics` too (it lists worker addresses); needs
    /// --api-keys-file.
    #[arg(long, env = "INFERA_METRICS_REQUIRE_AUTH")]
    pub metrics_require_auth: bool,

    /// File of accepted bearer tokens, one per line (# comments); unset: no auth. Read
    /// again every 30 s: keys rotated in a mounted Secret are served without a restart.
    #[arg(long, env = "INFERA_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,

    /// Retention forwarded for requests without a cache hint.
    #[arg(long, env = "INFERA_DEFAULT_RETENTION", value_enum, default_value_t = RetentionArg::Long)]
    pub default_retention: RetentionArg,

    /// Seconds to let open requests finish on shutdown.
    #[arg(long, env = "INFERA_SHUTDOWN_GRACE_S", default_value_t = 30.0)]
    pub shutdown_grace_s: f64,

    /// Seconds to keep serving after SIGTERM before the listener closes: meanwhile
    /// `/ready` answers 503 and every response closes its connection, so a load balancer
    /// (a Kubernetes Service) stops sending here and clients reconnect elsewhere before
    /// anything is refused. The operator renders 10; 0 stops accepting at once.
    #[arg(long, env = "INFERA_SHUTDOWN_DELAY_S", default_value_t = 0.0)]
    pub shutdown_delay_s: f64,
}

/// A setting whose value here differs from what the earlier `python -m infera.server`
/// would have used for the same command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EarlierDifference {
    /// The flag (or environment variable) concerned.
    pub setting: &'static str,
    /// The value used here.
    pub here: String,
    /// What the earlier server used.
    pub earlier: &'static str,
}

/// The settings left at a default that differs from the earlier server's, where the
/// difference matters for `cfg` (the kv-event transport and the prefill/decode weights
/// only under kv-aware routing), plus the earlier server's environment variables that
/// are set but not read here. `defaulted(id)` says whether the flag with clap id `id`
/// (the field name) was left at its default, neither given nor set in the environment;
/// `env(name)` reads the environment.
pub fn compute_earlier_default_differences(
    cfg: &GatewayConfig,
    defaulted: impl Fn(&str) -> bool,
    env: impl Fn(&str) -> Option<String>,
) -> Vec<EarlierDifference> {
    let mut out = Vec::new();
    let mut differs = |id: &str, applies: bool, setting, here: String, earlier| {
        if applies && defaulted(id) {
            out.push(EarlierDifference {
                setting,
                here,
                earlier,
            });
        }
    };
    let kv = cfg.kv_aware();
    differs(
        "router_policy",
        true,
        "--router-policy",
        "round-robin".into(),
        "kv-aware",
    );
    differs(
        "discovery_backend",
        true,
        "--discovery-backend",
        "etcd".into(),
        "kubernetes",
    );
    differs(
        "kv_event_transport",
        kv,
        "--kv-event-transport",
        "zmq".into(),
        "nats",
    );
    differs(
        "request_transport",
        true,
        "--request-transport",
        "http (workers registering request_transport nats are reached over HTTP at their url)"
            .into(),
        "nats",
    );
    differs(
        "kv_prefill_overlap_weight",
        kv,
        "--kv-prefill-overlap-weight",
        cfg.kv_prefill_overlap_weight.to_string(),
        "unset: the --kv-overlap-weight value",
    );
    differs(
        "kv_decode_overlap_weight",
        kv,
        "--kv-decode-overlap-weight",
        cfg.kv_decode_overlap_weight.to_string(),
        "unset: the --kv-overlap-weight value",
    );
    differs(
        "request_timeout_s",
        true,
        "--request-timeout-s",
        format!("{} s to a worker's response headers", cfg.request_timeout_s),
        "none over HTTP",
    );
    differs(
        "stream_idle_timeout_s",
        true,
        "--stream-idle-timeout-s",
        format!("{} s between streamed chunks", cfg.stream_idle_timeout_s),
        "none over HTTP, 900 s over its NATS request plane",
    );
    differs(
        "connect_timeout_s",
        true,
        "--connect-timeout-s",
        format!("{} s", cfg.connect_timeout_s),
        "60 s",
    );
    differs(
        "health_check_interval_s",
        true,
        "--health-check-interval-s",
        format!(
            "GET /health every {} s, {} failures in a row take a worker out of routing",
            cfg.health_check_interval_s, cfg.health_check_failures
        ),
        "no health checks",
    );
    differs(
        "max_concurrent_requests",
        true,
        "--max-concurrent-requests",
        format!("{} (429 past it)", cfg.max_concurrent_requests),
        "no limit over HTTP",
    );
    if let Some(v) = env("INFERA_ROUTER_DEFAULT_RETENTION")
        && defaulted("default_retention")
    {
        out.push(EarlierDifference {
            setting: "INFERA_ROUTER_DEFAULT_RETENTION",
            here: format!(
                "not read (set --default-retention or INFERA_DEFAULT_RETENTION); {} is used",
                format!("{:?}", cfg.default_retention).to_lowercase()
            ),
            earlier: if v.trim().is_empty() {
                "long"
            } else {
                "its value"
            },
        });
    }
    out
}

/// One line per earlier flag this gateway accepts without it changing anything, saying
/// why; logged at start.
pub fn compute_earlier_flag_notices(cfg: &GatewayConfig) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(backend) = cfg.router_backend {
        let which = match backend {
            RouterBackend::Python => "python",
            RouterBackend::Rust => "rust",
        };
        out.push(format!(
            "--router-backend {which}: accepted for earlier command lines; this gateway is a \
             Rust router serving every endpoint of the earlier server, so the flag chooses nothing"
        ));
    }
    out
}

/// One log line listing `differences`.
pub fn build_earlier_default_notice(differences: &[EarlierDifference]) -> String {
    let items: Vec<String> = differences
        .iter()
        .map(|d| format!("{} {} (earlier: {})", d.setting, d.here, d.earlier))
        .collect();
    format!(
        "defaults that differ from the earlier python -m infera.server (give the flag to choose; \
         the book's how-to/migrate.md): {}",
        items.join("; ")
    )
}

/// A setting that cannot work (yet), with what to do instead.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl GatewayConfig {
    /// The load-balancing policy used when routing is not kv-aware (and to order
    /// candidates for failover).
    pub(crate) fn policy(&self) -> PolicyKind {
        match self.router_policy {
            PolicyArg::Random => PolicyKind::Random,
            PolicyArg::RoundRobin | PolicyArg::KvAware => PolicyKind::RoundRobin,
        }
    }

    /// The NATS server: `--nats-server`, else the earlier server's `$NATS_SERVER`, else
    /// `$NATS_URL`, else `nats://127.0.0.1:4222`.
    pub fn nats_url(&self, env: impl Fn(&str) -> Option<String>) -> String {
        self.nats_server
            .clone()
            .or_else(|| env("NATS_SERVER"))
            .or_else(|| env("NATS_URL"))
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_NATS_URL.into())
    }

    /// Where prewarm hints go: the sidecars' port (--worker-sidecar-port, else
    /// --router-tokenizer-from-workers's).
    pub(crate) fn sidecar_port(&self) -> Option<u16> {
        self.worker_sidecar_port
            .or(self.router_tokenizer_from_workers)
    }

    /// The request plane's timeouts and admission limit.
    pub(crate) fn plane_settings(&self) -> crate::send::nats::PlaneSettings {
        let seconds = |s: f64| (s > 0.0).then(|| std::time::Duration::from_secs_f64(s));
        crate::send::nats::PlaneSettings {
            idle_timeout: seconds(self.nats_req_idle_timeout),
            max_duration: seconds(self.nats_req_max_duration),
            max_pending: self.nats_req_max_pending,
        }
    }

    /// Whether routing follows the engines' KV caches.
    pub fn kv_aware(&self) -> bool {
        self.router_policy == PolicyArg::KvAware
    }

    /// How to secure the etcd connection.
    pub fn etcd_security(&self) -> EtcdSecurity {
        EtcdSecurity {
            ca_file: self.etcd_ca_file.clone(),
            cert_file: self.etcd_cert_file.clone(),
            key_file: self.etcd_key_file.clone(),
            user: self.etcd_user.clone(),
            password_file: self.etcd_password_file.clone(),
        }
    }

    /// Checks flags that depend on each other or on capabilities not built yet.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.discovery_backend == DiscoveryBackend::Etcd {
            self.etcd_security()
                .validate(&self.etcd_endpoints)
                .map_err(|e| ConfigError(e.0))?;
        }
        let timeouts = [self.nats_req_idle_timeout, self.nats_req_max_duration];
        if timeouts.iter().any(|t| !t.is_finite() || *t < 0.0) {
            return Err(ConfigError(
                "--nats-req-idle-timeout and --nats-req-max-duration are seconds, 0 (off) or more"
                    .into(),
            ));
        }
        if self.metrics_require_auth && self.api_keys_file.is_none() {
            return Err(ConfigError(
                "--metrics-require-auth needs --api-keys-file (the keys /metrics would require)"
                    .into(),
            ));
        }
        let seconds = |s: f64, zero_ok: bool| s.is_finite() && (s > 0.0 || (zero_ok && s == 0.0));
        if !(seconds(self.health_check_interval_s, true)
            && seconds(self.health_check_timeout_s, false))
        {
            return Err(ConfigError(
                "--health-check-interval-s must be 0 (off) or positive and \
                 --health-check-timeout-s positive, in seconds"
                    .into(),
            ));
        }
        if !seconds(self.header_read_timeout_s, false) {
            return Err(ConfigError(
                "--header-read-timeout-s must be a positive number of seconds".into(),
            ));
        }
        if self.kv_overlap_weight.is_nan() || self.kv_overlap_weight < 0.0 {
            return Err(ConfigError(
                "--kv-overlap-weight must be zero or positive".into(),
            ));
        }
        for (name, w) in [
            (
                "--kv-prefill-overlap-weight",
                self.kv_prefill_overlap_weight,
            ),
            ("--kv-decode-overlap-weight", self.kv_decode_overlap_weight),
        ] {
            if w.is_nan() || w < 0.0 {
                return Err(ConfigError(format!("{name} must be zero or positive")));
            }
        }
        match self.discovery_backend {
            DiscoveryBackend::Kubernetes
                if self.epp_pool_name.is_none()
                    && self
                        .k8s_label_selector
                        .as_deref()
                        .is_none_or(|s| s.trim().is_empty()) =>
            {
                return Err(ConfigError(
                    "--discovery-backend kubernetes needs --k8s-label-selector SELECTOR \
                     (the labels of the worker Pods, e.g. infera.amd.com/deployment=NAME), \
                     or --epp-pool-name (an InferencePool's selector)"
                        .into(),
                ));
            }
            DiscoveryBackend::Static if self.static_workers.is_none() => {
                return Err(ConfigError(
                    "--discovery-backend static needs --static-workers FILE".into(),
                ));
            }
            _ => {}
        }
        if self.etcd_endpoints.iter().all(|e| e.trim().is_empty())
            && self.discovery_backend == DiscoveryBackend::Etcd
        {
            return Err(ConfigError("--etcd-endpoint is empty".into()));
        }
        for (name, v) in [
            ("--breaker-cooldown-s", self.breaker_cooldown_s),
            ("--breaker-max-cooldown-s", self.breaker_max_cooldown_s),
            ("--request-timeout-s", self.request_timeout_s),
            ("--connect-timeout-s", self.connect_timeout_s),
            ("--stream-idle-timeout-s", self.stream_idle_timeout_s),
        ] {
            if v.is_nan() || v <= 0.0 {
                return Err(ConfigError(format!(
                    "{name} must be a positive number of seconds (got {v})"
                )));
            }
        }
        for (name, v) in [
            ("--shutdown-grace-s", self.shutdown_grace_s),
            ("--shutdown-delay-s", self.shutdown_delay_s),
        ] {
            if !(0.0..=86_400.0).contains(&v) {
                return Err(ConfigError(format!(
                    "{name} must be between 0 and 86400 seconds (got {v})"
                )));
            }
        }
        Ok(())
    }

    /// Breaker settings.
    pub(crate) fn breaker(&self) -> BreakerConfig {
        BreakerConfig {
            threshold: self.breaker_failure_threshold,
            cooldown: Duration::from_secs_f64(self.breaker_cooldown_s),
            max_cooldown: Duration::from_secs_f64(
                self.breaker_max_cooldown_s.max(self.breaker_cooldown_s),
            ),
        }
    }

    /// A config with every default (for embedding and tests).
    pub fn defaults() -> Self {
        Self::parse_from(["infera-gateway"])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    #[test]
    fn flags_override_env_which_overrides_defaults() {
        let cfg = GatewayConfig::try_parse_from([
            "g",
            "--etcd-endpoint",
            "http://a:1,http://b:2",
            "--etcd-endpoint",
            "http://c:3",
        ])
        .unwrap();
        assert_eq!(
            cfg.etcd_endpoints,
            vec!["http://a:1", "http://b:2", "http://c:3"]
        );
        assert_eq!(cfg.port, 8000);
        assert_eq!(cfg.max_body_bytes, 8 * 1024 * 1024);
    }

    #[test]
    fn inconsistent_flags_are_refused_with_a_reason() {
        let cfg = GatewayConfig::try_parse_from(["g", "--router-mode", "direct"]).unwrap();
        assert!(cfg.validate().is_ok());
        let cfg = GatewayConfig::try_parse_from(["g", "--kv-prefill-overlap-weight=-1"]).unwrap();
        assert!(
            cfg.validate()
                .unwrap_err()
                .to_string()
                .contains("--kv-prefill-overlap-weight")
        );
        let cfg = GatewayConfig::try_parse_from(["g", "--nats-req-idle-timeout=-1"]).unwrap();
        assert!(
            cfg.validate()
                .unwrap_err()
                .to_string()
                .contains("--nats-req-idle-timeout")
        );
        let cfg = GatewayConfig::try_parse_from(["g", "--discovery-backend", "static"]).unwrap();
        assert!(
            cfg.validate()
                .unwrap_err()
                .to_string()
                .contains("--static-workers")
        );
        let cfg =
            GatewayConfig::try_parse_from(["g", "--discovery-backend", "kubernetes"]).unwrap();
        assert!(
            cfg.validate()
                .unwrap_err()
                .to_string()
                .contains("--k8s-label-selector")
        );
        let cfg = GatewayConfig::try_parse_from([
            "g",
            "--discovery-backend",
            "kubernetes",
            "--k8s-label-selector",
            "infera.amd.com/deployment=fixture",
        ])
        .unwrap();
        assert!(cfg.validate().is_ok());
        let cfg = GatewayConfig::try_parse_from(["g", "--request-timeout-s", "0"]).unwrap();
        assert!(
            cfg.validate()
                .unwrap_err()
                .to_string()
                .contains("--request-timeout-s")
        );
        assert!(GatewayConfig::defaults().validate().is_ok());
    }

    #[test]
    fn every_earlier_flag_is_accepted() {
        // The earlier server's 29 flags (infera/server/args.py), each with a value it took.
        let cfg = GatewayConfig::try_parse_from([
            "g",
            "--host=0.0.0.0",
            "--port=8000",
            "--discovery-backend=etcd",
            "--etcd-endpoint=127.0.0.1:2379",
            "--etcd-prefix=/infera/workers/",
            "--k8s-label-selector=infera.amd.com/deployment=fixture",
            "--k8s-namespace=fixture",
            "--request-transport=http",
            "--router-backend=rust",
            "--router-mode=auto",
            "--router-policy=kv-aware",
            "--kv-event-transport=zmq",
            "--nats-server=nats://127.0.0.1:4222",
            "--nats-req-idle-timeout=900",
            "--nats-req-max-duration=0",
            "--nats-req-max-pending=0",
            "--router-tokenizer-path=/models/fixture",
            "--kv-overlap-weight=1.0",
            "--kv-prefill-overlap-weight=20.0",
            "--kv-decode-overlap-weight=2.0",
            "--kvd-socket-path=/run/kvd.sock",
            "--enable-profiling",
            "--enable-scaling-api",
            "--request-max-retries=1",
            "--migration-limit=0",
            "--breaker-failure-threshold=0",
            "--breaker-cooldown-s=5",
            "--breaker-max-cooldown-s=60",
        ])
        .unwrap();
        assert!(cfg.validate().is_ok(), "{:?}", cfg.validate());
        assert!(cfg.enable_profiling && cfg.enable_scaling_api);
        assert_eq!(cfg.router_backend, Some(RouterBackend::Rust));
        assert_eq!(cfg.breaker().threshold, 0, "0 turns breakers off");
        let notices = compute_earlier_flag_notices(&cfg);
        assert_eq!(notices.len(), 1);
        assert!(
            notices[0].starts_with("--router-backend rust: "),
            "{notices:?}"
        );
        assert!(compute_earlier_flag_notices(&GatewayConfig::defaults()).is_empty());
        // The earlier defaults hold for a command line that gives neither.
        let d = GatewayConfig::defaults();
        assert_eq!((d.kv_overlap_weight, d.migration_limit), (1.0, 0));
        assert!(!d.enable_profiling && !d.enable_scaling_api);
    }

    #[test]
    fn earlier_switches_read_their_environment_as_the_earlier_server_did() {
        for (value, on) in [
            ("1", true),
            ("true", true),
            ("YES", true),
            ("0", false),
            ("on", false),
            ("", false),
        ] {
            assert_eq!(earlier_switch(value), Ok(on), "{value:?}");
        }
        let matches = GatewayConfig::command()
            .try_get_matches_from(["g", "--enable-profiling"])
            .unwrap();
        let cfg = GatewayConfig::from_arg_matches(&matches).unwrap();
        assert!(cfg.enable_profiling, "the flag alone turns it on");
    }

    fn differences(args: &[&str], env: &[(&str, &str)]) -> Vec<&'static str> {
        let matches = GatewayConfig::command().get_matches_from(args);
        let cfg = GatewayConfig::from_arg_matches(&matches).unwrap();
        let defaulted = |id: &str| {
            matches!(
                matches.value_source(id),
                None | Some(clap::parser::ValueSource::DefaultValue)
            )
        };
        let env = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        };
        compute_earlier_default_differences(&cfg, defaulted, env)
            .into_iter()
            .map(|d| d.setting)
            .collect()
    }

    #[test]
    fn defaults_that_differ_from_the_earlier_server_are_listed_when_they_matter() {
        assert_eq!(
            differences(&["g"], &[]),
            [
                "--router-policy",
                "--discovery-backend",
                "--request-transport",
                "--request-timeout-s",
                "--stream-idle-timeout-s",
                "--connect-timeout-s",
                "--health-check-interval-s",
                "--max-concurrent-requests"
            ]
        );
        let kv = differences(&["g", "--router-policy", "kv-aware"], &[]);
        assert_eq!(
            kv,
            [
                "--discovery-backend",
                "--kv-event-transport",
                "--request-transport",
                "--kv-prefill-overlap-weight",
                "--kv-decode-overlap-weight",
                "--request-timeout-s",
                "--stream-idle-timeout-s",
                "--connect-timeout-s",
                "--health-check-interval-s",
                "--max-concurrent-requests"
            ],
            "a flag given is a choice made"
        );
        let chosen = differences(
            &[
                "g",
                "--router-policy=kv-aware",
                "--discovery-backend=etcd",
                "--kv-event-transport=zmq",
                "--request-transport=http",
                "--kv-prefill-overlap-weight=1",
                "--kv-decode-overlap-weight=1",
                "--request-timeout-s=600",
                "--stream-idle-timeout-s=600",
                "--connect-timeout-s=3",
                "--health-check-interval-s=5",
                "--max-concurrent-requests=1024",
            ],
            &[("INFERA_ROUTER_DEFAULT_RETENTION", "none")],
        );
        assert_eq!(chosen, ["INFERA_ROUTER_DEFAULT_RETENTION"]);
        let notice = build_earlier_default_notice(&[EarlierDifference {
            setting: "--router-policy",
            here: "round-robin".into(),
            earlier: "kv-aware",
        }]);
        assert!(
            notice.ends_with("--router-policy round-robin (earlier: kv-aware)"),
            "{notice}"
        );
    }
}
