//! The gateway's shared state and its assembly from a [`GatewayConfig`].

use crate::config::{ConfigError, GatewayConfig};
use crate::control::profile::build_profile_client;
use crate::control::scale::Scaler;
use crate::flow::gate::FlowControl;
use crate::metrics::{Metrics, WorkerGauges};
use crate::route::hub::hub_repo_id;
use crate::route::kv_state::KvRouter;
use crate::route::select::Routing;
use crate::route::tokenizer::{TokenizerState, TokenizerStatus};
use crate::send::upstream::Upstream;
use crate::workers::breaker::Breakers;
use crate::workers::inflight::Inflight;
use crate::workers::registry::{Registry, Snapshot};
use arc_swap::ArcSwap;
use infera_prompt::{PromptCodec, PromptError};
use infera_proto::retention::Retention;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Everything the handlers share.
#[derive(Debug)]
pub struct Gateway {
    /// Settings.
    pub(crate) cfg: GatewayConfig,
    /// Workers.
    pub registry: Arc<Registry>,
    /// Breakers.
    pub(crate) breakers: Arc<Breakers>,
    /// How workers are chosen (the policy and its kv-aware state).
    pub(crate) routing: Routing,
    /// What the forward path needs: client, breakers, metrics, timeouts.
    pub(crate) upstream: Upstream,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// Upstream client.
    pub(crate) client: reqwest::Client,
    /// Accepted bearer tokens (`None`: auth off); `reload_api_keys` swaps in the file's
    /// new keys when it changes.
    pub(crate) api_keys: Option<ArcSwap<HashSet<String>>>,
    /// Retention for unhinted requests.
    pub(crate) default_retention: Retention,
    /// In-flight requests per worker.
    pub(crate) inflight: Arc<Inflight>,
    /// kv-aware routing state (`--router-policy kv-aware`).
    pub(crate) kv: Option<Arc<KvRouter>>,
    /// Shutting down: still serving, but not ready, and closing connections after each
    /// response (see `--shutdown-delay-s`).
    pub(crate) draining: AtomicBool,
    /// Flow control (`--flow-control`).
    pub(crate) flow: Option<Arc<FlowControl>>,
    /// Admission: one permit per request being served (`None`: no limit).
    pub(crate) admission: Option<Arc<Semaphore>>,
    /// Where kv-aware routing's tokenizer stands (`GET /infera/tokenizer`).
    pub(crate) tokenizer: Arc<TokenizerStatus>,
    /// The client of the profile fan-out (the earlier one's timeouts).
    pub(crate) profile_client: reqwest::Client,
    /// The scaling API's side of the Kubernetes API.
    pub(crate) scaler: Scaler,
    /// What a worker's sidecar asks of callers outside its Pod (`$INFERA_DRAIN_TOKEN`,
    /// set by the operator): presented when forwarding a prewarm hint.
    pub(crate) drain_token: Option<String>,
}

/// Reads a keys file: one token per line, blank lines and `#` comments skipped.
fn load_api_keys(path: &Path) -> Result<HashSet<String>, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("--api-keys-file {}: {e}", path.display())))?;
    let keys: HashSet<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    if keys.is_empty() {
        return Err(ConfigError(format!(
            "--api-keys-file {} holds no key",
            path.display()
        )));
    }
    Ok(keys)
}

impl Gateway {
    /// Reads --api-keys-file again; true when the accepted keys changed. A file that
    /// cannot be read or holds no key leaves the served keys as they were.
    pub fn reload_api_keys(&self) -> Result<bool, ConfigError> {
        let (Some(path), Some(served)) = (&self.cfg.api_keys_file, &self.api_keys) else {
            return Ok(false);
        };
        let keys = load_api_keys(path)?;
        if **served.load() == keys {
            return Ok(false);
        }
        served.store(Arc::new(keys));
        Ok(true)
    }

