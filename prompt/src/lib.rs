//! Turning a request into the exact token ids the engine will see.
//!
//! KV-aware routing only works when the router tokenizes exactly as the engine does, and
//! the simulated engine must count tokens the way a real one does, so both use this
//! crate: the model's Hugging Face `tokenizer.json` and its Jinja chat templates where
//! `transformers` finds them (`chat_template.jinja`, `additional_chat_templates/`, else
//! `tokenizer_config.json`), rendered as `transformers`' `apply_chat_template` renders
//! them.
//!
//! - [`template`]: the Jinja environment with `transformers`' conventions
//!   (`trim_blocks`, `lstrip_blocks`, loop controls, Python string methods,
//!   `raise_exception`, `strftime_now`, and a `tojson` equal to Python's `json.dumps`
//!   with `ensure_ascii=False`).
//! - [`pyjson`]: that `json.dumps` formatting.
//! - [`codec`]: loading a tokenizer directory and encoding chat and completion prompts;
//!   a built-in byte-level codec for runs without a tokenizer.

pub mod codec;
pub mod pyjson;
pub mod template;

pub use codec::{PromptCodec, PromptError};
