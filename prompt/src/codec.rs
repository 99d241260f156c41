//! Loading a model's tokenizer and chat template, and encoding prompts with them.
//!
//! Chat requests: render the template with `add_generation_prompt=true` and encode the
//! text without adding special tokens (the template already holds them). Completion
//! prompts: encode adding the tokenizer's special tokens (e.g. BOS), as vLLM and SGLang
//! do. Without a tokenizer the built-in byte codec is used: UTF-8 bytes are the token
//! ids and chat messages are rendered in the ChatML layout, so a local run without model
//! files still behaves like an engine (prefixes share blocks, counts are stable).

use crate::template::{CHAT_TEMPLATE, build_environment};
use minijinja::value::Value;
use serde::Serialize;
use serde_json::{Map, Value as Json};
use std::path::{Path, PathBuf};
use thiserror::Error;
use tokenizers::Tokenizer;

/// The ChatML layout the byte codec renders chat requests in.
pub const BYTES_CHAT_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n\
{% if message.content is string %}{{ message.content }}{% else %}{% for part in message.content %}{{ part.text }}{% endfor %}{% endif %}<|im_end|>\n\
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// What a chat template sees: the tokenizer's special-token names and the request's
/// `chat_template_kwargs` (which win over them), then the request's messages and tools.
#[derive(Serialize)]
struct TemplateContext<'a> {
    #[serde(flatten)]
    names: &'a Map<String, Json>,
    messages: &'a Json,
    tools: &'a Json,
    add_generation_prompt: bool,
}

