//! Deployments as a user drives them with kubectl: apply a manifest, wait for `Ready`
//! from real readiness, find the pods, reach the gateway through a NodePort, and check
//! who wrote each workload's status.

use crate::gateway::{Answer, Gateway};
use crate::{Cluster, E2eError, STATUS_WRITERS, eventually};
use serde_json::{Value, json};
use std::time::Duration;

/// Pods start in seconds here (images are local); the bound covers a loaded 2-CPU node.
pub const ROLLOUT: Duration = Duration::from_secs(300);

/// The condition `kind` of an object's `status.conditions`.
pub fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

impl Cluster {
    /// Prefix affinity through `gateway`: asks `first`, then each of `then`, all after
    /// the same long system prompt to `model`, waiting before `then` until the gateway
    /// has applied KV events from the first request (from the engine pods). Returns the
    /// first answer and the later ones, in order.
    pub async fn shared_prefix_exchange(
        &self,
        namespace: &str,
        gateway: &Gateway,
        model: &str,
        first: &str,
        then: &[&str],
    ) -> Result<(Answer, Vec<Answer>), E2eError> {
        let applied = r#"infera_gateway_kv_events_total{outcome="applied"}"#;
        let system =
            "You are the reference librarian of a very large technical archive. ".repeat(24);
        let ask = |question: &str| {
            json!({"model": model, "max_tokens": 4, "messages": [
                {"role": "system", "content": system}, {"role": "user", "content": question}]})
        };
        let before = gateway.metric(applied).await?;
        let first = gateway.post("/v1/chat/completions", &ask(first)).await?;
        eventually(
            self,
            namespace,
            "KV events of the first request at the gateway",
            ROLLOUT,
            || async {
                let now = gateway.metric(applied).await.map_err(|e| e.to_string())?;
                if now > before {
                    Ok(())
                } else {
                    Err(format!("applied events {now}"))
                }
            },
        )
        .await?;
        let mut answers = Vec::new();
        for question in then {
            answers.push(gateway.post("/v1/chat/completions", &ask(question)).await?);
        }
        Ok((first, answers))
    }

    /// `kubectl ARGS -o json`, parsed.
    pub async fn get_json(&self, args: &[&str]) -> Result<Value, E2eError> {
        let mut full: Vec<&str> = args.to_vec();
        full.extend(["-o", "json"]);
        let text = self.kubectl(&full).await?;
        serde_json::from_str(&text).map_err(|e| E2eError::Decode {
            what: format!("kubectl {}", args.join(" ")),
            message: format!("{e}: {text}"),
        })
    }

    /// `kubectl apply -n NAMESPACE -f -` of `manifest`.
    pub async fn apply(&self, namespace: &str, manifest: &str) -> Result<(), E2eError> {
        self.kubectl_with_input(&["apply", "-n", namespace, "-f", "-"], Some(manifest))
            .await
            .map(|_| ())
    }

    /// Waits until the InferaDeployment's `Ready` condition is `True`; returns it.
    pub async fn wait_ready(&self, namespace: &str, name: &str) -> Result<Value, E2eError> {
        let what = format!("InferaDeployment {name} Ready");
        eventually(self, namespace, &what, ROLLOUT, || async {
            let idep = self
                .get_json(&["get", "idep", name, "-n", namespace])
                .await
                .map_err(|e| e.to_string())?;
            match condition(&idep, "Ready") {
                Some(c) if c["status"] == "True" => Ok(idep),
                Some(c) => Err(format!(
                    "Ready={} {}: {}",
                    c["status"], c["reason"], c["message"]
                )),
                None => Err("no Ready condition yet".into()),
            }
        })
        .await
    }

