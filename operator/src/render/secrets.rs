//! Secrets mounted into Infera's containers (pure), and the etcd client settings built
//! on them. Each is mounted whole (no `subPath`), so the kubelet updates the files in
//! place when the Secret changes, and the programs read them again.

use super::{Child, Kind, child};
use crate::api::{EtcdSpec, SecretKeyRef};
use crate::names;
use crate::plan::{Discovery, EtcdClientTls, Plan};
use k8s_openapi::api::core::v1::{KeyToPath, Secret, SecretVolumeSource, Volume, VolumeMount};

/// Volume `name` of Secret `secret` (only `items`, renamed, when given) at `dir`.
pub fn secret_volume(
    name: &str,
    secret: &str,
    items: Option<Vec<KeyToPath>>,
    dir: &str,
) -> (Volume, VolumeMount) {
    let volume = Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: name.into(),
        mount_path: dir.into(),
        read_only: Some(true),
        ..Default::default()
    };
    (volume, mount)
}

/// One key of a Secret, as the file `path` in its volume.
pub fn one_key(key: &SecretKeyRef, path: &str) -> Option<Vec<KeyToPath>> {
    Some(vec![KeyToPath {
        key: key.key.clone(),
        path: path.into(),
        ..Default::default()
    }])
}

const ETCD_TLS_DIR: &str = "/etc/infera/etcd-tls";
const ETCD_AUTH_DIR: &str = "/etc/infera/etcd-auth";

/// The etcd flags of the gateway and the sidecar: endpoints, prefix, TLS and auth.
pub fn etcd_client_args(etcd: &EtcdSpec) -> Vec<String> {
    let mut args = vec![
        "--etcd-endpoint".into(),
        etcd.endpoints.join(","),
        "--etcd-prefix".into(),
        etcd.prefix.clone(),
    ];
    if etcd.tls_secret_name.is_some() {
        for (flag, file) in [
            ("--etcd-ca-file", "ca.crt"),
            ("--etcd-cert-file", "tls.crt"),
            ("--etcd-key-file", "tls.key"),
        ] {
            args.extend([flag.into(), format!("{ETCD_TLS_DIR}/{file}")]);
        }
    }
    if let (Some(user), Some(_)) = (&etcd.user, &etcd.password_secret_ref) {
        args.extend(["--etcd-user".into(), user.clone()]);
        args.extend([
            "--etcd-password-file".into(),
            format!("{ETCD_AUTH_DIR}/password"),
        ]);
    }
    args
}

/// The Secrets the etcd flags name, for a deployment discovering through etcd.
pub fn etcd_secrets(discovery: &Discovery) -> Vec<(Volume, VolumeMount)> {
    match discovery {
        Discovery::Etcd(etcd) => etcd_client_volumes(etcd),
        Discovery::Kubernetes => Vec::new(),
    }
}

fn etcd_client_volumes(etcd: &EtcdSpec) -> Vec<(Volume, VolumeMount)> {
    let mut out = Vec::new();
    if let Some(secret) = &etcd.tls_secret_name {
        out.push(secret_volume("etcd-tls", secret, None, ETCD_TLS_DIR));
    }
    if let (Some(_), Some(password)) = (&etcd.user, &etcd.password_secret_ref) {
        let items = one_key(password, "password");
        out.push(secret_volume(
            "etcd-auth",
            &password.name,
            items,
            ETCD_AUTH_DIR,
        ));
    }
    out
}

/// The keys of a client certificate Secret the etcd flags read.
const TLS_KEYS: [&str; 3] = ["ca.crt", "tls.crt", "tls.key"];

/// The deployment's copy of the cluster etcd's client certificate (those keys of `data`),
/// owned by the deployment: its gateways and sidecars can only mount Secrets of their
/// own namespace. Re-applied on every reconcile, so a renewed certificate is copied.
pub fn build_etcd_client_copy(plan: &Plan, data: &EtcdClientTls) -> Child {
    let secret = Secret {
        metadata: plan.owner.meta(
            names::etcd_client_secret(&plan.owner.name),
            names::instance_labels(&plan.owner.name, "etcd-client"),
        ),
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            data.iter()
                .filter(|(k, _)| TLS_KEYS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        ..Default::default()
    };
    child(Kind::Secret, secret, Some(&plan.owner.reference))
}

/// The copies, in the deployment's namespace, of the operator's pull secrets (type and
/// data as the originals have them), owned by the deployment.
pub fn build_pull_secret_copies(plan: &Plan) -> Vec<Child> {
    plan.pull
        .copies
        .iter()
        .map(|(name, (type_, data))| {
            let secret = Secret {
                metadata: plan.owner.meta(
                    name.clone(),
                    names::instance_labels(&plan.owner.name, "pull-secret"),
                ),
                type_: Some(type_.clone()),
                data: Some(data.clone()),
                ..Default::default()
            };
            child(Kind::Secret, secret, Some(&plan.owner.reference))
        })
        .collect()
}
