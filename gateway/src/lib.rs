//! `infera-gateway`: the process every client request goes to. It serves the OpenAI API
//! (and Anthropic's `/v1/messages`), keeps the live set of workers from discovery, and
//! relays each request to the worker the router picks, failing over before the first
//! byte and isolating failing workers with circuit breakers.
//!
//! The folders are the request's path. Each imports only from those listed after it
//! (tests aside), so no file imports one that imports it back (`scripts/check-layout`
//! checks the files):
//!
//! - `http/`: the front. Accepts connections (`listener`, `tls`), applies the layers
//!   (`middleware`: API keys, admission, draining), reads the body within bounds
//!   (`body`), and hands it to one module per API (`openai`, `anthropic`), which share
//!   `pipeline` (plan, forward, relay, the migration resume) and render errors in one
//!   place (`errors`); `admin` serves the gateway's own views, `control` the earlier
//!   server's cache and control endpoints.
//! - `control/`: those endpoints acting (prewarm hints to kvd, the profile fan-out, the
//!   scaling API's Kubernetes calls), with narrow handles; it reads `request/` and
//!   `workers/`.
//! - `send/`: sending: the shared context and the POST every leg makes (`upstream`), the
//!   request's bookkeeping (`guard`), failover (`failover`), both prefill/decode legs
//!   (`pd`), the NATS request plane (`nats`), the forward path over them (`forward`), the
//!   relay back and mid-stream migration (`relay`, `migration`).
//! - `route/`: choosing, pure on the request's path: the plan (mixed or prefill/decode
//!   pools, direct mode's pins), the selector for either policy with its kv charges,
//!   rotation, the kv-aware cost, the kv state with its prefix index and the KV-event
//!   ingest that feeds it, the tokenizer.
//! - `workers/`: who can serve: the registry, discovery, breakers, health checks,
//!   in-flight counts.
//! - `request/`: what a client asked, pure: the JSON bounds, an OpenAI request checked,
//!   an Anthropic request translated.
//!
//! `metrics` and `offload` (heavy work kept off the async workers) serve every stage
//! and import none. Above the stages, `config` (the flags, naming each stage's settings)
//! and `state` (the shared state assembled from them) sit under `http/`; `server` starts
//! and stops it all.

pub mod config;
mod control;
mod epp;
mod flow;
mod http;
mod metrics;
mod offload;
pub mod request;
mod route;
mod send;
pub mod server;
mod state;
mod workers;

#[cfg(feature = "bench")]
pub mod bench;

pub use epp::serve::{EppAddrs, EppError};
pub use http::tls::TlsCertificates;
pub use metrics::parse_picks;
pub use state::Gateway;
pub use workers::registry::{Change, Registry, Snapshot};

#[cfg(test)]
mod earlier_server_tests;
#[cfg(test)]
mod legacy_records_tests;
#[cfg(test)]
mod metrics_pin_tests;
