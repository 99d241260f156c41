//! Who can serve: the registry of live workers (read without locks on the hot path), the
//! discovery backends that feed it (etcd, Pod annotations, a static file), the circuit
//! breakers and active health checks that take a failing worker out, the requests in
//! flight per worker, and the KV-event ingest that tells the router what each holds.

pub(crate) mod breaker;
pub(crate) mod discovery;
pub(crate) mod health;
pub(crate) mod inflight;
pub(crate) mod kv_events;
pub(crate) mod registry;
