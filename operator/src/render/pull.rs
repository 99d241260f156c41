//! How a rendered pod pulls its images (pure): `imagePullSecrets` and each container's
//! `imagePullPolicy`, from the deployment's own settings (`spec.imagePullSecrets`,
//! `spec.imagePullPolicy`: every pod, every container) and the operator's (the chart's
//! `imagePullSecrets`, copied into the namespace, and `image.pullPolicy`: Infera's own
//! images). Engine pods get the operator's settings from release 0.2.0 on: their
//! 0.1.0 template had none, and keeping that template is what spares them a restart.

use crate::api::PlatformVersion;
use crate::plan::PullPlan;
use k8s_openapi::api::core::v1::{LocalObjectReference, PodSpec};

/// Which pod it is: the operator's settings reach engine pods from release 0.2.0 on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodKind {
    /// A gateway or the model download: always.
    Platform,
    /// An engine pod of this release.
    Engine(PlatformVersion),
}

/// Sets `spec`'s pull secrets and its containers' pull policies; `infera` names the
/// containers (init containers included) that run Infera's images.
pub fn apply_pull(spec: &mut PodSpec, pull: &PullPlan, kind: PodKind, infera: &[&str]) {
    let operator = match kind {
        PodKind::Platform => true,
        PodKind::Engine(release) => release.at_least(PlatformVersion::V0_2_0),
    };
    let mut secrets: Vec<String> = pull.secrets.clone();
    if operator {
        secrets.extend(pull.copies.iter().map(|(name, _)| name.clone()));
    }
    if !secrets.is_empty() {
        let mut refs = spec.image_pull_secrets.take().unwrap_or_default();
        refs.extend(
            secrets
                .into_iter()
                .map(|name| LocalObjectReference { name }),
        );
        spec.image_pull_secrets = Some(refs);
    }
    let platform_policy = pull.platform_policy.filter(|_| operator);
    let containers = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut());
    for c in containers {
        let policy = pull
            .policy
            .or(platform_policy.filter(|_| infera.contains(&c.name.as_str())));
        if let Some(p) = policy {
            c.image_pull_policy = Some(p.as_str().to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PullPolicy;
    use k8s_openapi::api::core::v1::Container;

    fn mk_spec() -> PodSpec {
        PodSpec {
            init_containers: Some(vec![Container {
                name: "sidecar".into(),
                ..Default::default()
            }]),
            containers: vec![Container {
                name: "engine".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn mk_pull(policy: Option<PullPolicy>) -> PullPlan {
        PullPlan {
            policy,
            platform_policy: Some(PullPolicy::Always),
            secrets: vec!["team-registry".into()],
            copies: vec![("app-pull-infera-registry".into(), Default::default())],
        }
    }

    fn secrets(spec: &PodSpec) -> Vec<String> {
        spec.image_pull_secrets
            .iter()
            .flatten()
            .map(|r| r.name.clone())
            .collect()
    }

    #[test]
    fn the_operators_settings_reach_infera_images_and_0_2_0_engines_only() {
        let mut spec = mk_spec();
        apply_pull(
            &mut spec,
            &mk_pull(None),
            PodKind::Engine(PlatformVersion::V0_2_0),
            &["sidecar"],
        );
        assert_eq!(
            secrets(&spec),
            ["team-registry", "app-pull-infera-registry"]
        );
        let init = spec.init_containers.as_ref().unwrap();
        assert_eq!(init[0].image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(spec.containers[0].image_pull_policy, None, "a vendor image");

        let mut spec = mk_spec();
        apply_pull(
            &mut spec,
            &mk_pull(None),
            PodKind::Engine(PlatformVersion::V0_1_0),
            &["sidecar"],
        );
        assert_eq!(
            secrets(&spec),
            ["team-registry"],
            "the deployment's own always"
        );
        assert_eq!(
            spec.init_containers.as_ref().unwrap()[0].image_pull_policy,
            None
        );
    }

    #[test]
    fn the_deployments_policy_covers_every_container() {
        let mut spec = mk_spec();
        apply_pull(
            &mut spec,
            &mk_pull(Some(PullPolicy::IfNotPresent)),
            PodKind::Platform,
            &["sidecar"],
        );
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
        assert_eq!(
            spec.init_containers.as_ref().unwrap()[0]
                .image_pull_policy
                .as_deref(),
            Some("IfNotPresent")
        );
        let mut spec = mk_spec();
        apply_pull(
            &mut spec,
            &PullPlan::default(),
            PodKind::Platform,
            &["sidecar"],
        );
        assert_eq!(spec, mk_spec(), "nothing set: nothing changes");
    }
}