    /// Builds the state over `registry` (which discovery, or the caller, feeds).
    pub fn new(cfg: GatewayConfig, registry: Arc<Registry>) -> Result<Arc<Self>, ConfigError> {
        cfg.validate()?;
        let api_keys = cfg
            .api_keys_file
            .as_deref()
            .map(load_api_keys)
            .transpose()?
            .map(ArcSwap::from_pointee);
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs_f64(cfg.connect_timeout_s))
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| ConfigError(format!("building the HTTP client: {e}")))?;
        let profile_client = build_profile_client()
            .map_err(|e| ConfigError(format!("building the HTTP client: {e}")))?;
        let scaler = Scaler::new(
            cfg.deployment.clone(),
            cfg.k8s_namespace.clone(),
            cfg.kubeconfig.clone(),
        );
        let drain_token = std::env::var(infera_proto::sidecar::DRAIN_TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty());
        let breakers = Arc::new(Breakers::new(cfg.breaker()));
        let admission = (cfg.max_concurrent_requests > 0).then(|| {
            Arc::new(Semaphore::new(
                cfg.max_concurrent_requests.min(Semaphore::MAX_PERMITS),
            ))
        });
        let metrics = Arc::new(Metrics::default());
        metrics.declare_inflight();
        let inflight = Arc::new(Inflight::default());
        let mut tokenizer = TokenizerState::Unused;
        let kv = if cfg.kv_aware() {
            tokenizer = match (
                &cfg.router_tokenizer_path,
                cfg.router_tokenizer_from_workers,
            ) {
                (Some(path), _) => match hub_repo_id(path) {
                    Some(repo) => TokenizerState::Pending {
                        reason: format!(
                            "fetching {repo}'s tokenizer from the Hugging Face Hub ({})",
                            cfg.hf_endpoint
                        ),
                    },
                    None => TokenizerState::Local {
                        source: path.display().to_string(),
                    },
                },
                (None, Some(_)) => TokenizerState::Pending {
                    reason: "waiting for a worker's sidecar to serve its tokenizer".into(),
                },
                (None, None) => TokenizerState::Local {
                    source: "bytes".into(),
                },
            };
            let codec = match &cfg.router_tokenizer_path {
                // Until the Hub's arrives, prompts match no engine's blocks.
                Some(path) if hub_repo_id(path).is_some() => PromptCodec::bytes(),
                Some(path) => match PromptCodec::load(path) {
                    Ok(codec) => codec,
                    Err(e @ PromptError::TiktokenOnly { .. }) => {
                        // The earlier server loaded these through transformers; here they
                        // are routed as bytes, and said so at start and on /infera/tokenizer.
                        tracing::warn!("--router-tokenizer-path: {e}; routing weighs load alone");
                        tokenizer = TokenizerState::Local {
                            source: format!("bytes ({} has no tokenizer.json)", path.display()),
                        };
                        PromptCodec::bytes()
                    }
                    Err(e) => return Err(ConfigError(format!("--router-tokenizer-path: {e}"))),
                },
                // Until the workers' arrives, prompts match no engine's blocks.
                None if cfg.router_tokenizer_from_workers.is_some() => PromptCodec::bytes(),
                None => {
                    tracing::warn!(
                        "kv-aware routing without --router-tokenizer-path tokenizes prompts as UTF-8 bytes \
                         (what infera-sim does without a tokenizer); give real engines' tokenizer folder"
                    );
                    PromptCodec::bytes()
                }
            };
            Some(KvRouter::new(
                Arc::new(codec),
                cfg.kv_overlap_weight,
                cfg.kv_approximate,
                metrics.clone(),
            ))
        } else {
            None
        };
        {
            let (b, m, i, k) = (
                breakers.clone(),
                metrics.clone(),
                inflight.clone(),
                kv.clone(),
            );
            registry.on_remove(move |worker| {
                b.remove(worker);
                m.remove_worker(worker);
                i.remove(worker);
                if let Some(k) = &k {
                    k.remove_worker(worker);
                }
            });
        }
        let flow = cfg.flow.flow_control.then(|| {
            Arc::new(FlowControl::new(
                cfg.flow.clone(),
                inflight.clone(),
                metrics.clone(),
            ))
        });
        Ok(Arc::new(Self {
            routing: Routing::new(
                cfg.policy(),
                [cfg.kv_prefill_overlap_weight, cfg.kv_decode_overlap_weight],
                kv.clone(),
                metrics.clone(),
            ),
            upstream: Upstream {
                client: client.clone(),
                breakers: breakers.clone(),
                metrics: metrics.clone(),
                inflight: inflight.clone(),
                request_timeout: Duration::from_secs_f64(cfg.request_timeout_s),
                idle_timeout: Duration::from_secs_f64(cfg.stream_idle_timeout_s),
                max_retries: cfg.request_max_retries,
                nats: Arc::default(),
                migration_limit: cfg.migration_limit,
            },
            kv,
            default_retention: cfg.default_retention.into(),
            cfg,
            registry,
            breakers,
            metrics,
            client,
            api_keys,
            inflight,
            draining: AtomicBool::new(false),
            flow,
            admission,
            tokenizer: Arc::new(TokenizerStatus::from_pointee(tokenizer)),
            profile_client,
            scaler,
            drain_token,
        }))
    }

    /// The tokenizer kv-aware routing encodes prompts with (the workers' once fetched);
    /// `None` when routing is not kv-aware.
    pub fn router_codec(&self) -> Option<Arc<PromptCodec>> {
        self.kv.as_ref().map(|kv| kv.codec())
    }

    /// The Prometheus exposition `/metrics` serves now.
    pub fn metrics_text(&self) -> String {
        let snap = self.registry.snapshot();
        let kv = self
            .kv
            .as_ref()
            .map(|k| k.gauges(snap.workers.values().map(|w| &**w)));
        self.metrics
            .render(&worker_gauges(&snap, &self.breakers), kv)
    }

    /// Client connections open now (the `infera_gateway_connections_open` gauge).
    pub fn open_connections(&self) -> usize {
        self.metrics
            .connections_open
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Where kv-aware routing's tokenizer stands, as `/infera/tokenizer` answers a caller
    /// with a key.
    pub fn tokenizer_state(&self) -> serde_json::Value {
        serde_json::to_value(&**self.tokenizer.load()).unwrap_or_default()
    }
}

