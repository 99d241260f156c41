//! The engine's tokenizer files, served on the status port (`GET /tokenizer`, then
//! `GET /tokenizer/<name>`), so a gateway rebuilds exactly the tokenizer its workers
//! use without mounting the model volume, wherever that lives: the tokenizer files, and
//! the chat templates transformers reads beside them (`chat_template.jinja`,
//! `additional_chat_templates/<name>.jinja`), listed apart with their own digest.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use infera_proto::sidecar::{TOKENIZER_PATH, TokenizerManifest};
use infera_proto::tokenizer::{
    CHAT_TEMPLATE_DIR, CHAT_TEMPLATE_FILE, chat_template_name, compute_named_digest,
    is_tokenizer_file,
};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;

/// A tokenizer on this pod's disk: a folder, or a single `tokenizer.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalTokenizer {
    /// Its location.
    pub path: PathBuf,
    /// Its digest.
    pub digest: String,
}

impl LocalTokenizer {
    /// The served files: every tokenizer file of the folder (sorted), or the one file;
    /// and the folder's chat templates with their digest.
    pub fn manifest(&self) -> std::io::Result<TokenizerManifest> {
        if self.path.is_file() {
            return Ok(TokenizerManifest {
                digest: self.digest.clone(),
                files: vec!["tokenizer.json".into()],
                chat_templates: Vec::new(),
                chat_templates_digest: None,
            });
        }
        let mut files: Vec<String> = files_in(&self.path)?
            .into_iter()
            .filter(|n| is_tokenizer_file(n))
            .collect();
        files.sort();
        let mut chat_templates: Vec<String> = Vec::new();
        if self.path.join(CHAT_TEMPLATE_FILE).is_file() {
            chat_templates.push(CHAT_TEMPLATE_FILE.into());
        }
        let named = self.path.join(CHAT_TEMPLATE_DIR);
        if named.is_dir() {
            let mut more: Vec<String> = files_in(&named)?
                .into_iter()
                .map(|n| format!("{CHAT_TEMPLATE_DIR}/{n}"))
                .filter(|p| chat_template_name(p).is_some())
                .collect();
            more.sort();
            chat_templates.extend(more);
        }
        let chat_templates_digest = if chat_templates.is_empty() {
            None
        } else {
            let mut read = Vec::new();
            for name in &chat_templates {
                read.push((name.as_str(), std::fs::read(self.path.join(name))?));
            }
            Some(compute_named_digest(
                read.iter().map(|(n, b)| (*n, b.as_slice())),
            ))
        };
        Ok(TokenizerManifest {
            digest: self.digest.clone(),
            files,
            chat_templates,
            chat_templates_digest,
        })
    }

    /// The file the manifest calls `name`, if it lists it.
    fn file(&self, name: &str) -> std::io::Result<Option<PathBuf>> {
        let manifest = self.manifest()?;
        let listed = |list: &[String]| list.iter().any(|f| f == name);
        if !listed(&manifest.files) && !listed(&manifest.chat_templates) {
            return Ok(None);
        }
        Ok(Some(if self.path.is_file() {
            self.path.clone()
        } else {
            self.path.join(name)
        }))
    }
}

/// The names of the regular files in `dir`.
fn files_in(dir: &std::path::Path) -> std::io::Result<Vec<String>> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect())
}

type Shared = Arc<Option<LocalTokenizer>>;

/// The tokenizer routes, serving `tokenizer` (none: 404 with the reason).
pub fn build_tokenizer_router(tokenizer: Option<LocalTokenizer>) -> Router {
    Router::new()
        .route(TOKENIZER_PATH, get(manifest))
        .route(&format!("{TOKENIZER_PATH}/{{*name}}"), get(file))
        .with_state(Arc::new(tokenizer))
}

