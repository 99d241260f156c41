//! The chart's etcd as its clients reach it: HTTPS to a member's DNS name, with the client
//! certificate the chart generated (etcd runs with `--client-cert-auth`).

use crate::{Cluster, RELEASE_NAMESPACE};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use serde_json::{Value, json};
use std::time::Duration;

/// The chart's first etcd member.
pub const MEMBER: &str = "infera-etcd-0";

/// The Secret holding the client certificate and the CA.
pub const CLIENT_SECRET: &str = "infera-etcd-client-tls";

/// A way into the chart's etcd from this machine.
pub struct ChartEtcd {
    /// The member's pod IP.
    pub ip: String,
    /// `https://<member>.infera-etcd-peers.infera-system.svc:2379`, resolved to `ip`.
    pub url: String,
    host: String,
    ca: reqwest::Certificate,
    identity: reqwest::Identity,
}

impl ChartEtcd {
    /// Reads the client certificate and the member's address.
    pub async fn connect(cluster: &Cluster) -> Result<Self, String> {
        let secret = Api::<Secret>::namespaced(cluster.client(), RELEASE_NAMESPACE)
            .get(CLIENT_SECRET)
            .await
            .map_err(|e| format!("Secret {CLIENT_SECRET}: {e}"))?;
        let data = secret.data.unwrap_or_default();
        let file = |key: &str| {
            data.get(key)
                .map(|b| b.0.clone())
                .ok_or_else(|| format!("Secret {CLIENT_SECRET} has no {key}"))
        };
        let ca = reqwest::Certificate::from_pem(&file("ca.crt")?).map_err(|e| e.to_string())?;
        let mut pem = file("tls.crt")?;
        pem.extend(file("tls.key")?);
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| e.to_string())?;
        let pod = Api::<Pod>::namespaced(cluster.client(), RELEASE_NAMESPACE)
            .get(MEMBER)
            .await
            .map_err(|e| format!("pod {MEMBER}: {e}"))?;
        let ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .ok_or_else(|| format!("pod {MEMBER} has no IP"))?;
        let host = format!("{MEMBER}.infera-etcd-peers.{RELEASE_NAMESPACE}.svc");
        Ok(Self {
            url: format!("https://{host}:2379"),
            ip,
            host,
            ca,
            identity,
        })
    }

    fn builder(&self) -> Result<reqwest::ClientBuilder, String> {
        let addr = format!("{}:2379", self.ip)
            .parse()
            .map_err(|e| format!("{}: {e}", self.ip))?;
        Ok(reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .tls_built_in_root_certs(false)
            .add_root_certificate(self.ca.clone())
            .resolve(&self.host, addr))
    }

    /// A client presenting the chart's client certificate.
    pub fn client(&self) -> Result<reqwest::Client, String> {
        self.builder()?
            .identity(self.identity.clone())
            .build()
            .map_err(|e| e.to_string())
    }

    /// A client that trusts etcd's CA but presents no certificate.
    pub fn anonymous(&self) -> Result<reqwest::Client, String> {
        self.builder()?.build().map_err(|e| e.to_string())
    }

    /// The keys under `prefix`, over the v3 JSON API.
    pub async fn keys(&self, prefix: &str) -> Result<Vec<String>, String> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let body =
            json!({"key": b64.encode(prefix), "range_end": b64.encode(&end), "keys_only": true});
        let answer: Value = self
            .client()?
            .post(format!("{}/v3/kv/range", self.url))
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        Ok(answer["kvs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|kv| kv["key"].as_str())
            .filter_map(|k| b64.decode(k).ok())
            .map(|k| String::from_utf8_lossy(&k).into_owned())
            .collect())
    }
}
