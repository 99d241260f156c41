//! Loading a model's tokenizer and chat template, and encoding prompts with them.
//!
//! Chat requests: render the template with `add_generation_prompt=true` and encode the
//! text without adding special tokens (the template already holds them). Completion
//! prompts: encode adding the tokenizer's special tokens (e.g. BOS), as vLLM and SGLang
//! do. Without a tokenizer the built-in byte codec is used: UTF-8 bytes are the token
//! ids and chat messages are rendered in the ChatML layout, so a local run without model
//! files still behaves like an engine (prefixes share blocks, counts are stable).

use crate::template::{CHAT_TEMPLATE, build_environment, build_named_environment};
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

/// The files of a model folder a codec reads: the tokenizer, its config, and the chat
/// templates transformers reads beside them (`chat_template.jinja`,
/// `additional_chat_templates/<name>.jinja`).
pub const TOKENIZER_JSON: &str = "tokenizer.json";
/// The tokenizer's config: special tokens, and the chat template(s) of the older layout.
pub const TOKENIZER_CONFIG_JSON: &str = "tokenizer_config.json";

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
    /// The model's tokenizer is a tiktoken vocabulary with no `tokenizer.json`, which
    /// this crate cannot read (callers fall back to the byte codec and say so).
    #[error(
        "{path} holds a tiktoken vocabulary but no tokenizer.json, which the router reads: \
         its prompts are hashed as UTF-8 bytes, which match no engine's cached blocks"
    )]
    TiktokenOnly {
        /// The model folder.
        path: PathBuf,
    },
    /// `tokenizer_config.json` could not be read or parsed.
    #[error("loading {path}: {message}")]
    LoadConfig {
        /// File that failed.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A chat template file could not be read.
    #[error("loading the chat template {path}: {message}")]
    LoadTemplate {
        /// File that failed.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The chat template does not compile.
    #[error("compiling the chat template: {0}")]
    CompileTemplate(String),
    /// The model has no chat template, so chat requests cannot be served.
    #[error(
        "the model has no chat template (no chat_template.jinja, no chat_template in tokenizer_config.json)"
    )]
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

/// A model's chat templates, compiled, under the names transformers gives them.
#[derive(Debug)]
struct ChatTemplates {
    env: minijinja::Environment<'static>,
    /// The names, in the order a request that names none falls back through.
    names: Vec<String>,
}

impl ChatTemplates {
    fn compile(templates: Vec<(String, String)>) -> Result<Option<Self>, PromptError> {
        if templates.is_empty() {
            return Ok(None);
        }
        let env = build_named_environment(
            templates
                .iter()
                .map(|(name, text)| (name.as_str(), text.as_str())),
        )
        .map_err(|e| PromptError::CompileTemplate(e.to_string()))?;
        Ok(Some(Self {
            env,
            names: templates.into_iter().map(|(name, _)| name).collect(),
        }))
    }
}

/// Which of a model's templates renders a request, as transformers'
/// `get_chat_template` picks: `tool_use` for a request with tools when the model has
/// one, else `default`. A model with neither (a list without a `default`, which
/// transformers refuses) renders with its first, so the router still hashes what the
/// engine will most likely see.
pub fn choose_chat_template(names: &[String], has_tools: bool) -> Option<&str> {
    let named = |wanted: &str| names.iter().find(|n| *n == wanted).map(String::as_str);
    has_tools
        .then(|| named("tool_use"))
        .flatten()
        .or_else(|| named("default"))
        .or_else(|| names.first().map(String::as_str))
}

