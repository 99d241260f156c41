//! `infera-engine-sidecar`: runs beside an inference engine. In launch mode it starts
//! the engine (vLLM, SGLang, ATOM or `infera-sim`) with the flags the user gave plus what
//! routing needs, waits until it is healthy, registers its worker record in etcd under a
//! lease kept alive for as long as the engine runs, and on SIGTERM deregisters first,
//! drains in-flight requests, then stops the engine.
//!
//! - [`cli`]: the launcher-style command line; [`engine_args`]: facts read from the
//!   engine's flags; the argv and env the engine is launched with come from
//!   `infera_engine_prep`, which the operator shares.
//! - [`engine`]: the engine process (health, page size, load, stop).
//! - [`record`]: the worker record; [`registration`]: lease, keepalive, re-registration.
//! - [`node_env`]: what the engine needs from its node (GID index, rail address,
//!   peer memory), for a launched engine or, as `infera-engine-sidecar node-env` in an
//!   init container, for the engine container of a pod.
//! - On the status port: [`status`] (`/health`, `/ready`, `/metrics`, `/drain`),
//!   [`tokenizer_files`] (the tokenizer and chat templates a gateway fetches) and
//!   [`prefetch`] (`/kvd/prefetch`, a gateway's prewarm for the kvd beside the engine).

pub mod annotation;
pub mod cli;
pub mod disagg;
pub mod engine;
pub mod engine_args;
pub mod gid;
pub mod kvd_watch;
pub mod node_env;
pub mod prefetch;
pub mod record;
pub mod registration;
pub mod relay;
pub mod request_plane;
pub mod status;
pub mod tokenizer_files;
pub mod tokenizer_id;