/// What `/metrics` reads from the workers' side now: workers per mode, and each
/// breaker's state and trips.
pub(crate) fn worker_gauges(snapshot: &Snapshot, breakers: &Breakers) -> WorkerGauges {
    let now = std::time::Instant::now();
    WorkerGauges {
        by_mode: snapshot
            .count_by_mode()
            .iter()
            .map(|(mode, n)| (mode.as_str(), *n))
            .collect(),
        breakers: breakers
            .all()
            .iter()
            .map(|(w, b)| (w.clone(), i64::from(b.state(now).gauge()), b.trips()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn state_of(args: &[&str]) -> serde_json::Value {
        let mut all = vec!["infera-gateway", "--router-policy", "kv-aware"];
        all.extend_from_slice(args);
        let cfg = GatewayConfig::try_parse_from(all).unwrap();
        Gateway::new(cfg, Registry::new())
            .unwrap()
            .tokenizer_state()
    }

    #[test]
    fn earlier_tokenizer_paths_start_the_gateway_and_say_what_it_hashes() {
        let tiktoken = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompt/testdata/layouts/tiktoken"
        );
        let state = state_of(&["--router-tokenizer-path", tiktoken]);
        assert_eq!(state["state"], "local");
        assert!(state["source"].as_str().unwrap().starts_with("bytes ("));
        let state = state_of(&["--router-tokenizer-path", "fixture-org/fixture-model"]);
        assert_eq!(state["state"], "pending", "a model id is fetched: {state}");
        assert!(
            state["reason"]
                .as_str()
                .unwrap()
                .contains("fixture-org/fixture-model")
        );
        let jinja = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../prompt/testdata/layouts/jinja"
        );
        let cfg = GatewayConfig::try_parse_from([
            "g",
            "--router-policy",
            "kv-aware",
            "--router-tokenizer-path",
            jinja,
        ])
        .unwrap();
        let gw = Gateway::new(cfg, Registry::new()).unwrap();
        assert_eq!(
            gw.router_codec().unwrap().chat_template_names(),
            ["default"],
            "the folder's chat_template.jinja"
        );
    }
}
