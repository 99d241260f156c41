//! The corpus of worker records the earlier launchers wrote (`proto/testdata/
//! legacy_records/`, made by its `make_corpus.py` from the earlier code), for the tests
//! of every reader here.

use serde_json::{Map, Value};
use std::path::PathBuf;

/// A file of the corpus folder (`corpus.json`, `reader_probes.json`,
/// `server_views.json`), parsed.
pub fn load(name: &str) -> Result<Value, String> {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "proto",
        "testdata",
        "legacy_records",
        name,
    ]
    .iter()
    .collect();
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every entry of `corpus.json`.
pub fn corpus() -> Result<Vec<Map<String, Value>>, String> {
    let corpus = load("corpus.json")?;
    corpus
        .as_array()
        .ok_or("corpus.json is not a list")?
        .iter()
        .map(|e| {
            e.as_object()
                .cloned()
                .ok_or_else(|| format!("corpus entry {e} is not an object"))
        })
        .collect()
}

/// The corpus entry named `name`.
pub fn entry(name: &str) -> Result<Map<String, Value>, String> {
    corpus()?
        .into_iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
        .ok_or_else(|| format!("no corpus entry {name}"))
}