/// Why a prompt could not be loaded, rendered or encoded.
#[derive(Debug, Error)]
pub enum PromptError {
    /// The tokenizer file could not be read or parsed.
    #[error("loading tokenizer {path}: {message}")]
    LoadTokenizer {
        /// File that failed.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// `tokenizer_config.json` could not be read or parsed.
    #[error("loading {path}: {message}")]
    LoadConfig {
        /// File that failed.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The chat template does not compile.
    #[error("compiling the chat template: {0}")]
    CompileTemplate(String),
    /// The model has no chat template, so chat requests cannot be served.
    #[error("the model's tokenizer_config.json has no chat_template")]
    NoChatTemplate,
    /// Rendering failed (including the template's own `raise_exception`).
    #[error("rendering the chat template: {0}")]
    RenderTemplate(String),
    /// Tokenization failed.
    #[error("tokenizing: {0}")]
    Encode(String),
}

#[derive(Debug)]
enum Vocabulary {
    HuggingFace(Box<Tokenizer>),
    Bytes,
}

/// A model's prompt codec: chat template plus tokenizer.
#[derive(Debug)]
pub struct PromptCodec {
    vocabulary: Vocabulary,
    env: Option<minijinja::Environment<'static>>,
    special_tokens: Map<String, Json>,
    source: String,
}

impl PromptCodec {
    /// The built-in byte codec (no model files needed).
    pub fn bytes() -> Self {
        Self {
            vocabulary: Vocabulary::Bytes,
            env: build_environment(BYTES_CHAT_TEMPLATE).ok(),
            special_tokens: Map::new(),
            source: "builtin:bytes".into(),
        }
    }

    /// Loads `tokenizer.json` and `tokenizer_config.json` (chat template and special
    /// tokens) from a directory, or just a `tokenizer.json` file (no chat template).
    pub fn load(path: &Path) -> Result<Self, PromptError> {
        let (tokenizer_file, config_file) = if path.is_dir() {
            (
                path.join("tokenizer.json"),
                Some(path.join("tokenizer_config.json")),
            )
        } else {
            (path.to_owned(), None)
        };
        let tokenizer = std::fs::read(&tokenizer_file).map_err(|e| PromptError::LoadTokenizer {
            path: tokenizer_file.clone(),
            message: e.to_string(),
        })?;
        let config = match config_file.filter(|f| f.exists()) {
            Some(f) => Some((
                std::fs::read(&f).map_err(|e| PromptError::LoadConfig {
                    path: f.clone(),
                    message: e.to_string(),
                })?,
                f,
            )),
            None => None,
        };
        Self::from_files(
            (&tokenizer, &tokenizer_file),
            config.as_ref().map(|(b, f)| (b.as_slice(), f.as_path())),
            path.display().to_string(),
        )
    }

    /// A codec from the contents of `tokenizer.json` and, if any, `tokenizer_config.json`
    /// (each with the name errors give it), known as `source`.
    pub fn from_files(
        (tokenizer, tokenizer_name): (&[u8], &Path),
        config: Option<(&[u8], &Path)>,
        source: String,
    ) -> Result<Self, PromptError> {
        let tokenizer =
            Tokenizer::from_bytes(tokenizer).map_err(|e| PromptError::LoadTokenizer {
                path: tokenizer_name.to_owned(),
                message: e.to_string(),
            })?;
        let mut special_tokens = Map::new();
        let mut env = None;
        if let Some((bytes, name)) = config {
            let config = parse_config(bytes, name)?;
            for name in ["bos_token", "eos_token", "unk_token", "pad_token"] {
                if let Some(token) = config.get(name).and_then(token_content) {
                    special_tokens.insert(name.to_owned(), Json::String(token));
                }
            }
            if let Some(template) = chat_template(&config) {
                env = Some(
                    build_environment(&template)
                        .map_err(|e| PromptError::CompileTemplate(e.to_string()))?,
                );
            }
        }
        Ok(Self {
            vocabulary: Vocabulary::HuggingFace(Box::new(tokenizer)),
            env,
            special_tokens,
            source,
        })
    }

    /// Where the codec came from (a path, or `builtin:bytes`).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether chat requests can be rendered.
    pub fn has_chat_template(&self) -> bool {
        self.env.is_some()
    }

    /// Renders chat `messages` (and `tools`) as `apply_chat_template(...,
    /// tokenize=False)` does; `extra` holds `chat_template_kwargs`.
    pub fn render_chat(
        &self,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String, PromptError> {
        let env = self.env.as_ref().ok_or(PromptError::NoChatTemplate)?;
        let template = env
            .get_template(CHAT_TEMPLATE)
            .map_err(|e| PromptError::RenderTemplate(e.to_string()))?;
        let mut names: Map<String, Json> = self.special_tokens.clone();
        for (k, v) in extra {
            names.insert(k.clone(), v.clone());
        }
        // Borrowed: the request's messages are copied once, into the template's values.
        let ctx = TemplateContext {
            names: &names,
            messages,
            tools: tools.unwrap_or(&Json::Null),
            add_generation_prompt,
        };
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| PromptError::RenderTemplate(render_error_text(&e)))
    }

    /// Encodes text, adding the tokenizer's special tokens when asked.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, PromptError> {
        match &self.vocabulary {
            Vocabulary::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Vocabulary::HuggingFace(tok) => tok
                .encode(text, add_special_tokens)
                .map(|enc| enc.get_ids().to_vec())
                .map_err(|e| PromptError::Encode(e.to_string())),
        }
    }

    /// Decodes ids to text, skipping special tokens.
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.vocabulary {
            Vocabulary::Bytes => {
                let bytes: Vec<u8> = ids.iter().filter_map(|i| u8::try_from(*i).ok()).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Vocabulary::HuggingFace(tok) => tok.decode(ids, true).unwrap_or_default(),
        }
    }

    /// The tokens of a chat request body (`messages`, `tools`, `chat_template_kwargs`).
    pub fn encode_chat(&self, body: &Map<String, Json>) -> Result<Vec<u32>, PromptError> {
        let no_messages = Json::Array(Vec::new());
        let messages = body.get("messages").unwrap_or(&no_messages);
        let no_extra = Map::new();
        let extra = body
            .get("chat_template_kwargs")
            .and_then(Json::as_object)
            .unwrap_or(&no_extra);
        let continue_final = body
            .get("continue_final_message")
            .and_then(Json::as_bool)
            .unwrap_or(false);
        let add_generation_prompt = !continue_final
            && body
                .get("add_generation_prompt")
                .and_then(Json::as_bool)
                .unwrap_or(true);
        let mut text =
            self.render_chat(messages, body.get("tools"), add_generation_prompt, extra)?;
        if continue_final {
            // The final message stays open: the text ends where its content does.
            let last = messages
                .as_array()
                .and_then(|m| m.last())
                .and_then(|m| m.get("content"))
                .and_then(Json::as_str)
                .filter(|c| !c.is_empty());
            if let Some(end) = last.and_then(|c| text.rfind(c).map(|at| at + c.len())) {
                text.truncate(end);
            }
        }
        self.encode(&text, false)
    }

    /// The tokens of a completion prompt, special tokens added as engines do.
    pub fn encode_completion(&self, prompt: &str) -> Result<Vec<u32>, PromptError> {
        self.encode(prompt, true)
    }
}

fn parse_config(bytes: &[u8], path: &Path) -> Result<Map<String, Json>, PromptError> {
    let err = |message: String| PromptError::LoadConfig {
        path: path.to_owned(),
        message,
    };
    match serde_json::from_slice(bytes).map_err(|e| err(e.to_string()))? {
        Json::Object(map) => Ok(map),
        _ => Err(err("not a JSON object".into())),
    }
}

/// A special token is a string or an AddedToken object with `content`.
fn token_content(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_owned),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{name, template}` (the `default` one wins).
fn chat_template(config: &Map<String, Json>) -> Option<String> {
    match config.get("chat_template")? {
        Json::String(s) => Some(s.clone()),
        Json::Array(list) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some(name))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_owned))
            };
            named("default").or_else(|| {
                list.first()
                    .and_then(|t| t.get("template")?.as_str().map(str::to_owned))
            })
        }
        _ => None,
    }
}

fn render_error_text(e: &minijinja::Error) -> String {
    match e.detail() {
        Some(detail) => detail.to_owned(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn byte_codec_renders_chatml_and_shares_prefixes() {
        let codec = PromptCodec::bytes();
        let a = json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]});
        let b = json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "bye"}]});
        let ta = codec.encode_chat(a.as_object().unwrap()).unwrap();
        let tb = codec.encode_chat(b.as_object().unwrap()).unwrap();
        let text = codec.decode(&ta);
        assert_eq!(
            text,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let common = ta.iter().zip(&tb).take_while(|(x, y)| x == y).count();
        assert!(common >= "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n".len());
        assert_eq!(codec.encode_completion("abc").unwrap(), vec![97, 98, 99]);
    }

    #[test]
    fn content_parts_render_as_text() {
        let codec = PromptCodec::bytes();
        let body = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]});
        let text = codec.decode(&codec.encode_chat(body.as_object().unwrap()).unwrap());
        assert!(text.contains("user\nab<|im_end|>"), "{text}");
    }

    #[test]
    fn missing_files_name_the_path() {
        let err = PromptCodec::load(Path::new("/nonexistent/fixture-tokenizer")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/fixture-tokenizer"),
            "{err}"
        );
    }
}
