//! `--router-tokenizer-from-workers`: the tokenizer for kv-aware routing, fetched from a
//! worker's engine sidecar (`GET /tokenizer` on its status port, then each file) instead
//! of a folder the gateway mounts. The files are checked against the digest the sidecar
//! and the worker's record state, loaded, and swapped into the router; until then the
//! router weighs load alone and `GET /infera/tokenizer` says why. The chat templates
//! come with it (`chat_template.jinja`, `additional_chat_templates/`), checked against
//! their own digest. Nothing here stops the gateway: a tokenizer it cannot load (a
//! tiktoken vocabulary without `tokenizer.json` among them) is a state it reports,
//! retried with backoff, while prompts are hashed as bytes.

use crate::route::kv_state::KvRouter;
use crate::workers::registry::Registry;
use arc_swap::ArcSwap;
use infera_prompt::PromptCodec;
use infera_proto::sidecar::{TOKENIZER_PATH, TokenizerManifest};
use infera_proto::tokenizer::{
    chat_template_name, compute_directory_digest, compute_file_digest, compute_named_digest,
    is_tiktoken_file, is_tokenizer_file,
};
use infera_proto::worker::WorkerRecord;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Where the router's tokenizer stands (`GET /infera/tokenizer`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum TokenizerState {
    /// Routing is not kv-aware: no tokenizer is used.
    Unused,
    /// Read at start from `--router-tokenizer-path` (or prompts counted as bytes).
    Local {
        /// The folder, or `bytes`.
        source: String,
    },
    /// Waiting for a worker to serve one.
    Pending {
        /// Why none is loaded yet.
        reason: String,
    },
    /// Fetched from a worker and in use.
    Loaded {
        /// The worker it came from.
        #[serde(skip_serializing_if = "String::is_empty")]
        worker: String,
        /// Its digest.
        digest: String,
    },
    /// The last attempt failed; retried.
    Failed {
        /// The worker tried last.
        #[serde(skip_serializing_if = "String::is_empty")]
        worker: String,
        /// What went wrong.
        error: String,
    },
}

impl TokenizerState {
    /// Without worker addresses and errors (which name them), for callers that may not
    /// read `/metrics` either.
    pub(crate) fn redacted(&self) -> Self {
        match self {
            Self::Loaded { digest, .. } => Self::Loaded {
                worker: String::new(),
                digest: digest.clone(),
            },
            Self::Failed { .. } => Self::Failed {
                worker: String::new(),
                error: "the details (worker addresses) need an API key, as /metrics does".into(),
            },
            other => other.clone(),
        }
    }
}

/// The state, shared between the fetch task and the endpoint.
pub(crate) type TokenizerStatus = ArcSwap<TokenizerState>;

/// A worker to ask, and the digest its record promises (if any).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Candidate {
    /// Worker id.
    pub worker: String,
    /// Its sidecar's tokenizer manifest URL.
    pub manifest_url: String,
    /// `kv.tokenizer_digest` of its record.
    pub digest: Option<String>,
}

/// The sidecar manifest URL of the worker whose engine is at `engine_url`.
pub(crate) fn manifest_url(engine_url: &str, sidecar_port: u16) -> Option<String> {
    let mut url = reqwest::Url::parse(engine_url).ok()?;
    url.set_port(Some(sidecar_port)).ok()?;
    url.set_scheme("http").ok()?;
    url.set_path(TOKENIZER_PATH);
    url.set_query(None);
    Some(url.into())
}

/// The workers to ask, those whose record names a tokenizer digest first (their sidecar
/// read one), each once.
pub(crate) fn candidates<'a>(
    workers: impl IntoIterator<Item = &'a WorkerRecord>,
    sidecar_port: u16,
) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = workers
        .into_iter()
        .filter_map(|w| {
            Some(Candidate {
                worker: w.worker_id.clone(),
                manifest_url: manifest_url(&w.url, sidecar_port)?,
                digest: w.kv.as_ref().and_then(|kv| kv.tokenizer_digest.clone()),
            })
        })
        .collect();
    out.sort_by_key(|c| c.digest.is_none());
    let mut seen = std::collections::HashSet::new();
    out.retain(|c| seen.insert(c.manifest_url.clone()));
    out
}

