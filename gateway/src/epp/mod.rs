//! The endpoint picker of the Gateway API Inference Extension (GAIE): a second front of
//! the gateway's routing core, for a Gateway (Envoy and the gateways built on it) that
//! sends each request to an InferencePool and asks its picker, over Envoy's ext_proc
//! gRPC protocol, which endpoint takes it. The same discovery, policy, kv state,
//! tokenizer, breakers and health checks as the HTTP API choose; the exchange
//! ([`exchange`]) and its replies ([`reply`]) are pure, the pick ([`pick`]) reads the
//! shared state, and [`serve`] runs the gRPC servers.

pub(crate) mod exchange;
pub(crate) mod pick;
pub(crate) mod reply;
pub(crate) mod serve;
