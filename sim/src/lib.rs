//! `infera-sim`: simulated inference engines that routers, the sidecar and benchmarks
//! cannot tell apart from vLLM, SGLang or ATOM at the protocol level, timed by a latency
//! model fitted to measurements of a real H200.
//!
//! - [`profile`]: the fitted latency formulas and their data files.
//! - [`kv_cache`]: the paged, prefix-cached KV pool.
//! - [`core`]: the continuous-batching scheduler with chunked prefill (pure; virtual
//!   clock in tests).
//! - [`engine`]: the task that runs the scheduler in scaled real time.
//! - [`kv_events`]: KV-event batches in each engine's layout, on ZMQ PUB with replay.
//! - [`kvd_connector`]: the KV connector to the kvd beside the engine (lookups, loads,
//!   stores, and the KV events of its tiers).
//! - [`openai`], [`api`], [`metrics`]: the HTTP API.
//! - [`pd`]: prefill/decode roles and the request checks of each connector protocol.
//! - [`faults`]: injected failures for tests.
//! - [`worker`]: one worker assembled; [`cli`]: the command line.

pub mod api;
pub mod cli;
pub mod core;
pub mod engine;
pub mod faults;
pub mod flavor;
pub mod generate;
pub mod handoff;
pub mod kv_cache;
pub mod kv_events;
pub mod kvd_connector;
pub mod metrics;
pub mod openai;
pub mod pd;
pub mod profile;
pub mod state;
pub mod worker;
