//! The tokenizer identity a record carries (`kv.tokenizer_digest`, `kv.tokenizer_canary`),
//! so a router can refuse a worker that tokenizes differently from its peers instead of
//! silently missing every cached prefix.

use crate::engine_args::flag_value;
use infera_prompt::PromptCodec;
use infera_proto::tokenizer::{
    TOKENIZER_CANARY, compute_directory_digest, compute_file_digest, is_tiktoken_file,
    is_tokenizer_file,
};
use std::path::{Path, PathBuf};

/// A tokenizer's identity.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizerIdentity {
    /// Where it was read.
    pub path: PathBuf,
    /// First 16 hex characters of the digest rule's sha256.
    pub digest: String,
    /// Token ids of the canary string, without special tokens (empty for a tiktoken
    /// vocabulary, which is not read here).
    pub canary: Vec<u32>,
    /// The folder holds a tiktoken vocabulary and no `tokenizer.json`: the record
    /// reports it (`tokenizer_format: tiktoken`) instead of a canary, and gateways route
    /// the model's prompts as bytes.
    pub tiktoken_only: bool,
}

/// The engine's tokenizer: `--tokenizer`, else the model path when it is a local folder
/// holding `tokenizer.json` (or, for a model that ships only a tiktoken vocabulary,
/// `tiktoken.model` or `*.tiktoken`).
pub fn tokenizer_location(args: &[String]) -> Option<PathBuf> {
    let explicit = flag_value(args, &["--tokenizer", "--tokenizer-path"]).map(PathBuf::from);
    let model = flag_value(args, &["--model", "--model-path"])
        .map(str::to_owned)
        .or_else(|| args.first().filter(|a| !a.starts_with('-')).cloned())
        .map(PathBuf::from);
    explicit
        .or(model)
        .filter(|p| p.is_file() || p.join("tokenizer.json").is_file() || has_tiktoken(p))
}

/// Whether the folder `dir` holds a tiktoken vocabulary.
fn has_tiktoken(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| is_tiktoken_file(&e.file_name().to_string_lossy()) && e.path().is_file())
    })
}

/// Computes the identity of the tokenizer at `path` (a folder or a `tokenizer.json`).
pub fn read_identity(path: &Path) -> Result<TokenizerIdentity, String> {
    let tiktoken_only =
        path.is_dir() && !path.join("tokenizer.json").is_file() && has_tiktoken(path);
    let canary = if tiktoken_only {
        Vec::new()
    } else {
        PromptCodec::load(path)
            .map_err(|e| e.to_string())?
            .encode(TOKENIZER_CANARY, false)
            .map_err(|e| e.to_string())?
    };
    let digest = if path.is_file() {
        compute_file_digest(&std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?)
    } else {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_tokenizer_file(&name) && entry.path().is_file() {
                files.push((
                    name,
                    std::fs::read(entry.path()).map_err(|e| e.to_string())?,
                ));
            }
        }
        compute_directory_digest(files.iter().map(|(n, b)| (n.as_str(), b.as_slice())))
    };
    Ok(TokenizerIdentity {
        path: path.to_owned(),
        digest,
        canary,
        tiktoken_only,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_tokenizer_only_on_local_paths() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
        let d = dir.path().to_str().unwrap().to_owned();
        assert_eq!(
            tokenizer_location(std::slice::from_ref(&d)),
            Some(dir.path().to_owned())
        );
        assert_eq!(
            tokenizer_location(&["--model-path".into(), d.clone()]),
            Some(dir.path().to_owned())
        );
        assert_eq!(
            tokenizer_location(&["Qwen/Qwen3-8B".into()]),
            None,
            "a hub id is not read"
        );
    }

    #[test]
    fn a_tiktoken_vocabulary_is_found_and_reported_without_a_canary() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../prompt/testdata/layouts/tiktoken");
        let d = dir.to_str().unwrap().to_owned();
        assert_eq!(
            tokenizer_location(&["--model".into(), d]),
            Some(dir.clone())
        );
        let identity = read_identity(&dir).unwrap();
        assert!(identity.tiktoken_only);
        assert!(identity.canary.is_empty());
        assert_eq!(identity.digest.len(), 16, "tiktoken.model is digested");
        let jinja = read_identity(&dir.join("../jinja")).unwrap();
        assert!(!jinja.tiktoken_only && !jinja.canary.is_empty());
    }
}