/// Why a worker's tokenizer was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchTokenizerError {
    /// A request to the sidecar failed or was refused.
    #[error("GET {url}: {message}")]
    Get {
        /// What was asked.
        url: String,
        /// The failure or the refusal (status and the start of its body).
        message: String,
    },
    /// The manifest is not one.
    #[error("{url}: not a tokenizer manifest: {source}")]
    DecodeManifest {
        /// Where it came from.
        url: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The model's tokenizer is a tiktoken vocabulary: nothing to load.
    #[error(
        "the worker's model has a tiktoken vocabulary ({0}) and no tokenizer.json, which the router \
         reads: its prompts are hashed as UTF-8 bytes, which match no engine's cached blocks"
    )]
    TiktokenOnly(String),
    /// No `tokenizer.json`.
    #[error("the worker's tokenizer has no tokenizer.json (the router reads that format)")]
    NoTokenizerJson,
    /// The manifest names a file that is neither a tokenizer file nor a chat template.
    #[error("the manifest lists {0:?}, which is not a tokenizer file or chat template")]
    NotTokenizerFile(String),
    /// The sidecar serves another tokenizer than its record states.
    #[error("the sidecar serves tokenizer {served} but the worker's record names {promised}")]
    DigestNotRecorded {
        /// The manifest's digest.
        served: String,
        /// The record's.
        promised: String,
    },
    /// The files do not add up to the digest stated.
    #[error("the {what} arrived with digest {arrived}, not the {stated} the sidecar stated")]
    DigestMismatch {
        /// `files` or `chat templates`.
        what: &'static str,
        /// Computed here.
        arrived: String,
        /// The manifest's.
        stated: String,
    },
    /// Loading the files failed.
    #[error("loading the tokenizer: {0}")]
    Load(#[from] infera_prompt::PromptError),
    /// The loading task did not finish.
    #[error("loading the tokenizer: {0}")]
    LoadTask(#[from] tokio::task::JoinError),
}

/// Checks downloaded `files` against the `manifest` and the record's `promised` digest,
/// and the chat templates (`templates`) against the manifest's digest of them.
pub(crate) fn check_files(
    manifest: &TokenizerManifest,
    files: &[(String, Vec<u8>)],
    templates: &[(String, Vec<u8>)],
    promised: Option<&str>,
) -> Result<(), FetchTokenizerError> {
    if let Some(p) = promised
        && p != manifest.digest
    {
        return Err(FetchTokenizerError::DigestNotRecorded {
            served: manifest.digest.clone(),
            promised: p.to_owned(),
        });
    }
    let directory = compute_directory_digest(files.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
    let single = match files {
        [(name, bytes)] if name == "tokenizer.json" => Some(compute_file_digest(bytes)),
        _ => None,
    };
    if directory != manifest.digest && single.as_deref() != Some(manifest.digest.as_str()) {
        return Err(FetchTokenizerError::DigestMismatch {
            what: "files",
            arrived: directory,
            stated: manifest.digest.clone(),
        });
    }
    if let Some(stated) = &manifest.chat_templates_digest {
        let arrived =
            compute_named_digest(templates.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
        if &arrived != stated {
            return Err(FetchTokenizerError::DigestMismatch {
                what: "chat templates",
                arrived,
                stated: stated.clone(),
            });
        }
    }
    Ok(())
}

/// The largest tokenizer file fetched (the largest `tokenizer.json` files are tens of MB).
const MAX_FILE_BYTES: usize = 256 << 20;

async fn get_bytes(client: &reqwest::Client, url: &str) -> Result<Vec<u8>, FetchTokenizerError> {
    get_bytes_with(client.get(url), url).await
}

/// The body of `request` (a GET of `url`), within [`MAX_FILE_BYTES`]; a refusal names the
/// status and the start of its body.
pub(crate) async fn get_bytes_with(
    request: reqwest::RequestBuilder,
    url: &str,
) -> Result<Vec<u8>, FetchTokenizerError> {
    let failed = |message: String| FetchTokenizerError::Get {
        url: url.to_owned(),
        message,
    };
    let mut response = request.send().await.map_err(|e| failed(e.to_string()))?;
    let status = response.status();
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| failed(e.to_string()))? {
        if body.len() + chunk.len() > MAX_FILE_BYTES {
            return Err(failed(format!("larger than {MAX_FILE_BYTES} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        return Err(failed(format!(
            "{status}: {}",
            String::from_utf8_lossy(&body)
                .chars()
                .take(300)
                .collect::<String>()
        )));
    }
    Ok(body)
}

/// Whether a name the manifest lists may be fetched: a plain file name, or a chat
/// template's path (`additional_chat_templates/<name>.jinja`).
fn fetchable(name: &str, template: bool) -> bool {
    if template {
        chat_template_name(name).is_some()
    } else {
        is_tokenizer_file(name) && !name.contains(['/', '\\']) && !name.starts_with('.')
    }
}

/// Fetches, checks and loads one worker's tokenizer; returns it with its digest.
pub(crate) async fn fetch(
    client: &reqwest::Client,
    candidate: &Candidate,
) -> Result<(PromptCodec, String), FetchTokenizerError> {
    let url = &candidate.manifest_url;
    let manifest: TokenizerManifest = serde_json::from_slice(&get_bytes(client, url).await?)
        .map_err(|source| FetchTokenizerError::DecodeManifest {
            url: url.clone(),
            source,
        })?;
    if !manifest.files.iter().any(|f| f == "tokenizer.json") {
        return Err(match manifest.files.iter().find(|f| is_tiktoken_file(f)) {
            Some(vocabulary) => FetchTokenizerError::TiktokenOnly(vocabulary.clone()),
            None => FetchTokenizerError::NoTokenizerJson,
        });
    }
    let mut files = Vec::new();
    let mut templates = Vec::new();
    for (list, template, into) in [
        (&manifest.files, false, &mut files),
        (&manifest.chat_templates, true, &mut templates),
    ] {
        for name in list {
            if !fetchable(name, template) {
                return Err(FetchTokenizerError::NotTokenizerFile(name.clone()));
            }
            into.push((
                name.clone(),
                get_bytes(client, &format!("{url}/{name}")).await?,
            ));
        }
    }
    check_files(&manifest, &files, &templates, candidate.digest.as_deref())?;
    let source = format!("worker {} ({})", candidate.worker, manifest.digest);
    files.extend(templates);
    // Parsing a tokenizer.json of tens of MB takes a while: off the async workers.
    let codec =
        tokio::task::spawn_blocking(move || PromptCodec::from_files(&files, source)).await??;
    Ok((codec, manifest.digest))
}

/// One round: asks the registered workers in turn until one's tokenizer loads.
async fn fetch_round(
    client: &reqwest::Client,
    registry: &Registry,
    sidecar_port: u16,
) -> Result<(PromptCodec, TokenizerState), TokenizerState> {
    let snapshot = registry.snapshot();
    let asked = candidates(snapshot.workers.values().map(|w| &**w), sidecar_port);
    let mut state = TokenizerState::Pending {
        reason: "no worker is registered yet".into(),
    };
    for candidate in &asked {
        match fetch(client, candidate).await {
            Ok((codec, digest)) => {
                let loaded = TokenizerState::Loaded {
                    worker: candidate.worker.clone(),
                    digest,
                };
                return Ok((codec, loaded));
            }
            Err(error) => {
                state = TokenizerState::Failed {
                    worker: candidate.worker.clone(),
                    error: error.to_string(),
                }
            }
        }
    }
    Err(state)
}

/// Whether the workers moved to another tokenizer than `digest`: some state one in
/// their records, none states `digest` (a new model rolled out).
pub(crate) fn superseded(workers: &[&WorkerRecord], digest: &str) -> bool {
    let stated: Vec<&str> = workers
        .iter()
        .filter_map(|w| w.kv.as_ref()?.tokenizer_digest.as_deref())
        .collect();
    !stated.is_empty() && !stated.contains(&digest)
}

/// The HTTP client of a tokenizer fetch; `None`, with the failure in `status`, when
/// none can be built.
pub(crate) fn fetch_client(
    status: &TokenizerStatus,
    connect: Duration,
    total: Duration,
) -> Option<reqwest::Client> {
    match reqwest::Client::builder()
        .connect_timeout(connect)
        .timeout(total)
        .build()
    {
        Ok(c) => Some(c),
        Err(e) => {
            status.store(Arc::new(TokenizerState::Failed {
                worker: String::new(),
                error: format!("building an HTTP client: {e}"),
            }));
            None
        }
    }
}

/// How often a loaded tokenizer is compared with the workers' records.
const RECHECK: Duration = Duration::from_secs(30);

/// Fetches the workers' tokenizer into the router: rounds with backoff (1 s doubling to
/// 30 s) until one loads; then every 30 s checks that the workers still state its
/// digest, and fetches again when they moved to another (a new model). Stops with `stop`.
pub(crate) async fn run_tokenizer_fetch(
    kv: Arc<KvRouter>,
    status: Arc<TokenizerStatus>,
    registry: Arc<Registry>,
    sidecar_port: u16,
    mut stop: watch::Receiver<bool>,
) {
    let Some(client) = fetch_client(&status, Duration::from_secs(3), Duration::from_secs(60))
    else {
        return;
    };
    let mut backoff = Duration::from_secs(1);
    loop {
        let round = tokio::select! {
            r = fetch_round(&client, &registry, sidecar_port) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let wait = match round {
            Ok((codec, loaded)) => {
                if let TokenizerState::Loaded { worker, digest } = &loaded {
                    tracing::info!(%worker, %digest, "tokenizer fetched from the worker's sidecar; kv-aware routing matches prefixes from now on");
                }
                kv.set_codec(Arc::new(codec));
                status.store(Arc::new(loaded));
                backoff = Duration::from_secs(1);
                RECHECK
            }
            Err(state) => {
                if let TokenizerState::Failed { worker, error } = &state
                    && **status.load() != state
                {
                    tracing::warn!(%worker, "no tokenizer from the workers yet: {error}");
                }
                // A loaded tokenizer stays in use while another is sought.
                if !matches!(**status.load(), TokenizerState::Loaded { .. }) {
                    status.store(Arc::new(state));
                }
                let wait = backoff;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                wait
            }
        };
        // Sleep, and while a tokenizer is loaded, until the workers move to another.
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let TokenizerState::Loaded { digest, .. } = &**status.load() else {
                break;
            };
            let snapshot = registry.snapshot();
            let workers: Vec<&WorkerRecord> = snapshot.workers.values().map(|w| &**w).collect();
            if superseded(&workers, digest) {
                tracing::info!(%digest, "the workers state another tokenizer: fetching it");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(id: &str, url: &str, digest: Option<&str>) -> WorkerRecord {
        serde_json::from_value(json!({
            "worker_id": id, "url": url, "model_name": "m", "engine": "vllm",
            "kv": {"engine_block_size": 16, "index_block_size": 64, "tokenizer": null,
                   "tokenizer_digest": digest, "tokenizer_canary": [1]}
        }))
        .unwrap()
    }

    #[test]
    fn the_sidecar_is_on_the_workers_host_at_its_port() {
        assert_eq!(
            manifest_url("http://10.0.0.7:8000", 8090).as_deref(),
            Some("http://10.0.0.7:8090/tokenizer")
        );
        assert_eq!(
            manifest_url("https://[fd00::7]:8000/v1?x=1", 8090).as_deref(),
            Some("http://[fd00::7]:8090/tokenizer")
        );
        assert_eq!(manifest_url("not a url", 8090), None);
    }

    #[test]
    fn workers_whose_record_names_a_digest_are_asked_first_each_once() {
        let workers = [
            record("10.0.0.1:8000", "http://10.0.0.1:8000", None),
            record("10.0.0.2:8000", "http://10.0.0.2:8000", Some("d")),
            record("10.0.0.2:8001", "http://10.0.0.2:8000", Some("d")),
        ];
        let c = candidates(workers.iter(), 8090);
        let ids: Vec<&str> = c.iter().map(|c| c.worker.as_str()).collect();
        assert_eq!(ids, ["10.0.0.2:8000", "10.0.0.1:8000"]);
        assert_eq!(c[0].digest.as_deref(), Some("d"));
    }

    #[test]
    fn a_loaded_tokenizer_is_superseded_only_when_the_workers_state_another() {
        let a = record("10.0.0.1:8000", "http://10.0.0.1:8000", Some("aaaa"));
        let b = record("10.0.0.2:8000", "http://10.0.0.2:8000", Some("bbbb"));
        let none = record("10.0.0.3:8000", "http://10.0.0.3:8000", None);
        assert!(!superseded(&[&a, &b], "aaaa"), "one worker still states it");
        assert!(superseded(&[&b], "aaaa"));
        assert!(!superseded(&[&none], "aaaa"), "nothing stated");
        assert!(!superseded(&[], "aaaa"), "no workers: keep it");
    }

    #[test]
    fn redacted_states_name_no_worker() {
        let failed = TokenizerState::Failed {
            worker: "10.0.0.1:8000".into(),
            error: "GET http://10.0.0.1:8090/tokenizer: refused".into(),
        };
        let shown = serde_json::to_string(&failed.redacted()).unwrap();
        assert!(!shown.contains("10.0.0.1"), "{shown}");
        assert!(shown.contains("\"state\":\"failed\""), "{shown}");
        let loaded = TokenizerState::Loaded {
            worker: "10.0.0.1:8000".into(),
            digest: "d".into(),
        };
        assert_eq!(
            serde_json::to_value(loaded.redacted()).unwrap(),
            json!({"state": "loaded", "digest": "d"})
        );
    }

    #[test]
    fn files_must_match_the_stated_digests() {
        let files = vec![
            ("tokenizer.json".to_owned(), b"{}".to_vec()),
            ("tokenizer_config.json".to_owned(), b"{}".to_vec()),
        ];
        let digest =
            compute_directory_digest(files.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
        let templates = vec![(
            "chat_template.jinja".to_owned(),
            b"fixture {{ x }}".to_vec(),
        )];
        let manifest = TokenizerManifest {
            digest: digest.clone(),
            files: files.iter().map(|(n, _)| n.clone()).collect(),
            chat_templates: vec!["chat_template.jinja".into()],
            chat_templates_digest: Some(compute_named_digest(
                templates.iter().map(|(n, b)| (n.as_str(), b.as_slice())),
            )),
        };
        let check = |files: &[(String, Vec<u8>)],
                     templates: &[(String, Vec<u8>)],
                     promised: Option<&str>| {
            check_files(&manifest, files, templates, promised).map_err(|e| e.to_string())
        };
        assert_eq!(check(&files, &templates, Some(&digest)), Ok(()));
        assert_eq!(check(&files, &templates, None), Ok(()));
        let e = check(&files, &templates, Some("other")).unwrap_err();
        assert!(e.contains("record names other"), "{e}");
        let mut tampered = files.clone();
        tampered[0].1 = b"{\"x\":1}".to_vec();
        assert!(
            check(&tampered, &templates, None)
                .unwrap_err()
                .contains("files arrived with digest")
        );
        let mut other_template = templates.clone();
        other_template[0].1 = b"fixture other".to_vec();
        assert!(
            check(&files, &other_template, None)
                .unwrap_err()
                .contains("chat templates arrived with digest"),
        );
        // A single tokenizer.json is digested as a file.
        let one = vec![("tokenizer.json".to_owned(), b"{}".to_vec())];
        let single = TokenizerManifest {
            digest: compute_file_digest(b"{}"),
            files: vec!["tokenizer.json".into()],
            chat_templates: Vec::new(),
            chat_templates_digest: None,
        };
        assert!(check_files(&single, &one, &[], None).is_ok());
    }
}
