//! `--router-tokenizer-path ORG/NAME` naming no local path: the earlier server took it
//! for a Hugging Face model id and downloaded the files matching `tokenizer*` and
//! `chat_template*` (`infera/common/tokenizer.py:14-27`). The gateway fetches the same
//! files (and `additional_chat_templates/*.jinja`, which transformers reads too) from the
//! Hub's file API (`--hf-endpoint`, `$HF_TOKEN` for gated models) in the background, as
//! it fetches the workers' tokenizer: until they arrive, prompts are not matched to
//! cached prefixes, and `GET /infera/tokenizer` says where it stands. Nothing is written
//! to disk.

use crate::route::kv_state::KvRouter;
use crate::route::tokenizer::{
    FetchTokenizerError, TokenizerState, TokenizerStatus, fetch_client, get_bytes_with,
};
use infera_prompt::PromptCodec;
use infera_proto::tokenizer::{CHAT_TEMPLATE_DIR, chat_template_name, compute_directory_digest};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The model id `path` names when it is not a local path: `name` or `org/name`, of the
/// characters Hub ids use.
pub(crate) fn hub_repo_id(path: &Path) -> Option<String> {
    if path.exists() {
        return None;
    }
    let id = path.to_str()?;
    let part = |p: &str| {
        !p.is_empty()
            && !p.starts_with(['.', '-'])
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    let plain = match id.split_once('/') {
        Some((org, name)) => part(org) && part(name),
        None => part(id),
    };
    plain.then(|| id.to_owned())
}

/// Of a repository's files, those the earlier server downloaded (`tokenizer*`,
/// `chat_template*` at the top) and the named chat templates.
pub(crate) fn hub_files(siblings: &[String]) -> Vec<String> {
    let mut out: Vec<String> = siblings
        .iter()
        .filter(|f| {
            let top =
                !f.contains('/') && (f.starts_with("tokenizer") || f.starts_with("chat_template"));
            top || (f.starts_with(CHAT_TEMPLATE_DIR) && chat_template_name(f).is_some())
        })
        .cloned()
        .collect();
    out.sort();
    out
}

fn authorized(request: reqwest::RequestBuilder, token: Option<&str>) -> reqwest::RequestBuilder {
    match token {
        Some(t) => request.bearer_auth(t),
        None => request,
    }
}

/// Downloads and loads `repo`'s tokenizer from the Hub at `endpoint`; returns it with the
/// digest of its tokenizer files.
pub(crate) async fn fetch_from_hub(
    client: &reqwest::Client,
    endpoint: &str,
    token: Option<&str>,
    repo: &str,
) -> Result<(PromptCodec, String), FetchTokenizerError> {
    let endpoint = endpoint.trim_end_matches('/');
    let info_url = format!("{endpoint}/api/models/{repo}/revision/main");
    let info = get_bytes_with(authorized(client.get(&info_url), token), &info_url).await?;
    let info: Value =
        serde_json::from_slice(&info).map_err(|source| FetchTokenizerError::DecodeManifest {
            url: info_url.clone(),
            source,
        })?;
    let siblings: Vec<String> = info["siblings"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter_map(|f| f["rfilename"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let mut files = Vec::new();
    for name in hub_files(&siblings) {
        let url = format!("{endpoint}/{repo}/resolve/main/{name}");
        let bytes = get_bytes_with(authorized(client.get(&url), token), &url).await?;
        files.push((name, bytes));
    }
    let digest = compute_directory_digest(files.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
    let source = format!("{repo} ({endpoint})");
    let codec =
        tokio::task::spawn_blocking(move || PromptCodec::from_files(&files, source)).await??;
    Ok((codec, digest))
}

/// Fetches `repo`'s tokenizer into the router, retrying with backoff (1 s doubling to
/// 30 s) until it loads; stops with `stop`.
pub(crate) async fn run_hub_fetch(
    kv: Arc<KvRouter>,
    status: Arc<TokenizerStatus>,
    endpoint: String,
    token: Option<String>,
    repo: String,
    mut stop: watch::Receiver<bool>,
) {
    let Some(client) = fetch_client(&status, Duration::from_secs(10), Duration::from_secs(120))
    else {
        return;
    };
    let mut backoff = Duration::from_secs(1);
    loop {
        let fetched = tokio::select! {
            f = fetch_from_hub(&client, &endpoint, token.as_deref(), &repo) => f,
            _ = stop.wait_for(|s| *s) => return,
        };
        match fetched {
            Ok((codec, digest)) => {
                tracing::info!(%repo, %digest, "tokenizer fetched from the Hugging Face Hub; kv-aware routing matches prefixes from now on");
                kv.set_codec(Arc::new(codec));
                status.store(Arc::new(TokenizerState::Local {
                    source: format!("{repo} from {endpoint} ({digest})"),
                }));
                return;
            }
            Err(e) => {
                let state = TokenizerState::Failed {
                    worker: String::new(),
                    error: format!("fetching {repo} from {endpoint}: {e}"),
                };
                if **status.load() != state {
                    tracing::warn!("--router-tokenizer-path {repo}: {e}; retrying in {backoff:?}");
                }
                status.store(Arc::new(state));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::Path as UrlPath;
    use axum::routing::get;

    #[test]
    fn hub_ids_are_what_no_local_path_is() {
        assert_eq!(
            hub_repo_id(Path::new("Qwen/Qwen3-0.6B")).as_deref(),
            Some("Qwen/Qwen3-0.6B")
        );
        assert_eq!(hub_repo_id(Path::new("gpt2")).as_deref(), Some("gpt2"));
        for not in ["/models/absent", "./fixture", "a/b/c", "fixture org/x", ""] {
            assert_eq!(hub_repo_id(Path::new(not)), None, "{not:?}");
        }
        let here = env!("CARGO_MANIFEST_DIR");
        assert_eq!(hub_repo_id(Path::new(here)), None, "a local path is read");
        assert_eq!(
            hub_files(&[
                "config.json".into(),
                "tokenizer.json".into(),
                "tokenizer_config.json".into(),
                "chat_template.jinja".into(),
                "additional_chat_templates/tool_use.jinja".into(),
                "model.safetensors".into(),
                "sub/tokenizer.json".into(),
            ]),
            [
                "additional_chat_templates/tool_use.jinja",
                "chat_template.jinja",
                "tokenizer.json",
                "tokenizer_config.json"
            ]
        );
    }

    #[tokio::test]
    async fn a_model_id_loads_from_the_hubs_file_api_with_its_chat_template() {
        // A Hub serving the `named` layout written by transformers' save_pretrained.
        let layout = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../prompt/testdata/layouts/named");
        let names = [
            "additional_chat_templates/tool_use.jinja",
            "chat_template.jinja",
            "tokenizer.json",
            "tokenizer_config.json",
        ];
        let siblings: Vec<Value> = names
            .iter()
            .chain(&["model.safetensors"])
            .map(|n| serde_json::json!({"rfilename": n}))
            .collect();
        let dir = layout.clone();
        let app = axum::Router::new()
            .route(
                "/api/models/fixture-org/fixture-model/revision/main",
                get(move || {
                    let siblings = siblings.clone();
                    async move { axum::Json(serde_json::json!({"siblings": siblings})) }
                }),
            )
            .route(
                "/fixture-org/fixture-model/resolve/main/{*file}",
                get(move |UrlPath(file): UrlPath<String>| {
                    let dir = dir.clone();
                    async move { std::fs::read(dir.join(file)).unwrap_or_default() }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::new();
        let (codec, digest) = fetch_from_hub(&client, &endpoint, None, "fixture-org/fixture-model")
            .await
            .unwrap();
        assert_eq!(codec.chat_template_names(), ["default", "tool_use"]);
        assert_eq!(digest.len(), 16);
        let absent = fetch_from_hub(&client, &endpoint, None, "fixture-org/absent").await;
        assert!(
            absent.unwrap_err().to_string().contains("404"),
            "a missing repository names the refusal"
        );
    }
}
