//! Observe the gateways' tokenizer: where kv-aware routing fetches it from the workers'
//! sidecars, a ready gateway pod's `GET /infera/tokenizer` says whether it is loaded,
//! still awaited, or failing and why; the `TokenizerLoaded` condition carries that,
//! so a tokenizer the gateway cannot load is visible on the deployment instead of a
//! crash loop (the gateway keeps serving, routing by load alone).

use crate::names;
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use std::sync::LazyLock;
use std::time::Duration;

/// Where the gateways' tokenizer stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayTokenizer {
    /// Loaded from a worker.
    Loaded {
        /// The worker.
        worker: String,
        /// Its digest.
        digest: String,
    },
    /// No worker has served one yet.
    Pending(String),
    /// The last attempt failed.
    Failed {
        /// The worker tried.
        worker: String,
        /// Why.
        error: String,
    },
    /// No gateway pod is ready to ask.
    NoGateway,
    /// The gateway did not answer.
    Unreachable(String),
}

impl GatewayTokenizer {
    /// From a gateway's `/infera/tokenizer` answer.
    pub fn from_state(state: &Value) -> Self {
        let field = |k: &str| state[k].as_str().unwrap_or_default().to_owned();
        match state["state"].as_str() {
            Some("loaded") => Self::Loaded {
                worker: field("worker"),
                digest: field("digest"),
            },
            Some("pending") => Self::Pending(field("reason")),
            Some("failed") => Self::Failed {
                worker: field("worker"),
                error: field("error"),
            },
            other => Self::Unreachable(format!("the gateway answered state {other:?}")),
        }
    }

    /// How bad it is: of several gateways, the worst answer is the condition's.
    fn severity(&self) -> u8 {
        match self {
            Self::Loaded { .. } => 0,
            Self::NoGateway => 1,
            Self::Pending(_) => 2,
            Self::Unreachable(_) => 3,
            Self::Failed { .. } => 4,
        }
    }

    /// Whether it is loaded.
    pub fn loaded(&self) -> bool {
        matches!(self, Self::Loaded { .. })
    }

    /// The condition's status, reason and message.
    pub fn condition(&self) -> (bool, &'static str, String) {
        match self {
            Self::Loaded { worker, digest } => (
                true,
                "Loaded",
                format!("tokenizer {digest} fetched from worker {worker}"),
            ),
            Self::Pending(reason) => (
                false,
                "WaitingForWorkers",
                format!("{reason}; routing weighs load alone until then"),
            ),
            Self::Failed { worker, error } => (
                false,
                "TokenizerUnloadable",
                format!("from worker {worker}: {error}; routing weighs load alone, retried"),
            ),
            Self::NoGateway => (
                false,
                "GatewayNotReady",
                "no gateway pod is ready to ask".into(),
            ),
            Self::Unreachable(e) => (false, "GatewayUnreachable", e.clone()),
        }
    }
}

fn is_ready_gateway(pod: &Pod) -> bool {
    let component = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::COMPONENT_LABEL))
        .map(String::as_str);
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    component == Some("gateway") && ready && pod.metadata.deletion_timestamp.is_none()
}

/// One client for every reconcile (its connection pool and TLS set-up are reused). The
/// certificate check is off for HTTPS gateways only; plain HTTP is unaffected by it.
static CLIENT: LazyLock<Result<reqwest::Client, String>> = LazyLock::new(|| {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .danger_accept_invalid_certs(true)
        .build()
        .map_err(|e| e.to_string())
});

/// Asks every ready gateway pod among `pods` (its address, the gateway port); the
/// worst answer stands for them all (one replica that failed is not hidden by another
/// that loaded). With HTTPS the certificate is not checked: it names the Service, not
/// the pod's address, and nothing is sent but this request.
pub async fn observe_gateway_tokenizer(pods: &[Pod], port: u16, tls: bool) -> GatewayTokenizer {
    let addresses: Vec<String> = pods
        .iter()
        .filter(|p| is_ready_gateway(p))
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    let client = match &*CLIENT {
        Ok(c) => c,
        Err(e) => return GatewayTokenizer::Unreachable(format!("an HTTP client: {e}")),
    };
    let scheme = if tls { "https" } else { "http" };
    let mut worst = GatewayTokenizer::NoGateway;
    for (i, ip) in addresses.into_iter().enumerate() {
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip
        };
        let url = format!("{scheme}://{host}:{port}/infera/tokenizer");
        let answer = match client.get(&url).send().await {
            Ok(r) => r.json::<Value>().await,
            Err(e) => Err(e),
        };
        let seen = match answer {
            Ok(state) => GatewayTokenizer::from_state(&state),
            Err(e) => GatewayTokenizer::Unreachable(format!("GET {url}: {e}")),
        };
        if i == 0 || seen.severity() > worst.severity() {
            worst = seen;
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_gateways_answer_becomes_the_condition() {
        let cases = [
            (
                json!({"state": "loaded", "worker": "10.0.0.5:8000", "digest": "abcd"}),
                (
                    true,
                    "Loaded",
                    "tokenizer abcd fetched from worker 10.0.0.5:8000",
                ),
            ),
            (
                json!({"state": "pending", "reason": "no worker is registered yet"}),
                (
                    false,
                    "WaitingForWorkers",
                    "no worker is registered yet; routing weighs load alone until then",
                ),
            ),
            (
                json!({"state": "failed", "worker": "w", "error": "loading the tokenizer: bad json"}),
                (
                    false,
                    "TokenizerUnloadable",
                    "from worker w: loading the tokenizer: bad json; routing weighs load alone, retried",
                ),
            ),
            (
                json!({"state": "unused"}),
                (
                    false,
                    "GatewayUnreachable",
                    "the gateway answered state Some(\"unused\")",
                ),
            ),
        ];
        for (state, (ok, reason, message)) in cases {
            let (got_ok, got_reason, got_message) =
                GatewayTokenizer::from_state(&state).condition();
            assert_eq!(
                (got_ok, got_reason, got_message.as_str()),
                (ok, reason, message),
                "{state}"
            );
        }
    }

    #[test]
    fn only_ready_gateway_pods_are_asked() {
        let pod = |component: &str, ready: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p", "labels": {"app.kubernetes.io/component": component}},
                "status": {"podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": ready}]}
            }))
            .unwrap()
        };
        assert!(is_ready_gateway(&pod("gateway", "True")));
        assert!(!is_ready_gateway(&pod("gateway", "False")));
        assert!(!is_ready_gateway(&pod("engine", "True")));
    }

    #[tokio::test]
    async fn without_a_ready_gateway_nothing_is_asked() {
        assert_eq!(
            observe_gateway_tokenizer(&[], 8000, false).await,
            GatewayTokenizer::NoGateway
        );
    }
}
