//! Where worker records live: the etcd key layout and lease timings, and the
//! Kubernetes Pod annotation and labels used when discovery runs without etcd.

use std::time::Duration;

/// Default etcd prefix under which workers register.
pub const DEFAULT_ETCD_PREFIX: &str = "/infera/workers/";

/// TTL of the lease a worker record is attached to.
pub const LEASE_TTL: Duration = Duration::from_secs(30);

/// How often the registering side refreshes its lease.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// Shortest wait before the gateway reconnects a broken etcd watch.
pub const WATCH_BACKOFF_MIN: Duration = Duration::from_secs(1);

/// Longest wait between etcd watch reconnects.
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Pod annotation holding the worker record JSON (Kubernetes discovery).
pub const WORKER_INFO_ANNOTATION: &str = "infera.amd.com/worker-info";

/// Label naming the `InferaDeployment` a Pod belongs to.
pub const DEPLOYMENT_LABEL: &str = "infera.amd.com/deployment";

/// Label naming a Pod's role (`mixed`, `prefill`, `decode`, `gateway`).
pub const ROLE_LABEL: &str = "infera.amd.com/role";

/// The etcd key of a worker: `<prefix><worker_id>`. A prefix without a trailing `/`
/// gets one, so `--etcd-prefix /infera/workers` and `/infera/workers/` agree.
pub fn build_worker_key(prefix: &str, worker_id: &str) -> String {
    format!("{}{worker_id}", normalize_prefix(prefix))
}

/// The prefix with exactly one trailing `/`.
pub fn normalize_prefix(prefix: &str) -> String {
    format!("{}/", prefix.trim_end_matches('/'))
}

/// The worker id of a key under `prefix`, or `None` for a key outside it.
pub fn worker_id_from_key<'k>(prefix: &str, key: &'k str) -> Option<&'k str> {
    let id = key.strip_prefix(normalize_prefix(prefix).as_str())?;
    (!id.is_empty()).then_some(id)
}

/// The label selector that lists a deployment's Pods.
pub fn build_deployment_selector(deployment: &str) -> String {
    format!("{DEPLOYMENT_LABEL}={deployment}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout() {
        assert_eq!(
            build_worker_key(DEFAULT_ETCD_PREFIX, "10.0.0.5:8000"),
            "/infera/workers/10.0.0.5:8000"
        );
        assert_eq!(
            build_worker_key("/infera/workers", "h:1"),
            "/infera/workers/h:1"
        );
        assert_eq!(
            worker_id_from_key("/infera/workers/", "/infera/workers/h:1"),
            Some("h:1")
        );
        assert_eq!(
            worker_id_from_key("/infera/workers/", "/infera/other/h:1"),
            None
        );
        assert_eq!(
            worker_id_from_key("/infera/workers/", "/infera/workers/"),
            None
        );
    }

    #[test]
    fn timings_and_names() {
        assert_eq!(LEASE_TTL.as_secs(), 30);
        assert_eq!(KEEPALIVE_INTERVAL.as_secs(), 10);
        assert_eq!(WORKER_INFO_ANNOTATION, "infera.amd.com/worker-info");
        assert_eq!(
            build_deployment_selector("chat"),
            "infera.amd.com/deployment=chat"
        );
    }
}
