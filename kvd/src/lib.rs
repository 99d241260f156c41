//! `infera-kvd`: the KV-cache daemon engines offload KV blocks to, so a repeated prefix
//! is reloaded instead of recomputed. It speaks the earlier daemon's wire protocol
//! ([`wire`]) over a Unix socket ([`server`]), keeps values in RAM ([`store`]), in
//! slots of a memfd arena shared with engines ([`arena`]) so they read in place, and
//! ships a client ([`client`]).

pub mod arena;
pub mod buf;
pub mod cli;
pub mod client;
pub mod daemon;
pub mod disk;
pub mod fdpass;
pub mod lower;
pub mod metrics;
pub mod queue;
pub mod remote;
pub mod server;
pub mod service;
pub mod store;
pub mod tier;
pub mod wire;
