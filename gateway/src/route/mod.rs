//! Choosing where a request goes, with no I/O on the request's path: the plan (mixed
//! pool, or prefill and decode pools; direct mode's pins), pairing by revision, the selector that picks a
//! worker under either policy and owns its kv charges, round-robin rotation, the
//! kv-aware cost, the kv state with its prefix index and the KV-event ingest that feeds
//! it (background tasks, one per worker), and the tokenizer that turns a prompt into the
//! router's blocks (fetched from the workers' sidecars, or from the Hugging Face Hub for
//! a model id: `hub`). A second front (an endpoint picker) routes through these without
//! the HTTP listener.

pub(crate) mod hub;
pub(crate) mod kv_cost;
pub(crate) mod kv_events;
pub(crate) mod kv_state;
pub(crate) mod plan;
pub(crate) mod prefix_index;
pub(crate) mod revision;
pub(crate) mod rotation;
pub(crate) mod select;
pub(crate) mod tokenizer;
