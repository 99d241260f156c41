//! `infera-gateway`: the process every client request goes to. It serves the OpenAI API
//! (and Anthropic's `/v1/messages`), keeps the live set of workers from discovery, and
//! relays each request to the worker the router picks, failing over before the first
//! byte and isolating failing workers with circuit breakers.
//!
//! Flow of a request: [`api`] bounds the body ([`json_limits`]), validates it
//! ([`validate`], or translates it from Anthropic's shape with [`anthropic`]), and asks
//! [`router`] for a [`router::Plan`] over a [`registry`] snapshot (mixed pool, or
//! prefill and decode pools; direct mode's pins applied). [`routing`] hashes the prompt
//! once and gives each role a selector (kv-aware or round-robin behind one `select`,
//! owning its kv charges). [`forward`] is the one send path for both plans: it picks,
//! sends through [`dispatch`] (mixed, failing over before the first byte) or
//! [`pd::dispatch`] (both legs), and returns the response with the request's guard.
//! [`relay`] streams the answer back (coalescing what arrived together), and [`api`] or
//! [`anthropic`] renders it. [`discovery`] feeds the registry; [`metrics`], [`breaker`]
//! and [`health_check`] observe.

pub mod anthropic;
pub mod api;
pub mod breaker;
pub mod config;
pub mod discovery;
pub mod dispatch;
pub mod forward;
pub mod gateway;
pub mod health_check;
pub mod http_serve;
pub mod index_bench;
pub mod json_limits;
pub mod kv_ingest;
pub mod kv_policy;
pub mod kv_router;
pub mod metrics;
pub mod migration;
pub mod nats_plane;
pub mod offload;
pub mod pd;
pub mod policy;
pub mod prefix_index;
pub mod registry;
pub mod relay;
pub mod reload;
pub mod router;
pub mod routing;
pub mod server;
pub mod tls;
pub mod tokenizer_fetch;
pub mod validate;
pub mod worker_response;

#[cfg(test)]
mod legacy_records_tests;
#[cfg(test)]
mod metrics_pin_tests;
