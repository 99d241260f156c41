//! Why a deployment's pods are not running (pure): the scheduler's verdict and the
//! kubelet's waiting reasons, read from the pods' status and classified into a small
//! closed set, so the `Ready` condition and Events say what a user would otherwise dig
//! out of `kubectl describe pod`: `Insufficient amd.com/gpu`, an image that cannot be
//! pulled, an engine that keeps crashing.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// What keeps a pod from running, as the `Ready` condition's reason says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PodProblemKind {
    /// The scheduler found no node (resources, GPUs or RDMA devices, selectors, taints).
    Unschedulable,
    /// An image cannot be pulled (`ErrImagePull`, `ImagePullBackOff`, `InvalidImageName`).
    ImagePullBackOff,
    /// A container keeps exiting (`CrashLoopBackOff`).
    CrashLoopBackOff,
    /// A container cannot be created (`CreateContainerConfigError`: a missing Secret or
    /// ConfigMap key; `CreateContainerError`, `RunContainerError`).
    CreateContainerError,
}

impl PodProblemKind {
    /// The condition reason and Event reason.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Unschedulable => "Unschedulable",
            Self::ImagePullBackOff => "ImagePullBackOff",
            Self::CrashLoopBackOff => "CrashLoopBackOff",
            Self::CreateContainerError => "CreateContainerError",
        }
    }

    /// Every reason, for callers that must recognise one.
    pub const REASONS: [&'static str; 4] = [
        "Unschedulable",
        "ImagePullBackOff",
        "CrashLoopBackOff",
        "CreateContainerError",
    ];
}

/// One pod's problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProblem {
    /// The pod.
    pub pod: String,
    /// Its component (`engine`, `gateway`, `model-download`), from its labels.
    pub component: String,
    /// What keeps it from running.
    pub kind: PodProblemKind,
    /// The scheduler's or kubelet's message (container named where one is at fault).
    pub message: String,
}

impl PodProblem {
    /// `pod: message`, for condition messages.
    pub fn describe(&self) -> String {
        format!("pod {}: {}", self.pod, self.message)
    }
}

fn waiting_kind(reason: &str) -> Option<PodProblemKind> {
    match reason {
        "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull" => {
            Some(PodProblemKind::ImagePullBackOff)
        }
        "CrashLoopBackOff" => Some(PodProblemKind::CrashLoopBackOff),
        "CreateContainerConfigError" | "CreateContainerError" | "RunContainerError" => {
            Some(PodProblemKind::CreateContainerError)
        }
        _ => None,
    }
}

fn container_problem(status: &ContainerStatus) -> Option<(PodProblemKind, String)> {
    let waiting = status.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    let kind = waiting_kind(reason)?;
    let detail = waiting.message.as_deref().unwrap_or("");
    let mut message = format!("container {} {reason}", status.name);
    if !detail.is_empty() {
        message.push_str(": ");
        message.push_str(detail);
    }
    if kind == PodProblemKind::CrashLoopBackOff
        && let Some(code) = status
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code)
    {
        message.push_str(&format!(
            " (last exit code {code}, {} restarts)",
            status.restart_count
        ));
    }
    Some((kind, message))
}

/// The problems of `pods` (those not being deleted), at most one per pod: the
/// scheduler's verdict first, then the first container at fault (init containers,
/// including native sidecars, before the others). Sorted by kind, then pod name.
pub fn build_pod_problems(pods: &[Pod]) -> Vec<PodProblem> {
    let mut out: Vec<PodProblem> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let component = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/component"))
                .cloned()
                .unwrap_or_default();
            let status = pod.status.as_ref()?;
            let unschedulable = status.conditions.iter().flatten().find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            });
            let (kind, message) = match unschedulable {
                Some(c) => (
                    PodProblemKind::Unschedulable,
                    c.message.clone().unwrap_or_else(|| "no node fits".into()),
                ),
                None => status
                    .init_container_statuses
                    .iter()
                    .flatten()
                    .chain(status.container_statuses.iter().flatten())
                    .find_map(container_problem)?,
            };
            Some(PodProblem {
                pod: name,
                component,
                kind,
                message,
            })
        })
        .collect();
    out.sort_by(|a, b| (a.kind, &a.pod).cmp(&(b.kind, &b.pod)));
    out
}

