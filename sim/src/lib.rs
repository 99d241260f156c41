//! `infera-sim`: simulated inference engines that routers, the sidecar and benchmarks
//! cannot tell apart from vLLM, SGLang or ATOM at the protocol level, timed by a latency
//! model fitted to measurements of a real H200.
//!
//! - [`profile`]: the fitted latency formulas and their data files.
//! - [`kv_cache`]: the paged, prefix-cached KV pool.
//! - [`core`]: the continuous-batching scheduler with chunked prefill (pure; virtual
//!   clock in tests).

pub mod core;
pub mod kv_cache;
pub mod profile;
