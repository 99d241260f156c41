//! Reading the signals off a deployment's pods: every running engine's `/metrics` and
//! every gateway's, over the pod network (no Prometheus needed). A pod that does not
//! answer within [`SCRAPE_TIMEOUT`] counts as unseen.

use super::signals::{EngineLoad, GatewayLatency, engine_load, gateway_latency};
use crate::names::{self, Role};
use crate::render::engine::ENGINE_PORT;
use infera_proto::discovery::ROLE_LABEL;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use std::time::Duration;

/// Longest wait for one pod's `/metrics`.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// A pod with an address.
struct Target {
    uid: String,
    role: Option<Role>,
    url: String,
}

fn role_of(pod: &Pod) -> Option<Role> {
    match pod.labels().get(ROLE_LABEL).map(String::as_str) {
        Some("prefill") => Some(Role::Prefill),
        Some("decode") => Some(Role::Decode),
        Some("mixed") => Some(Role::Mixed),
        _ => None,
    }
}

async fn targets(
    client: &Client,
    namespace: &str,
    selector: &str,
    scheme: &str,
) -> Result<Vec<Target>, kube::Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(selector))
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            (status.phase.as_deref() == Some("Running")).then_some(())?;
            let ip = status.pod_ip.as_deref()?;
            Some(Target {
                uid: p.uid().unwrap_or_default(),
                role: role_of(p),
                url: format!("{scheme}://{ip}:{ENGINE_PORT}/metrics"),
            })
        })
        .collect())
}

async fn get(http: &reqwest::Client, url: &str) -> Option<String> {
    let response = http.get(url).timeout(SCRAPE_TIMEOUT).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.text().await.ok()
}

/// Each running engine pod's role and load (none when it did not answer).
pub async fn engines(
    client: &Client,
    http: &reqwest::Client,
    namespace: &str,
    deployment: &str,
) -> Result<Vec<(Role, Option<EngineLoad>)>, kube::Error> {
    let selector = names::engine_selector_string(deployment);
    let targets = targets(client, namespace, &selector, "http").await?;
    let loads = futures::future::join_all(targets.iter().map(|t| async {
        let text = get(http, &t.url).await;
        (t.role.unwrap_or(Role::Mixed), text.map(|t| engine_load(&t)))
    }))
    .await;
    Ok(loads)
}

/// Each running gateway pod's uid and latency histograms (the ones that answered).
pub async fn gateways(
    client: &Client,
    http: &reqwest::Client,
    namespace: &str,
    deployment: &str,
    tls: bool,
) -> Result<Vec<(String, GatewayLatency)>, kube::Error> {
    let selector = names::gateway_selector(deployment)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let scheme = if tls { "https" } else { "http" };
    let targets = targets(client, namespace, &selector, scheme).await?;
    let seen = futures::future::join_all(targets.iter().map(|t| async {
        let text = get(http, &t.url).await?;
        Some((t.uid.clone(), gateway_latency(&text)))
    }))
    .await;
    Ok(seen.into_iter().flatten().collect())
}
