//! Watching an engine rollout from outside, as a platform team would: the ready engine
//! pods of each role sampled twice a second (the lowest count is the figure that
//! matters), and which revision each worker ran (its pod's
//! `infera.amd.com/engine-revision`), so the answers' headers can be checked against it.

use crate::Cluster;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the sampler saw.
#[derive(Debug, Default, Clone)]
pub struct RollSamples {
    /// Lowest count of ready, not terminating engine pods per role.
    pub min_ready: BTreeMap<String, usize>,
    /// Each worker's revision (`<pod IP>:8000` -> the pod's label) over the run.
    pub revisions: BTreeMap<String, String>,
    /// Samples taken.
    pub samples: usize,
    /// Longest time between two samples.
    pub longest_gap: Duration,
}

/// The engine pods of a deployment sampled until [`RollSampler::stop`].
pub struct RollSampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<RollSamples>,
}

/// Ready, not terminating pods per role, and each pod's worker and revision.
fn read(pods: &[Value], into: &mut RollSamples) -> BTreeMap<String, usize> {
    let mut ready: BTreeMap<String, usize> = BTreeMap::new();
    for pod in pods {
        let role = pod["metadata"]["labels"]["infera.amd.com/role"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if let (Some(ip), Some(revision)) = (
            pod["status"]["podIP"].as_str(),
            pod["metadata"]["labels"]["infera.amd.com/engine-revision"].as_str(),
        ) {
            into.revisions
                .insert(format!("{ip}:8000"), revision.to_owned());
        }
        let is_ready = pod["metadata"]["deletionTimestamp"].is_null()
            && pod["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        *ready.entry(role).or_default() += usize::from(is_ready);
    }
    ready
}

impl RollSampler {
    /// Starts sampling `deployment`'s engine pods in `namespace`.
    pub fn start(cluster: &Cluster, namespace: &str, deployment: &str) -> Self {
        let (stop, stopped) = watch::channel(false);
        let (cluster, namespace, deployment) =
            (cluster.clone(), namespace.to_owned(), deployment.to_owned());
        let task = tokio::spawn(async move {
            let mut samples = RollSamples::default();
            let mut last = Instant::now();
            while !*stopped.borrow() {
                if let Ok(pods) = cluster.engine_pods(&namespace, &deployment).await {
                    let ready = read(&pods, &mut samples);
                    for (role, n) in ready {
                        let low = samples.min_ready.entry(role).or_insert(n);
                        *low = (*low).min(n);
                    }
                    samples.samples += 1;
                    samples.longest_gap = samples.longest_gap.max(last.elapsed());
                    last = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            samples
        });
        Self { stop, task }
    }

    /// Stops sampling and returns what was seen.
    pub async fn stop(self) -> RollSamples {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_ready_pods_per_role_and_remembers_revisions() {
        let pods = [
            json!({"metadata": {"labels": {"infera.amd.com/role": "decode",
                    "infera.amd.com/engine-revision": "r1"}},
                   "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}),
            json!({"metadata": {"labels": {"infera.amd.com/role": "decode",
                    "infera.amd.com/engine-revision": "r2"}, "deletionTimestamp": "2026-01-01T00:00:00Z"},
                   "status": {"podIP": "10.0.0.2", "conditions": [{"type": "Ready", "status": "True"}]}}),
            json!({"metadata": {"labels": {"infera.amd.com/role": "prefill"}},
                   "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        ];
        let mut samples = RollSamples::default();
        let ready = read(&pods, &mut samples);
        assert_eq!(ready["decode"], 1, "a terminating pod is not capacity");
        assert_eq!(ready["prefill"], 0);
        assert_eq!(samples.revisions["10.0.0.2:8000"], "r2");
    }
}
