//! The `infera-operator` command line: where it reconciles, leader election, the
//! images of Infera's own parts it renders into deployments, and the platform's etcd,
//! NATS and node paths. Each flag has an `INFERA_*` environment variable.

use crate::api::PullPolicy;
use crate::plan::{DEFAULT_NVME_HOST_PATHS, Images};
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Reconciles InferaDeployment and PDTopology resources into engine StatefulSets (or
/// LeaderWorkerSets), gateways, Services, PodDisruptionBudgets and RBAC, and reports
/// Ready / Progressing / Degraded conditions.
#[derive(Debug, Parser)]
#[command(name = "infera-operator", version, about, long_about = None)]
pub struct OperatorArgs {
    /// Kubeconfig to use; unset: `KUBECONFIG`, `~/.kube/config`, then in-cluster.
    #[arg(long, env = "INFERA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Reconcile only this namespace; unset: every namespace.
    #[arg(long, env = "INFERA_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Deployments reconciled at once.
    #[arg(long, env = "INFERA_CONCURRENCY", default_value_t = 8)]
    pub concurrency: u16,
    /// Elect one active replica through a coordination.k8s.io Lease.
    #[arg(long, env = "INFERA_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the Lease; unset: POD_NAMESPACE, else `default`.
    #[arg(long, env = "INFERA_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Name of the Lease.
    #[arg(
        long,
        env = "INFERA_LEADER_ELECTION_ID",
        default_value = "infera-operator"
    )]
    pub leader_election_id: String,
    /// Seconds a Lease holds without renewal.
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(
        long,
        env = "INFERA_METRICS_BIND_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_bind_address: SocketAddr,
    /// Registry of Infera's images (`<registry>/infera-<part>:<tag>`).
    #[arg(long, env = "INFERA_IMAGE_REGISTRY", default_value = "ghcr.io/infera")]
    pub image_registry: String,
    /// Tag of Infera's images.
    #[arg(long, env = "INFERA_IMAGE_TAG", default_value = env!("CARGO_PKG_VERSION"))]
    pub image_tag: String,
    /// Gateway image (overrides registry and tag).
    #[arg(long, env = "INFERA_GATEWAY_IMAGE")]
    pub gateway_image: Option<String>,
    /// Engine sidecar image (overrides registry and tag).
    #[arg(long, env = "INFERA_SIDECAR_IMAGE")]
    pub sidecar_image: Option<String>,
    /// Simulator image for `engine.kind: sim` (overrides registry and tag).
    #[arg(long, env = "INFERA_SIM_IMAGE")]
    pub sim_image: Option<String>,
    /// kvd image (overrides registry and tag).
    #[arg(long, env = "INFERA_KVD_IMAGE")]
    pub kvd_image: Option<String>,
    /// Image of model download Jobs for simulated engines, with `huggingface_hub` baked
    /// in (vendor engine images download their own models; overrides registry and tag).
    #[arg(long, env = "INFERA_DOWNLOADER_IMAGE")]
    pub downloader_image: Option<String>,
    /// etcd client URLs (comma-separated) for deployments that choose etcd discovery
    /// without endpoints: the chart sets its bundled etcd here.
    #[arg(long, env = "INFERA_DEFAULT_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub default_etcd_endpoints: Vec<String>,
    /// `NAMESPACE/NAME` of the Secret holding the CA and a client certificate (`ca.crt`,
    /// `tls.crt`, `tls.key`) of that etcd, when it requires TLS: each deployment using it
    /// gets a copy in its own namespace. The chart sets the one it generates.
    #[arg(long, env = "INFERA_DEFAULT_ETCD_CLIENT_SECRET", value_parser = namespaced_name)]
    pub default_etcd_client_secret: Option<(String, String)>,
    /// NATS URL for deployments that choose NATS messaging without a URL: the chart sets
    /// its bundled NATS here.
    #[arg(long, env = "INFERA_DEFAULT_NATS_URL")]
    pub default_nats_url: Option<String>,
    /// Node directories under which `kvCache.nvme.path` may lie (comma-separated): kvd
    /// runs as root in that hostPath, so a deployment must not reach the node's system
    /// directories.
    #[arg(
        long,
        env = "INFERA_KV_CACHE_NVME_HOST_PATHS",
        value_delimiter = ',',
        default_values_t = DEFAULT_NVME_HOST_PATHS.map(String::from)
    )]
    pub kv_cache_nvme_host_paths: Vec<String>,
    /// When the kubelet pulls Infera's images in the pods the operator renders
    /// (gateways, downloads, and engines of release 0.2.0 on); unset: Kubernetes'
    /// default.
    #[arg(long, env = "INFERA_IMAGE_PULL_POLICY", value_enum)]
    pub image_pull_policy: Option<PullPolicyArg>,
    /// A Secret in the operator's namespace that pulls Infera's images (repeatable or
    /// comma-separated): copied into each deployment's namespace and named by every pod
    /// the operator renders there (engines from release 0.2.0 on).
    #[arg(long, env = "INFERA_IMAGE_PULL_SECRETS", value_delimiter = ',')]
    pub image_pull_secret: Vec<String>,
    /// Log lines as JSON.
    #[arg(long, env = "INFERA_LOG_JSON")]
    pub log_json: bool,
}

/// `--image-pull-policy` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PullPolicyArg {
    /// Every time a container starts.
    #[value(name = "Always")]
    Always,
    /// Only when the node does not have the image.
    #[value(name = "IfNotPresent")]
    IfNotPresent,
    /// Never: the image must be on the node.
    #[value(name = "Never")]
    Never,
}

impl From<PullPolicyArg> for PullPolicy {
    fn from(arg: PullPolicyArg) -> Self {
        match arg {
            PullPolicyArg::Always => Self::Always,
            PullPolicyArg::IfNotPresent => Self::IfNotPresent,
            PullPolicyArg::Never => Self::Never,
        }
    }
}

/// `NAMESPACE/NAME`.
fn namespaced_name(value: &str) -> Result<(String, String), String> {
    match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{value:?}: expected NAMESPACE/NAME")),
    }
}

impl OperatorArgs {
    /// The images named by the flags: the registry and tag, each overridden by its own flag.
    pub fn images(&self) -> Images {
        let cli = self;
        let mut images = Images::from_registry(&cli.image_registry, &cli.image_tag);
        let pick = |slot: &mut String, value: &Option<String>| {
            if let Some(v) = value {
                slot.clone_from(v);
            }
        };
        pick(&mut images.gateway, &cli.gateway_image);
        pick(&mut images.sidecar, &cli.sidecar_image);
        pick(&mut images.sim, &cli.sim_image);
        pick(&mut images.kvd, &cli.kvd_image);
        pick(&mut images.downloader, &cli.downloader_image);
        images
    }
}
