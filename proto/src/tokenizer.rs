//! Tokenizer identity checks that keep a tokenizer mismatch loud.
//!
//! A router that tokenizes differently from the engine never matches a block: a silent
//! 0% hit rate. Workers therefore publish the token ids of a fixed canary string and a
//! digest of their tokenizer files; the first worker of a model sets the reference and a
//! later worker that differs is rejected (logged and counted).

use sha2::{Digest, Sha256};

/// The canary string, encoded with `add_special_tokens=false`.
pub const TOKENIZER_CANARY: &str =
    "Hello, world!\n你好，世界！<|im_start|>system\n<|endoftext|><|im_end|>🦄";

/// Whether a file in a tokenizer directory takes part in the digest.
/// Names are matched lower-cased.
pub fn is_tokenizer_file(name: &str) -> bool {
    let name = name.to_lowercase();
    const EXACT: [&str; 12] = [
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "tiktoken.model",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "special_tokens_map.json",
        "added_tokens.json",
        "spiece.model",
        "sentencepiece.bpe.model",
        "tokenizer.py",
    ];
    EXACT.contains(&name.as_str())
        || name.ends_with(".tiktoken")
        || (name.starts_with("tokeniz") && name.ends_with(".py"))
}

/// transformers' standalone chat template, beside the tokenizer files (what
/// `save_pretrained` writes from transformers 4.50 on; it wins over a `chat_template` in
/// `tokenizer_config.json`). The template transformers calls `default`.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// The folder of named chat templates beside [`CHAT_TEMPLATE_FILE`]: `<name>.jinja` is
/// the template transformers calls `<name>` (e.g. `tool_use`, chosen for requests with
/// tools).
pub const CHAT_TEMPLATE_DIR: &str = "additional_chat_templates";

/// The template name a chat template file holds, when `path` (relative to the model
/// folder, `/`-separated) is one transformers reads: `default` for
/// [`CHAT_TEMPLATE_FILE`], `<name>` for `CHAT_TEMPLATE_DIR/<name>.jinja`. Chat templates
/// are outside the tokenizer digest, as they were outside the earlier compat key.
pub fn chat_template_name(path: &str) -> Option<&str> {
    if path == CHAT_TEMPLATE_FILE {
        return Some("default");
    }
    let name = path
        .strip_prefix(CHAT_TEMPLATE_DIR)?
        .strip_prefix('/')?
        .strip_suffix(".jinja")?;
    let plain = !name.is_empty()
        && !name.starts_with('.')
        && !name.contains(['/', '\\'])
        && name != "default";
    plain.then_some(name)
}

/// Whether a tokenizer file is a tiktoken vocabulary (`tiktoken.model`, `*.tiktoken`),
/// a format the router cannot read: it reads `tokenizer.json`.
pub fn is_tiktoken_file(name: &str) -> bool {
    let name = name.to_lowercase();
    name == "tiktoken.model" || name.ends_with(".tiktoken")
}

/// Digest of a tokenizer that is one file (`tokenizer.json`): the first 16 hex
/// characters of sha256 over its bytes.
pub fn compute_file_digest(bytes: &[u8]) -> String {
    short_hex(Sha256::digest(bytes).as_slice())
}

/// Digest of a tokenizer directory, given every file in it as `(name, bytes)`.
///
/// Files that are not tokenizer files are ignored; the rest, sorted by name, each add
/// `name ‖ 0x00 ‖ bytes ‖ 0x00 0x00` to one sha256.
pub fn compute_directory_digest<'a, I>(files: I) -> String
where
    I: IntoIterator<Item = (&'a str, &'a [u8])>,
{
    compute_named_digest(
        files
            .into_iter()
            .filter(|(name, _)| is_tokenizer_file(name)),
    )
}

/// The directory rule over every file given, none filtered out: the digest a sidecar
/// states for the chat templates it serves (outside the tokenizer digest).
pub fn compute_named_digest<'a, I>(files: I) -> String
where
    I: IntoIterator<Item = (&'a str, &'a [u8])>,
{
    let mut chosen: Vec<(&str, &[u8])> = files.into_iter().collect();
    chosen.sort_by(|a, b| a.0.cmp(b.0));
    let mut hasher = Sha256::new();
    for (name, bytes) in chosen {
        hasher.update(name.as_bytes());
        hasher.update([0u8]);
        hasher.update(bytes);
        hasher.update([0u8, 0u8]);
    }
    short_hex(hasher.finalize().as_slice())
}

fn short_hex(digest: &[u8]) -> String {
    let mut hex = hex::encode(digest);
    hex.truncate(16);
    hex
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Vectors {
        canary_utf8_hex: String,
        file_digest: Case,
        directory_digest: DirCase,
    }
    #[derive(Deserialize)]
    struct Case {
        content: String,
        digest: String,
    }
    #[derive(Deserialize)]
    struct DirCase {
        files: Vec<(String, String)>,
        digest: String,
    }

    fn vectors() -> Vectors {
        serde_json::from_str(include_str!("../testdata/tokenizer_vectors.json")).unwrap()
    }

    #[test]
    fn canary_bytes_are_pinned() {
        assert_eq!(
            hex::encode(TOKENIZER_CANARY.as_bytes()),
            vectors().canary_utf8_hex
        );
    }

    #[test]
    fn file_digest_matches_python_hashlib() {
        let v = vectors().file_digest;
        assert_eq!(compute_file_digest(v.content.as_bytes()), v.digest);
    }

    #[test]
    fn directory_digest_matches_python_hashlib() {
        let v = vectors().directory_digest;
        let files: Vec<(&str, &[u8])> = v
            .files
            .iter()
            .map(|(n, c)| (n.as_str(), c.as_bytes()))
            .collect();
        assert_eq!(compute_directory_digest(files.iter().copied()), v.digest);
        // Order of listing does not matter; non-tokenizer files do not count.
        let mut reversed = files.clone();
        reversed.reverse();
        reversed.push(("model.safetensors", b"weights"));
        assert_eq!(compute_directory_digest(reversed), v.digest);
    }

    #[test]
    fn chat_template_files_are_named_as_transformers_names_them() {
        assert_eq!(chat_template_name("chat_template.jinja"), Some("default"));
        assert_eq!(
            chat_template_name("additional_chat_templates/tool_use.jinja"),
            Some("tool_use")
        );
        for refused in [
            "additional_chat_templates/.jinja",
            "additional_chat_templates/../x.jinja",
            "additional_chat_templates/a/b.jinja",
            "additional_chat_templates/default.jinja",
            "additional_chat_templates/rag.txt",
            "chat_template.json",
            "x/chat_template.jinja",
        ] {
            assert_eq!(chat_template_name(refused), None, "{refused}");
        }
        // Outside the tokenizer digest, as in the earlier compat key.
        assert!(!is_tokenizer_file("chat_template.jinja"));
        assert!(is_tiktoken_file("tiktoken.model") && is_tiktoken_file("o200k.tiktoken"));
        assert!(!is_tiktoken_file("tokenizer.json"));
    }

    #[test]
    fn tokenizer_file_names() {
        for name in [
            "tokenizer.json",
            "Tokenizer_Config.json",
            "cl100k.tiktoken",
            "tokenization_qwen.py",
        ] {
            assert!(is_tokenizer_file(name), "{name}");
        }
        for name in ["config.json", "model.safetensors", "generation_config.json"] {
            assert!(!is_tokenizer_file(name), "{name}");
        }
    }
}