/// A model's chat templates as transformers reads them from its files: the standalone
/// files when there are any (`chat_template.jinja` is `default`,
/// `additional_chat_templates/<name>.jinja` is `<name>`), which then win over
/// `tokenizer_config.json`; else its `chat_template`, a string (`default`) or a list of
/// `{name, template}`. `files` are (path in the folder, text) of the template files.
pub fn collect_chat_templates(
    config: Option<&Map<String, Json>>,
    files: &[(String, String)],
) -> Vec<(String, String)> {
    let mut from_files: Vec<(String, String)> = files
        .iter()
        .filter_map(|(path, text)| {
            infera_proto::tokenizer::chat_template_name(path)
                .map(|name| (name.to_owned(), text.clone()))
        })
        .collect();
    if !from_files.is_empty() {
        // `default` first, the named ones by name.
        from_files.sort_by(|a, b| (a.0 != "default", &a.0).cmp(&(b.0 != "default", &b.0)));
        return from_files;
    }
    match config.and_then(|c| c.get("chat_template")) {
        Some(Json::String(s)) => vec![("default".into(), s.clone())],
        Some(Json::Array(list)) => list
            .iter()
            .filter_map(|t| {
                Some((
                    t.get("name")?.as_str()?.to_owned(),
                    t.get("template")?.as_str()?.to_owned(),
                ))
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A model's prompt codec: chat template plus tokenizer.
#[derive(Debug)]
pub struct PromptCodec {
    vocabulary: Vocabulary,
    templates: Option<ChatTemplates>,
    special_tokens: Map<String, Json>,
    source: String,
}

impl PromptCodec {
    /// The built-in byte codec (no model files needed).
    pub fn bytes() -> Self {
        Self {
            vocabulary: Vocabulary::Bytes,
            templates: build_environment(BYTES_CHAT_TEMPLATE)
                .ok()
                .map(|env| ChatTemplates {
                    env,
                    names: vec![CHAT_TEMPLATE.into()],
                }),
            special_tokens: Map::new(),
            source: "builtin:bytes".into(),
        }
    }

    /// Loads a model folder (`tokenizer.json`, `tokenizer_config.json` for the special
    /// tokens, and the chat templates as transformers finds them:
    /// [`collect_chat_templates`]), or just a `tokenizer.json` file (no chat template).
    /// A folder with a tiktoken vocabulary and no `tokenizer.json` is
    /// [`PromptError::TiktokenOnly`].
    pub fn load(path: &Path) -> Result<Self, PromptError> {
        if !path.is_dir() {
            let tokenizer = std::fs::read(path).map_err(|e| PromptError::LoadTokenizer {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
            return Self::build(
                &[(TOKENIZER_JSON.to_owned(), tokenizer)],
                path,
                true,
                path.display().to_string(),
            );
        }
        let files = read_model_files(path)?;
        Self::build(&files, path, false, path.display().to_string())
    }

    /// A codec from a model folder's files given as (path in the folder, bytes):
    /// `tokenizer.json`, and if any `tokenizer_config.json` and the chat template files
    /// ([`collect_chat_templates`]); other files are ignored. Known as `source`; errors
    /// name the files by their path in the folder.
    pub fn from_files(files: &[(String, Vec<u8>)], source: String) -> Result<Self, PromptError> {
        Self::build(files, Path::new(""), false, source)
    }

    /// `base`: the folder errors name files in, or the tokenizer file itself (`single`).
    fn build(
        files: &[(String, Vec<u8>)],
        base: &Path,
        single: bool,
        source: String,
    ) -> Result<Self, PromptError> {
        let path_of = |name: &str| {
            if single {
                base.to_owned()
            } else {
                base.join(name)
            }
        };
        let file = |name: &str| files.iter().find(|(n, _)| n == name).map(|(_, b)| b);
        let Some(tokenizer_bytes) = file(TOKENIZER_JSON) else {
            if files
                .iter()
                .any(|(n, _)| infera_proto::tokenizer::is_tiktoken_file(n))
            {
                return Err(PromptError::TiktokenOnly {
                    path: base.to_owned(),
                });
            }
            return Err(PromptError::LoadTokenizer {
                path: path_of(TOKENIZER_JSON),
                message: "no such file".into(),
            });
        };
        let tokenizer =
            Tokenizer::from_bytes(tokenizer_bytes).map_err(|e| PromptError::LoadTokenizer {
                path: path_of(TOKENIZER_JSON),
                message: e.to_string(),
            })?;
        let config = file(TOKENIZER_CONFIG_JSON)
            .map(|bytes| parse_config(bytes, &path_of(TOKENIZER_CONFIG_JSON)))
            .transpose()?;
        let mut special_tokens = Map::new();
        if let Some(config) = &config {
            for name in ["bos_token", "eos_token", "unk_token", "pad_token"] {
                if let Some(token) = config.get(name).and_then(token_content) {
                    special_tokens.insert(name.to_owned(), Json::String(token));
                }
            }
        }
        let mut template_files = Vec::new();
        for (name, bytes) in files {
            if infera_proto::tokenizer::chat_template_name(name).is_some() {
                let text =
                    String::from_utf8(bytes.clone()).map_err(|e| PromptError::LoadTemplate {
                        path: path_of(name),
                        message: e.to_string(),
                    })?;
                template_files.push((name.clone(), text));
            }
        }
        let templates =
            ChatTemplates::compile(collect_chat_templates(config.as_ref(), &template_files))?;
        Ok(Self {
            vocabulary: Vocabulary::HuggingFace(Box::new(tokenizer)),
            templates,
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
        self.templates.is_some()
    }

    /// The names of the model's chat templates (`default`, `tool_use`, ...).
    pub fn chat_template_names(&self) -> &[String] {
        self.templates.as_ref().map_or(&[], |t| t.names.as_slice())
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
        let templates = self.templates.as_ref().ok_or(PromptError::NoChatTemplate)?;
        let has_tools = tools.is_some_and(|t| !t.is_null());
        let name =
            choose_chat_template(&templates.names, has_tools).ok_or(PromptError::NoChatTemplate)?;
        let template = templates
            .env
            .get_template(name)
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

/// The files of the model folder `dir` a codec reads: `tokenizer.json`,
/// `tokenizer_config.json`, the chat templates, and the names of any tiktoken
/// vocabulary (empty bytes: only their presence matters).
fn read_model_files(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, PromptError> {
    let mut names: Vec<String> = [
        TOKENIZER_JSON,
        TOKENIZER_CONFIG_JSON,
        infera_proto::tokenizer::CHAT_TEMPLATE_FILE,
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    let listed = |folder: &Path| -> Vec<String> {
        std::fs::read_dir(folder)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.path().is_file())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let templates_dir = dir.join(infera_proto::tokenizer::CHAT_TEMPLATE_DIR);
    let mut named: Vec<String> = listed(&templates_dir)
        .into_iter()
        .map(|n| format!("{}/{n}", infera_proto::tokenizer::CHAT_TEMPLATE_DIR))
        .filter(|p| infera_proto::tokenizer::chat_template_name(p).is_some())
        .collect();
    named.sort();
    names.extend(named);
    let mut files = Vec::new();
    for name in names {
        let path = dir.join(&name);
        if !path.is_file() {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|e| {
            let message = e.to_string();
            match name.as_str() {
                TOKENIZER_JSON => PromptError::LoadTokenizer { path, message },
                TOKENIZER_CONFIG_JSON => PromptError::LoadConfig { path, message },
                _ => PromptError::LoadTemplate { path, message },
            }
        })?;
        files.push((name, bytes));
    }
    files.extend(
        listed(dir)
            .into_iter()
            .filter(|n| infera_proto::tokenizer::is_tiktoken_file(n))
            .map(|n| (n, Vec::new())),
    );
    Ok(files)
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
