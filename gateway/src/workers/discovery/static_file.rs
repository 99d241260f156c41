//! Static discovery: worker records from a YAML or JSON file (a list of records, or
//! `{workers: [...]}`), re-read when the file changes. A file that stops parsing keeps
//! the last good set of workers and says why in the log.

use crate::metrics::Metrics;
use crate::workers::discovery::decode_record;
use crate::workers::registry::Registry;
use infera_proto::worker::WorkerRecord;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;

/// Why a static worker file could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StaticFileError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// The file is not a list of worker records.
    #[error("{path}: {message}")]
    Parse {
        /// File.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// Parses the file's text: YAML or JSON, a list of records or `{workers: [...]}`.
pub(crate) fn parse_worker_file(
    path: &Path,
    text: &str,
    metrics: &Metrics,
) -> Result<Vec<WorkerRecord>, StaticFileError> {
    let err = |message: String| StaticFileError::Parse {
        path: path.to_owned(),
        message,
    };
    let value: Value =
        serde_saphyr::from_str(text).map_err(|e| err(format!("not YAML or JSON: {e}")))?;
    let list = match value {
        Value::Array(list) => list,
        Value::Object(mut map) => match map.remove("workers") {
            Some(Value::Array(list)) => list,
            _ => {
                return Err(err(
                    "expected a list of worker records or {workers: [...]}".into()
                ));
            }
        },
        Value::Null => Vec::new(),
        _ => return Err(err("expected a list of worker records".into())),
    };
    Ok(list
        .into_iter()
        .filter_map(|item| {
            let id = item
                .get("worker_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            decode_record(&id, item.to_string().as_bytes(), metrics)
        })
        .collect())
}

/// A file's modification time and size: what the watcher compares.
pub(crate) type FileStamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> FileStamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Loads the file once (an error here stops start-up: nothing to route to). Returns the
/// number of workers and the stamp of the version read (taken before reading, so a
/// change made while reading is seen again).
pub(crate) fn load_worker_file(
    path: &Path,
    registry: &Registry,
    metrics: &Metrics,
) -> Result<(usize, FileStamp), StaticFileError> {
    let before = stamp(path);
    let text = std::fs::read_to_string(path).map_err(|source| StaticFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let records = parse_worker_file(path, &text, metrics)?;
    let n = records.len();
    registry.replace_all(records);
    registry.mark_synced();
    Ok((n, before))
}

/// Re-reads `path` whenever its modification time or size differs from `last`.
pub(crate) async fn watch_worker_file(
    path: PathBuf,
    mut last: FileStamp,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let now = stamp(&path);
        if now == last {
            continue;
        }
        match load_worker_file(&path, &registry, &metrics) {
            Ok((n, read)) => {
                last = read;
                metrics.record_discovery("file_reload");
                tracing::info!("{}: {n} workers", path.display());
            }
            Err(e) => {
                last = now;
                metrics.record_discovery("file_error");
                tracing::warn!("keeping the previous workers: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_and_json_lists_parse() {
        let m = Metrics::default();
        let yaml = "workers:\n  - worker_id: h:1\n    url: http://h:1\n    model_name: m\n    engine: sglang\n    extra_field: kept\n";
        let r = parse_worker_file(Path::new("w.yaml"), yaml, &m).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].extra["extra_field"], "kept");
        let json = r#"[{"worker_id":"h:2","url":"http://h:2","model_name":"m","engine":"vllm"},{"worker_id":"bad"}]"#;
        let r = parse_worker_file(Path::new("w.json"), json, &m).unwrap();
        assert_eq!(r.len(), 1, "the invalid record is dropped, counted");
        assert!(parse_worker_file(Path::new("w"), "42", &m).is_err());
    }
}
