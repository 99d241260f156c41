//! Who can serve: the registry of live workers (read without locks on the hot path), the
//! discovery backends that feed it (etcd, Pod annotations, a static file), the circuit
//! breakers and active health checks that take a failing worker out, and the requests in
//! flight per worker.

pub(crate) mod breaker;
pub(crate) mod discovery;
pub(crate) mod health;
pub(crate) mod inflight;
pub(crate) mod registry;