fn not_found(message: String) -> Response {
    let body =
        json!({"error": {"message": message, "type": "not_found_error", "code": "not_found"}});
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

fn failed(e: std::io::Error) -> Response {
    let body = json!({"error": {"message": format!("reading the tokenizer: {e}"), "type": "server_error", "code": "internal_error"}});
    (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response()
}

fn no_tokenizer() -> Response {
    not_found("this worker's engine flags name no local tokenizer (the model is not a folder holding tokenizer.json or a tiktoken vocabulary)".into())
}

async fn manifest(State(t): State<Shared>) -> Response {
    let Some(t) = t.as_ref() else {
        return no_tokenizer();
    };
    match t.manifest() {
        Ok(m) => axum::Json(m).into_response(),
        Err(e) => failed(e),
    }
}

async fn file(State(t): State<Shared>, Path(name): Path<String>) -> Response {
    let Some(t) = t.as_ref() else {
        return no_tokenizer();
    };
    let path = match t.file(&name) {
        Ok(Some(p)) => p,
        Ok(None) => return not_found(format!("{name:?} is not a tokenizer file of this worker")),
        Err(e) => return failed(e),
    };
    match tokio::fs::read(&path).await {
        Ok(bytes) => bytes.into_response(),
        Err(e) => failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(router: &Router, path: &str) -> (StatusCode, Vec<u8>) {
        let response = router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, body.to_vec())
    }

    #[tokio::test]
    async fn serves_the_tokenizer_files_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), "{\"t\":1}").unwrap();
        std::fs::write(dir.path().join("tokenizer_config.json"), "{}").unwrap();
        std::fs::write(dir.path().join("model.safetensors"), "weights").unwrap();
        std::fs::write(dir.path().join("chat_template.jinja"), "fixture {{ x }}").unwrap();
        std::fs::create_dir(dir.path().join("additional_chat_templates")).unwrap();
        std::fs::write(
            dir.path().join("additional_chat_templates/tool_use.jinja"),
            "fixture tools",
        )
        .unwrap();
        std::fs::write(dir.path().join("additional_chat_templates/notes.txt"), "x").unwrap();
        let router = build_tokenizer_router(Some(LocalTokenizer {
            path: dir.path().to_owned(),
            digest: "abc".into(),
        }));
        let (status, body) = get(&router, "/tokenizer").await;
        assert_eq!(status, StatusCode::OK);
        let m: TokenizerManifest = serde_json::from_slice(&body).unwrap();
        assert_eq!(m.digest, "abc");
        assert_eq!(m.files, ["tokenizer.json", "tokenizer_config.json"]);
        assert_eq!(
            m.chat_templates,
            [
                "chat_template.jinja",
                "additional_chat_templates/tool_use.jinja"
            ]
        );
        assert_eq!(
            m.chat_templates_digest.as_deref(),
            Some(
                compute_named_digest([
                    ("chat_template.jinja", &b"fixture {{ x }}"[..]),
                    ("additional_chat_templates/tool_use.jinja", b"fixture tools"),
                ])
                .as_str()
            )
        );
        assert_eq!(
            get(&router, "/tokenizer/tokenizer.json").await,
            (StatusCode::OK, b"{\"t\":1}".to_vec())
        );
        assert_eq!(
            get(&router, "/tokenizer/chat_template.jinja").await,
            (StatusCode::OK, b"fixture {{ x }}".to_vec())
        );
        for served in [
            "/tokenizer/additional_chat_templates/tool_use.jinja",
            "/tokenizer/additional_chat_templates%2Ftool_use.jinja",
        ] {
            assert_eq!(
                get(&router, served).await,
                (StatusCode::OK, b"fixture tools".to_vec()),
                "{served}"
            );
        }
        for refused in [
            "/tokenizer/additional_chat_templates/notes.txt",
            "/tokenizer/additional_chat_templates/../model.safetensors",
            "/tokenizer/model.safetensors",
            "/tokenizer/..%2Ftokenizer.json",
            "/tokenizer/absent.json",
        ] {
            assert_eq!(
                get(&router, refused).await.0,
                StatusCode::NOT_FOUND,
                "{refused}"
            );
        }
        let none = build_tokenizer_router(None);
        let (status, body) = get(&none, "/tokenizer").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(String::from_utf8_lossy(&body).contains("no local tokenizer"));
    }
}
