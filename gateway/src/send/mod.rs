//! Sending a planned request and bringing its answer back: the shared context at the
//! bottom ([`upstream`]: client, breakers, timeouts, the POST every leg makes; [`guard`]:
//! the request's bookkeeping), failover before the first byte ([`failover`]), both legs of
//! a prefill/decode pair ([`pd`]), the NATS request plane as a transport ([`nats`]), the
//! forward path over all of them ([`forward`]; the response names who served it,
//! [`served`]), and the relay that streams the answer
//! back and moves a generation mid-stream ([`relay`], [`migration`]).

pub(crate) mod failover;
pub(crate) mod forward;
pub(crate) mod guard;
pub(crate) mod migration;
pub(crate) mod nats;
pub(crate) mod pd;
pub(crate) mod relay;
pub(crate) mod served;
pub(crate) mod upstream;
pub(crate) mod worker_response;