/// The problems of one component (`engine`, `gateway`).
pub fn of_component<'a>(problems: &'a [PodProblem], component: &str) -> Vec<&'a PodProblem> {
    problems
        .iter()
        .filter(|p| p.component == component)
        .collect()
}

/// One line for a condition message: the first problem, and how many more pods have one.
pub fn summarize(problems: &[&PodProblem]) -> Option<String> {
    let first = problems.first()?;
    let more = problems.len() - 1;
    Some(if more == 0 {
        first.describe()
    } else {
        format!("{} (and {more} more pods)", first.describe())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn engine(name: &str, status: serde_json::Value) -> Pod {
        mk_pod(json!({
            "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "engine"}},
            "status": status,
        }))
    }

    #[test]
    fn reads_the_schedulers_verdict() {
        let pod = engine(
            "fixture-mixed-0",
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient amd.com/gpu."}]}),
        );
        let problems = build_pod_problems(&[pod]);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].kind.reason(), "Unschedulable");
        assert_eq!(
            problems[0].describe(),
            "pod fixture-mixed-0: 0/1 nodes are available: 1 Insufficient amd.com/gpu."
        );
        assert_eq!(problems[0].component, "engine");
    }

    #[test]
    fn reads_waiting_containers_sidecars_first() {
        let pod = engine(
            "fixture-mixed-1",
            json!({"phase": "Pending",
                "initContainerStatuses": [{"name": "sidecar", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"x\""}}}],
                "containerStatuses": [{"name": "engine", "ready": false, "restartCount": 3, "image": "i", "imageID": "",
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 2}}}]}),
        );
        let problems = build_pod_problems(&[pod]);
        assert_eq!(problems[0].kind, PodProblemKind::ImagePullBackOff);
        assert!(
            problems[0]
                .message
                .starts_with("container sidecar ImagePullBackOff: Back-off")
        );

        let crash = engine(
            "fixture-mixed-2",
            json!({"containerStatuses": [{"name": "engine", "ready": false, "restartCount": 3, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                "lastState": {"terminated": {"exitCode": 2}}}]}),
        );
        let problems = build_pod_problems(&[crash]);
        assert_eq!(
            problems[0].message,
            "container engine CrashLoopBackOff: back-off 40s (last exit code 2, 3 restarts)"
        );
    }

    #[test]
    fn ignores_healthy_starting_and_deleted_pods() {
        let starting = engine(
            "fixture-mixed-0",
            json!({"containerStatuses": [{"name": "engine", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
        );
        let mut deleted = engine(
            "fixture-mixed-1",
            json!({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}),
        );
        deleted.metadata.deletion_timestamp =
            Some(serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap());
        assert!(build_pod_problems(&[starting, deleted]).is_empty());
    }

    #[test]
    fn summarizes_the_first_and_counts_the_rest() {
        let pods: Vec<Pod> = (0..3)
            .map(|i| {
                engine(
                    &format!("fixture-mixed-{i}"),
                    json!({"conditions": [{"type": "PodScheduled", "status": "False",
                        "reason": "Unschedulable", "message": "no"}]}),
                )
            })
            .collect();
        let problems = build_pod_problems(&pods);
        let engines = of_component(&problems, "engine");
        assert_eq!(
            summarize(&engines).unwrap(),
            "pod fixture-mixed-0: no (and 2 more pods)"
        );
        assert!(of_component(&problems, "gateway").is_empty());
        assert_eq!(summarize(&[]), None);
    }
}
