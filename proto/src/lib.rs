//! The contracts Infera shares with the earlier Python Infera, kept byte for byte.
//!
//! Every part of Infera (gateway, engine sidecar, operator, simulator) speaks these
//! formats, and so did the earlier system: a gateway of ours routes to workers its
//! launchers registered, and its router reads our records. Each contract lives here
//! once, as pure data types and functions with no I/O, pinned by tests on exact bytes
//! or exact JSON (see `testdata/`).
//!
//! - [`worker`]: the worker record stored in etcd or a Pod annotation.
//! - [`discovery`]: etcd key layout, lease timings, Pod annotation and labels.
//! - [`tokenizer`]: the tokenizer canary string and the tokenizer digest rule.
//! - [`block_hash`]: the router's own XXH3 chain over prompt token blocks.
//! - [`kv_events`]: decoding engine KV-event batches in every layout engines emit.
//! - [`kv_tiers`]: where a block's KV lives beyond the device and what loading it costs.
//! - [`kv_stream`]: ZMQ framing and the NATS JetStream subjects events are relayed on.
//! - [`retention`]: retention classes, client cache hints and per-engine forwarding.
//! - [`pd`]: prefill/decode connector protocol names and their leg order.
//! - [`request_plane`]: the NATS request plane: envelope, reply frames, cancels, admission.
//! - [`error_class`]: the gateway's closed set of errors and their OpenAI/Anthropic JSON.
//! - [`sidecar`]: the drain header and variable the operator renders for the sidecar.

pub mod block_hash;
pub mod discovery;
pub mod error_class;
pub mod kv_events;
pub mod kv_stream;
pub mod kv_tiers;
pub mod pd;
pub mod prom_text;
pub mod request_plane;
pub mod retention;
pub mod sidecar;
pub mod tokenizer;
pub mod worker;
