//! Prefill/decode disaggregation: the connectors' request shapes (pure) and the
//! legs that send both halves of a request.

pub(crate) mod connectors;
pub(crate) mod legs;
