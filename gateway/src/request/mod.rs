//! What a client asked, as the APIs define it (pure, shared by every front): the body's
//! JSON bounded before it is parsed, an OpenAI request checked, an Anthropic request
//! translated to an OpenAI chat request and its answers back.

pub mod anthropic;
pub mod json_limits;
pub mod validate;
