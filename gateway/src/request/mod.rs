//! What a client asked, as the APIs define it (pure, shared by every front): the body's
//! JSON bounded before it is parsed, an OpenAI request checked, an Anthropic request
//! translated to an OpenAI chat request and its answers back; the control endpoints'
//! requests read as the earlier server read them (`control`, with what its Python said
//! about bad input in `python`).

pub mod anthropic;
pub(crate) mod control;
pub mod json_limits;
pub(crate) mod python;
pub mod validate;
