//! Flow control (`--flow-control`): between a request's plan and its send, the gate
//! holds it until a worker can start it soon, by class and deadline, bounded in
//! requests and body bytes, and answers 429 or 503 with `Retry-After` before any
//! worker spends time on a request that cannot meet its deadline.
//!
//! - `class`: what a request's headers ask for (pure);
//! - `queue`: the bounded wait queue (pure);
//! - `room`: whether a worker can start a request soon (pure);
//! - `gate`: the async gate over them, and the body budget;
//! - `engine_load`: reading each engine's own queue, so replicas agree;
//! - `config`: the `--flow-*` flags.

pub(crate) mod class;
pub mod config;
pub(crate) mod engine_load;
pub(crate) mod gate;
pub(crate) mod queue;
pub(crate) mod room;
