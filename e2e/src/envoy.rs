//! An Envoy gateway pod in front of an `InferencePool` the operator rendered, from
//! `testenv/envoy/node.yaml`: configured from the pool as a Gateway controller would
//! (its picker Service, failure mode, selector and target port), reached through a
//! NodePort on 127.0.0.1.

use crate::deploy::ROLLOUT;
use crate::gateway::Gateway;
use crate::{Cluster, E2eError, eventually, repo};
use serde_json::Value;

/// The running Envoy: its two listeners from this machine.
pub struct EnvoyGateway {
    /// `duplex`: FULL_DUPLEX_STREAMED, failing open or closed as the pool says.
    pub duplex: Gateway,
    /// `buffered`: BUFFERED, failing open or closed as the pool says.
    pub buffered: Gateway,
}

/// How the Envoy is made from the pool.
#[derive(Debug, Clone, Default)]
pub struct EnvoyOptions {
    /// Ask this picker Service instead of the pool's `endpointPickerRef` (one that does
    /// not exist: no picker answers).
    pub picker_service: Option<String>,
}

/// A YAML flow mapping of string pairs.
fn flow_mapping(labels: &serde_json::Map<String, Value>) -> String {
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}: \"{}\"", v.as_str().unwrap_or_default()))
        .collect();
    format!("{{{}}}", pairs.join(", "))
}

impl Cluster {
    /// Deploys Envoy `name` in `namespace` in front of InferencePool `pool`, waits until
    /// it is ready and its pool resolves, and returns its listeners.
    pub async fn envoy_for_pool(
        &self,
        namespace: &str,
        name: &str,
        pool: &str,
        options: &EnvoyOptions,
    ) -> Result<EnvoyGateway, E2eError> {
        let object = self
            .get_json(&["get", "inferencepool", pool, "-n", namespace])
            .await?;
        let spec = &object["spec"];
        let picker = &spec["endpointPickerRef"];
        let fail_open = picker["failureMode"] == "FailOpen";
        let labels = spec["selector"]["matchLabels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let port = spec["targetPorts"][0]["number"].as_u64().unwrap_or(0);
        let template =
            std::fs::read_to_string(repo().join("testenv/envoy/node.yaml")).map_err(|e| {
                E2eError::Local {
                    what: "reading testenv/envoy/node.yaml".into(),
                    message: e.to_string(),
                }
            })?;
        let picker_service = options
            .picker_service
            .clone()
            .unwrap_or_else(|| picker["name"].as_str().unwrap_or_default().to_owned());
        // The picker Service's selector; one matching nothing when it does not exist.
        let picker_selector = match self
            .get_json(&["get", "service", &picker_service, "-n", namespace])
            .await
        {
            Ok(svc) => flow_mapping(
                &svc["spec"]["selector"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            ),
            Err(_) => format!("{{app.kubernetes.io/name: \"{picker_service}\"}}"),
        };
        // The bootstrap's ConfigMap is named by its content: a changed one is a new
        // ConfigMap and so a new pod that reads it (an updated ConfigMap reaches a new
        // pod only once the kubelet's copy has caught up).
        let filled = template
            .replace("{fail_open}", if fail_open { "true" } else { "false" })
            .replace("{picker_service}", &picker_service)
            .replace("{picker_selector}", &picker_selector);
        let digest = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            filled.hash(&mut h);
            format!("{:08x}", h.finish() & 0xffff_ffff)
        };
        let manifest = filled
            .replace("{name}-bootstrap", &format!("{name}-bootstrap-{digest}"))
            .replace("{name}", name)
            .replace("{namespace}", namespace)
            .replace(
                "{pool_dns}",
                &format!("{name}-pool.{namespace}.svc.cluster.local"),
            )
            .replace("{target_port}", &port.to_string())
            .replace("{pool_selector}", &flow_mapping(&labels));
        self.apply(namespace, &manifest).await?;
        self.kubectl(&[
            "rollout",
            "status",
            "deployment",
            name,
            "-n",
            namespace,
            &format!("--timeout={}s", ROLLOUT.as_secs()),
        ])
        .await?;
        let service = self
            .get_json(&["get", "service", name, "-n", namespace])
            .await?;
        let node_port = |listener: &str| {
            service["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == listener)
                .and_then(|p| p["nodePort"].as_u64())
                .unwrap_or(0)
        };
        let envoy = EnvoyGateway {
            duplex: Gateway::new(format!("http://127.0.0.1:{}", node_port("duplex")))?,
            buffered: Gateway::new(format!("http://127.0.0.1:{}", node_port("buffered")))?,
        };
        // Ready once its pool cluster has resolved the pool's pods (its admin, on the
        // pod's address), and, with a picker, once a request goes through it.
        let selector = format!("app.kubernetes.io/name={name}");
        eventually(
            self,
            namespace,
            "Envoy's pool cluster resolved",
            ROLLOUT,
            || async {
                let pods = self
                    .pods(namespace, &selector)
                    .await
                    .map_err(|e| e.to_string())?;
                let ip = pods
                    .iter()
                    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                    .find(|p| {
                        p["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
                    .and_then(|p| p["status"]["podIP"].as_str())
                    .ok_or("no ready Envoy pod")?
                    .to_owned();
                let admin = Gateway::new(format!("http://{ip}:9901")).map_err(|e| e.to_string())?;
                let (_, clusters) = admin.get("/clusters").await.map_err(|e| e.to_string())?;
                if clusters
                    .lines()
                    .any(|l| l.starts_with("inference_pool::10."))
                {
                    Ok(())
                } else {
                    Err("no pool host yet".into())
                }
            },
        )
        .await?;
        // Its Service's NodePort routes to it (kube-proxy has caught up): both listeners
        // answer, whatever they answer without a picker.
        for (listener, gateway) in [("duplex", &envoy.duplex), ("buffered", &envoy.buffered)] {
            eventually(
                self,
                namespace,
                &format!("Envoy's {listener} listener on its NodePort"),
                ROLLOUT,
                || async {
                    gateway
                        .get("/v1/models")
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                },
            )
            .await?;
        }
        if options.picker_service.is_none() {
            eventually(
                self,
                namespace,
                "Envoy serving through the picker",
                ROLLOUT,
                || async {
                    match envoy.duplex.get("/v1/models").await {
                        Ok((200, _)) => Ok(()),
                        Ok((status, body)) => Err(format!("{status}: {body}")),
                        Err(e) => Err(e.to_string()),
                    }
                },
            )
            .await?;
        }
        Ok(envoy)
    }

    /// Each picker pod of `deployment`, reached on its HTTP port (`/metrics`,
    /// `/v1/workers`) at its pod address: the node is this machine.
    pub async fn pickers(
        &self,
        namespace: &str,
        deployment: &str,
    ) -> Result<Vec<(String, Gateway)>, E2eError> {
        let pods = self
            .pods(
                namespace,
                &format!(
                    "infera.amd.com/deployment={deployment},app.kubernetes.io/component=picker"
                ),
            )
            .await?;
        let mut out = Vec::new();
        for pod in pods {
            let ready = pod["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if let (true, Some(ip), Some(name)) = (
                ready && pod["metadata"]["deletionTimestamp"].is_null(),
                pod["status"]["podIP"].as_str(),
                pod["metadata"]["name"].as_str(),
            ) {
                out.push((name.to_owned(), Gateway::new(format!("http://{ip}:9090"))?));
            }
        }
        Ok(out)
    }
}
