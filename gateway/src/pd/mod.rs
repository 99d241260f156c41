//! Prefill/decode disaggregation: the connectors' request shapes (pure) and the
//! dispatch that sends both legs of a request.

pub mod connectors;
pub mod dispatch;
