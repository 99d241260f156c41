//! The API token of engine pods, mounted into the sidecar alone (pure): engine
//! containers run vendor images, often as root, and with the pod's default token they
//! could patch other pods' worker annotations. With Kubernetes discovery the sidecar
//! gets the same files the kubelet would mount (a bound, rotated token, the cluster CA,
//! the namespace) at the usual path, so its in-cluster client finds them unchanged.

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, KeyToPath,
    ObjectFieldSelector, ProjectedVolumeSource, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
};

const VOLUME: &str = "sidecar-token";
const DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The kubelet's own choice for the default token: an hour, and 7 s so it is told apart.
const EXPIRATION_SECONDS: i64 = 3607;

/// The projected volume: token, `ca.crt` and `namespace`.
pub fn volume() -> Volume {
    let token = VolumeProjection {
        service_account_token: Some(ServiceAccountTokenProjection {
            path: "token".into(),
            expiration_seconds: Some(EXPIRATION_SECONDS),
            ..Default::default()
        }),
        ..Default::default()
    };
    let ca = VolumeProjection {
        config_map: Some(ConfigMapProjection {
            name: "kube-root-ca.crt".into(),
            items: Some(vec![KeyToPath {
                key: "ca.crt".into(),
                path: "ca.crt".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let namespace = VolumeProjection {
        downward_api: Some(DownwardAPIProjection {
            items: Some(vec![DownwardAPIVolumeFile {
                path: "namespace".into(),
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.namespace".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
        }),
        ..Default::default()
    };
    Volume {
        name: VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![token, ca, namespace]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Its mount in the sidecar.
pub fn mount() -> VolumeMount {
    VolumeMount {
        name: VOLUME.into(),
        mount_path: DIR.into(),
        read_only: Some(true),
        ..Default::default()
    }
}
