//! The engine's tokenizer files, served on the status port (`GET /tokenizer`, then
//! `GET /tokenizer/<name>`), so a gateway rebuilds exactly the tokenizer its workers
//! use without mounting the model volume, wherever that lives.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use infera_proto::sidecar::{TOKENIZER_PATH, TokenizerManifest};
use infera_proto::tokenizer::is_tokenizer_file;
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
    /// The served files: every tokenizer file of the folder (sorted), or the one file.
    pub fn manifest(&self) -> std::io::Result<TokenizerManifest> {
        let mut files: Vec<String> = if self.path.is_file() {
            vec!["tokenizer.json".into()]
        } else {
            std::fs::read_dir(&self.path)?
                .flatten()
                .filter(|e| e.path().is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| is_tokenizer_file(n))
                .collect()
        };
        files.sort();
        Ok(TokenizerManifest {
            digest: self.digest.clone(),
            files,
        })
    }

    /// The file the manifest calls `name`, if it lists it.
    fn file(&self, name: &str) -> std::io::Result<Option<PathBuf>> {
        if !self.manifest()?.files.iter().any(|f| f == name) {
            return Ok(None);
        }
        Ok(Some(if self.path.is_file() {
            self.path.clone()
        } else {
            self.path.join(name)
        }))
    }
}

type Shared = Arc<Option<LocalTokenizer>>;

/// The tokenizer routes, serving `tokenizer` (none: 404 with the reason).
pub fn build_tokenizer_router(tokenizer: Option<LocalTokenizer>) -> Router {
    Router::new()
        .route(TOKENIZER_PATH, get(manifest))
        .route(&format!("{TOKENIZER_PATH}/{{name}}"), get(file))
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
    not_found("this worker's engine flags name no local tokenizer (the model is not a folder holding tokenizer.json)".into())
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
            get(&router, "/tokenizer/tokenizer.json").await,
            (StatusCode::OK, b"{\"t\":1}".to_vec())
        );
        for refused in [
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
