//! Model provisioning (pure): where pods find the weights, and for a Hugging Face source
//! the cache PVC and the download Job that fills it. Workers are rendered at zero
//! replicas until the Job has succeeded, so no pod loads a half-downloaded model.

use super::engine::MODEL_MOUNT;
use super::pod::restricted_security;
use super::pull::{PodKind, apply_pull};
use super::{Child, Kind, child};
use crate::names;
use crate::plan::{ModelVolume, Plan};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec,
    SecurityContext, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// Downloads the repository into `$TARGET` (`snapshot_download` skips files already
/// there, so a retried Job resumes), installing `huggingface_hub` when the image lacks it.
const DOWNLOAD_SCRIPT: &str = r#"set -eu
python3 -c 'import huggingface_hub' 2>/dev/null || pip install --quiet --no-cache-dir --target /tmp/hf huggingface_hub
export PYTHONPATH="/tmp/hf:${PYTHONPATH:-}"
python3 - <<'PY'
import os
from huggingface_hub import snapshot_download
path = snapshot_download(repo_id=os.environ["HF_MODEL_ID"], revision=os.environ.get("HF_REVISION") or None, local_dir=os.environ["TARGET"])
print(f"downloaded {os.environ['HF_MODEL_ID']} into {path}")
PY"#;

/// The group of the downloader image's user (distroless `nonroot`).
const DOWNLOADER_GID: i64 = 65532;

/// The model folder inside a pod.
pub fn model_path(volume: &ModelVolume) -> String {
    match volume {
        ModelVolume::Claim { sub_path, .. } if !sub_path.is_empty() => {
            format!("{MODEL_MOUNT}/{}", sub_path.trim_matches('/'))
        }
        _ => MODEL_MOUNT.to_owned(),
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// The cache PVC and the download Job, for a Hugging Face source. The PVC carries the
/// instance labels but no owner: deleting the deployment keeps the downloaded weights.
/// Once the download is recorded as complete, the Job is no longer rendered (and so is
/// pruned).
/// With the model ready, the cache is complete: the PVC only, no Job.
pub fn build_model_download(plan: &Plan) -> Option<Vec<Child>> {
    let d = &plan.deployment;
    let hf = d.model.hugging_face.as_ref()?;
    let instance = plan.owner.name.as_str();
    let claim = names::model_cache(instance);
    let labels = names::instance_labels(instance, "model-cache");
    let pvc = PersistentVolumeClaim {
        metadata: plan.owner.meta(claim.clone(), labels),
        spec: Some(PersistentVolumeClaimSpec {
            // Every engine and gateway pod of the deployment mounts it, across nodes.
            access_modes: Some(vec!["ReadWriteMany".into()]),
            storage_class_name: hf.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), hf.cache_size.clone())])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut env = vec![
        env("HF_MODEL_ID", &hf.id),
        env("TARGET", &format!("{MODEL_MOUNT}/{}", hf.id)),
        env("HF_HOME", "/tmp/hf-home"),
        env("HF_HUB_DISABLE_TELEMETRY", "1"),
    ];
    if let Some(rev) = &hf.revision {
        env.push(self::env("HF_REVISION", rev));
    }
    if let Some(endpoint) = &hf.endpoint {
        env.push(self::env("HF_ENDPOINT", endpoint));
    }
    if let Some(secret) = &hf.token_secret_ref {
        env.push(super::pod::secret_env("HF_TOKEN", secret));
    }
    let (image, own_downloader) = match &d.engine.image {
        Some(image) if !d.launch.is_sim() => (image.clone(), false),
        _ => (plan.images.downloader.clone(), true),
    };
    let job_labels = names::instance_labels(instance, "model-download");
    let job = Job {
        metadata: plan
            .owner
            .meta(names::model_download(instance), job_labels.clone()),
        spec: Some(JobSpec {
            backoff_limit: Some(6),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(job_labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("OnFailure".into()),
                    // Infera's downloader runs as 65532: the volume's files are made its
                    // group's, so it can write them (engines, root, read them anyway);
                    // checked at the volume's root only, so a resumed download of
                    // hundreds of GB is not walked again. Vendor images run as root.
                    security_context: own_downloader.then(|| PodSecurityContext {
                        fs_group: Some(DOWNLOADER_GID),
                        fs_group_change_policy: Some("OnRootMismatch".into()),
                        ..Default::default()
                    }),
                    enable_service_links: Some(false),
                    containers: vec![Container {
                        name: "download".into(),
                        image: Some(image),
                        command: Some(vec!["/bin/sh".into(), "-c".into(), DOWNLOAD_SCRIPT.into()]),
                        env: Some(env),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "model".into(),
                            mount_path: MODEL_MOUNT.into(),
                            ..Default::default()
                        }]),
                        // Vendor engine images run as root: only privilege escalation
                        // and capabilities are taken away.
                        security_context: Some(SecurityContext {
                            read_only_root_filesystem: Some(false),
                            run_as_non_root: None,
                            ..restricted_security()
                        }),
                        ..Default::default()
                    }],
                    volumes: Some(vec![Volume {
                        name: "model".into(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: claim,
                            read_only: None,
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut job = job;
    if let Some(spec) = job.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        let infera: &[&str] = if own_downloader { &["download"] } else { &[] };
        apply_pull(spec, &plan.pull, PodKind::Platform, infera);
    }
    let mut out = vec![child(Kind::PersistentVolumeClaim, pvc, None)];
    if !plan.model_ready {
        out.push(child(Kind::Job, job, Some(&plan.owner.reference)));
    }
    Some(out)
}