    /// The pods of `namespace` matching the label `selector`.
    pub async fn pods(&self, namespace: &str, selector: &str) -> Result<Vec<Value>, E2eError> {
        let list = self
            .get_json(&["get", "pods", "-n", namespace, "-l", selector])
            .await?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// The engine pods of a deployment (every role).
    pub async fn engine_pods(
        &self,
        namespace: &str,
        deployment: &str,
    ) -> Result<Vec<Value>, E2eError> {
        self.pods(
            namespace,
            &format!("infera.amd.com/deployment={deployment},app.kubernetes.io/component=engine"),
        )
        .await
    }

    /// Turns the deployment's gateway Service into a NodePort (through the custom
    /// resource, as a user would) and returns the gateway reached on 127.0.0.1 once it
    /// routes to `workers` workers.
    pub async fn gateway_on_node_port(
        &self,
        namespace: &str,
        deployment: &str,
        workers: usize,
    ) -> Result<Gateway, E2eError> {
        self.kubectl(&[
            "patch",
            "idep",
            deployment,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            r#"{"spec":{"gateway":{"service":{"type":"NodePort"}}}}"#,
        ])
        .await?;
        let service = format!("{deployment}-gateway");
        let port = eventually(
            self,
            namespace,
            "gateway Service NodePort",
            ROLLOUT,
            || async {
                let svc = self
                    .get_json(&["get", "service", &service, "-n", namespace])
                    .await
                    .map_err(|e| e.to_string())?;
                svc["spec"]["ports"][0]["nodePort"]
                    .as_u64()
                    .filter(|_| svc["spec"]["type"] == "NodePort")
                    .ok_or_else(|| format!("type {}", svc["spec"]["type"]))
            },
        )
        .await?;
        let gateway = Gateway::new(format!("http://127.0.0.1:{port}"))?;
        self.wait_active_workers(namespace, &gateway, workers)
            .await?;
        Ok(gateway)
    }

    /// Waits until the gateway lists exactly `workers` active workers.
    pub async fn wait_active_workers(
        &self,
        namespace: &str,
        gateway: &Gateway,
        workers: usize,
    ) -> Result<(), E2eError> {
        let what = format!("the gateway routing to {workers} workers");
        eventually(self, namespace, &what, ROLLOUT, || async {
            let active = gateway.active_workers().await.map_err(|e| e.to_string())?;
            if active.len() == workers {
                Ok(())
            } else {
                Err(format!("active workers {active:?}"))
            }
        })
        .await
    }

    /// Who holds the operator's Lease (`<pod>_<n>`; empty when nobody does).
    pub async fn operator_leader(&self) -> Result<String, E2eError> {
        let lease = self
            .get_json(&[
                "get",
                "lease",
                "infera-operator",
                "-n",
                crate::RELEASE_NAMESPACE,
            ])
            .await?;
        Ok(lease["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_owned())
    }

    /// Reconciles the leading operator has finished since it started, from its `/metrics` (reached at its
    /// pod's address: the tests run on the node).
    pub async fn operator_reconciles(&self) -> Result<f64, E2eError> {
        let leader = self.operator_leader().await?;
        let pod = leader.split('_').next().unwrap_or_default();
        let pod = self
            .get_json(&["get", "pod", pod, "-n", crate::RELEASE_NAMESPACE])
            .await?;
        let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
        let text = crate::http()
            .get(format!("http://{ip}:8080/metrics"))
            .send()
            .await
            .map_err(|e| E2eError::Http(format!("the operator's metrics: {e}")))?
            .text()
            .await
            .map_err(|e| E2eError::Http(e.to_string()))?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with("infera_operator_reconciles_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum())
    }

    /// Waits until a leader that took over has reconciled every InferaDeployment of the
    /// cluster at least once (a new leader lists them all when it starts, and its counter
    /// starts at 0): what it renders is then in place.
    pub async fn wait_leader_caught_up(&self, namespace: &str) -> Result<(), E2eError> {
        let deployments = self.get_json(&["get", "idep", "--all-namespaces"]).await?;
        let count = deployments["items"].as_array().map_or(0, Vec::len) as f64;
        let what = format!("the leader reconciling all {count} deployments");
        eventually(self, namespace, &what, ROLLOUT, || async {
            let done = self
                .operator_reconciles()
                .await
                .map_err(|e| e.to_string())?;
            if done >= count {
                Ok(())
            } else {
                Err(format!("{done} reconciles"))
            }
        })
        .await
    }

    /// `kubectl delete idep NAME`, waiting (bounded) until it is gone; its children go
    /// by garbage collection after that.
    pub async fn delete_deployment(&self, namespace: &str, name: &str) -> Result<(), E2eError> {
        self.kubectl(&[
            "delete",
            "idep",
            name,
            "-n",
            namespace,
            "--wait=true",
            "--timeout=120s",
        ])
        .await
        .map(|_| ())
    }

    /// Every `resource/object: manager` of `namespace` whose status was written by a
    /// field manager other than the controllers ([`STATUS_WRITERS`]).
    pub async fn foreign_status_writers(&self, namespace: &str) -> Result<Vec<String>, E2eError> {
        let mut out = Vec::new();
        for resource in [
            "statefulsets",
            "deployments",
            "pods",
            "inferadeployments",
            "persistentvolumeclaims",
            "jobs",
        ] {
            for (object, manager) in self.status_writers(resource, namespace).await? {
                if !STATUS_WRITERS.contains(&manager.as_str()) {
                    out.push(format!("{resource}/{object}: {manager}"));
                }
            }
        }
        Ok(out)
    }
}
