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
    let mut chosen: Vec<(&str, &[u8])> = files
        .into_iter()
        .filter(|(name, _)| is_tokenizer_file(name))
        .collect();
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
