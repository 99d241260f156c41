//! `infera-gateway`: the process every client request goes to. It serves the OpenAI API
//! (and Anthropic's `/v1/messages`), keeps the live set of workers from discovery, and
//! relays each request to the worker the router picks, failing over before the first
//! byte and isolating failing workers with circuit breakers.
//!
//! Flow: [`api`] bounds ([`json_limits`]) and validates ([`validate`], [`anthropic`]) -> [`router`] picks the pool
//! from a [`registry`] snapshot -> [`dispatch`] chooses with a [`policy`] and sends ->
//! [`relay`] streams the answer back. [`discovery`] feeds the registry; [`metrics`]
//! and [`breaker`] observe.

pub mod anthropic;
pub mod api;
pub mod breaker;
pub mod config;
pub mod discovery;
pub mod dispatch;
pub mod gateway;
pub mod health_check;
pub mod http_serve;
pub mod index_bench;
pub mod json_limits;
pub mod kv_ingest;
pub mod kv_policy;
pub mod kv_router;
pub mod metrics;
pub mod offload;
pub mod pd;
pub mod policy;
pub mod prefix_index;
pub mod registry;
pub mod relay;
pub mod reload;
pub mod router;
pub mod server;
pub mod tls;
pub mod tokenizer_fetch;
pub mod validate;

#[cfg(test)]
mod legacy_records_tests;
