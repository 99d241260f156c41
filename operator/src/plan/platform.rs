//! What the operator was started with (its flags): Infera's images, and the etcd and
//! NATS the chart installed for deployments that name none of their own.

use crate::api::{DiscoveryBackend, InferaDeploymentSpec, PullPolicy};

/// Container images of the parts Infera ships.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    /// `infera-gateway`.
    pub gateway: String,
    /// `infera-engine-sidecar`.
    pub sidecar: String,
    /// `infera-sim` (engines of `kind: sim`).
    pub sim: String,
    /// `infera-kvd`.
    pub kvd: String,
    /// `infera-downloader`: runs the model download when the engine image is not a
    /// Python one (`sim`); `huggingface_hub` is baked in, nothing is installed at run time.
    pub downloader: String,
}

impl Images {
    /// `<registry>/infera-<part>:<tag>` for every part.
    pub fn from_registry(registry: &str, tag: &str) -> Self {
        let image = |part: &str| format!("{}/infera-{part}:{tag}", registry.trim_end_matches('/'));
        Self {
            gateway: image("gateway"),
            sidecar: image("engine-sidecar"),
            sim: image("sim"),
            kvd: image("kvd"),
            downloader: image("downloader"),
        }
    }
}

/// What the operator was configured with: Infera's images, and the etcd and NATS the
/// chart installed, which deployments use when they name none of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// Images of this operator's release.
    pub images: Images,
    /// Where Infera's images of other releases are (`--image-registry`): engines kept
    /// on an older release take its images from their own pods, or from here.
    pub registry: String,
    /// When the kubelet pulls Infera's images (`--image-pull-policy`); unset:
    /// Kubernetes' default.
    pub pull_policy: Option<PullPolicy>,
    /// Pull secrets in the operator's namespace (`--image-pull-secret`), copied into each
    /// deployment's namespace and named by every pod it renders.
    pub pull_secrets: Vec<String>,
    /// Client URLs of the cluster's etcd (`--default-etcd-endpoints`).
    pub etcd_endpoints: Vec<String>,
    /// URL of the cluster's NATS (`--default-nats-url`).
    pub nats_url: Option<String>,
    /// The Secret (`namespace`, `name`) with the CA and client certificate of the
    /// cluster's etcd when it requires TLS (`--default-etcd-client-secret`): copied into
    /// each deployment that uses that etcd.
    pub etcd_client_secret: Option<(String, String)>,
    /// Node directories under which a deployment's `kvCache.nvme.path` may lie
    /// (`--kv-cache-nvme-host-paths`): kvd runs as root in it.
    pub nvme_host_paths: Vec<String>,
    /// The operator's own namespace (`POD_NAMESPACE`): engine pods of autoscaled
    /// deployments admit its pods to their `/metrics`.
    pub operator_namespace: Option<String>,
}

/// Where NVMe tiers may lie unless the operator is told otherwise.
pub const DEFAULT_NVME_HOST_PATHS: [&str; 4] = ["/mnt", "/data", "/raid", "/var/lib/infera"];

impl Platform {
    /// Images only: no cluster etcd or NATS.
    pub fn with_images(images: Images) -> Self {
        Self {
            images,
            registry: "ghcr.io/infera".into(),
            pull_policy: None,
            pull_secrets: Vec::new(),
            etcd_endpoints: Vec::new(),
            nats_url: None,
            etcd_client_secret: None,
            nvme_host_paths: DEFAULT_NVME_HOST_PATHS.map(String::from).to_vec(),
            operator_namespace: None,
        }
    }

    /// Whether `spec` uses the cluster's etcd (etcd discovery naming no endpoints).
    pub fn uses_cluster_etcd(spec: &InferaDeploymentSpec) -> bool {
        spec.discovery.backend == DiscoveryBackend::Etcd && spec.discovery.etcd.is_none()
    }
}
