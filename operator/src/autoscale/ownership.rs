//! Who holds the workers' count the autoscaler writes (pure), read off a deployment's
//! `metadata.managedFields`, and the server-side apply configuration the autoscaler
//! writes it with.
//!
//! The autoscaler applies `spec.replicas` (mixed) or `spec.serving.roleReplicas`
//! (disaggregated) under its own field manager, so the field has an owner besides
//! whoever set it first: a GitOps tool that drops `spec.replicas` from its manifests
//! once the autoscaler runs leaves the count where it is (the field is still owned), not
//! at the schema's default. Another manager that *applies* a different count over the
//! autoscaler's (a GitOps tool whose manifests still carry the field) takes the field
//! from it and undoes the change on every sync; the autoscaler sees the field held by
//! that manager and no longer by itself, and says so in `status.autoscaling` rather
//! than fight quietly. (Co-owning at the same value is no fight: an applier that agrees
//! with the count, or that skips no-op applies as Flux does, keeps its claim harmlessly.)

use super::FIELD_MANAGER;
use crate::api::ServingMode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::{Value, json};

/// The field the autoscaler holds for a serving mode, as `managedFields` spells its path.
pub fn held_path(mode: &ServingMode) -> &'static [&'static str] {
    match mode {
        ServingMode::Mixed => &["f:spec", "f:replicas"],
        ServingMode::Disaggregated => &["f:spec", "f:serving", "f:roleReplicas"],
    }
}

/// The field's name for users.
pub fn held_name(mode: &ServingMode) -> &'static str {
    match mode {
        ServingMode::Mixed => "spec.replicas",
        ServingMode::Disaggregated => "spec.serving.roleReplicas",
    }
}

fn owns(entry: &ManagedFieldsEntry, path: &[&str]) -> bool {
    let Some(fields) = &entry.fields_v1 else {
        return false;
    };
    let mut at = &fields.0;
    for step in path {
        match at.get(step) {
            Some(next) => at = next,
            None => return false,
        }
    }
    true
}

/// The managers other than the autoscaler whose applied configuration holds `path`
/// (operation `Apply`): each undoes the autoscaler's changes when it applies again.
pub fn other_appliers(entries: &[ManagedFieldsEntry], path: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = entries
        .iter()
        .filter(|e| e.operation.as_deref() == Some("Apply"))
        .filter_map(|e| {
            e.manager
                .clone()
                .filter(|m| m != FIELD_MANAGER)
                .filter(|_| owns(e, path))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether the autoscaler's own applied configuration holds `path`.
pub fn held_by_autoscaler(entries: &[ManagedFieldsEntry], path: &[&str]) -> bool {
    entries.iter().any(|e| {
        e.operation.as_deref() == Some("Apply")
            && e.manager.as_deref() == Some(FIELD_MANAGER)
            && owns(e, path)
    })
}

/// The managers that took the count back from the autoscaler: it held the field after
/// its last look (`held_before`), and now another manager's applied configuration holds
/// it while its own does not (an apply of a different value, forced). Empty otherwise.
pub fn undone_by(entries: &[ManagedFieldsEntry], path: &[&str], held_before: bool) -> Vec<String> {
    if !held_before || held_by_autoscaler(entries, path) {
        return Vec::new();
    }
    other_appliers(entries, path)
}

/// The server-side apply configuration holding the workers: `counts` is the mixed
/// count, or prefill and decode. `None` holds nothing (a disaggregated deployment whose
/// autoscaler stood down: the HPA counts topology units in `spec.replicas`, and
/// `roleReplicas` would override them).
pub fn build_apply(
    api_version: &str,
    kind: &str,
    name: &str,
    mode: &ServingMode,
    counts: Option<(u32, u32)>,
) -> Value {
    let spec = match (mode, counts) {
        (ServingMode::Mixed, Some((n, _))) => json!({"replicas": n}),
        (ServingMode::Disaggregated, Some((prefill, decode))) => {
            json!({"serving": {"roleReplicas": {"prefill": prefill, "decode": decode}}})
        }
        (_, None) => json!({}),
    };
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;

    fn mk_entry(manager: &str, operation: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    #[test]
    fn appliers_of_the_count_are_told_apart_from_updaters_and_other_fields() {
        let entries = vec![
            mk_entry(
                "kustomize-controller",
                "Apply",
                json!({"f:spec": {"f:replicas": {}, "f:model": {}}}),
            ),
            // A merge patch (kubectl scale, an HPA through /scale) is an Update: it does
            // not re-apply anything.
            mk_entry(
                "kubectl-scale",
                "Update",
                json!({"f:spec": {"f:replicas": {}}}),
            ),
            mk_entry(
                "argocd-controller",
                "Apply",
                json!({"f:spec": {"f:model": {}}}),
            ),
            mk_entry(
                FIELD_MANAGER,
                "Apply",
                json!({"f:spec": {"f:replicas": {}}}),
            ),
        ];
        let path = held_path(&ServingMode::Mixed);
        assert_eq!(
            other_appliers(&entries, path),
            vec!["kustomize-controller".to_owned()]
        );
        assert!(held_by_autoscaler(&entries, path));
        let path = held_path(&ServingMode::Disaggregated);
        assert!(other_appliers(&entries, path).is_empty());
        assert!(!held_by_autoscaler(&entries, path));
    }

    #[test]
    fn the_count_is_undone_only_by_an_apply_that_took_it_from_the_autoscaler() {
        let path = held_path(&ServingMode::Mixed);
        let shared = vec![
            mk_entry(
                "kustomize-controller",
                "Apply",
                json!({"f:spec": {"f:replicas": {}}}),
            ),
            mk_entry(
                FIELD_MANAGER,
                "Apply",
                json!({"f:spec": {"f:replicas": {}}}),
            ),
        ];
        // Co-owned at one value: no fight, whatever happened before.
        assert!(undone_by(&shared, path, true).is_empty());
        let taken = vec![
            mk_entry(
                "kustomize-controller",
                "Apply",
                json!({"f:spec": {"f:replicas": {}}}),
            ),
            mk_entry(FIELD_MANAGER, "Apply", json!({"f:spec": {}})),
        ];
        assert_eq!(
            undone_by(&taken, path, true),
            vec!["kustomize-controller".to_owned()]
        );
        // The autoscaler never held it (it is about to take it): nothing undone.
        assert!(undone_by(&taken, path, false).is_empty());
        // An HPA or `kubectl scale` writes /scale (an update): not an applier.
        let scaled = vec![mk_entry(
            "kubectl-scale",
            "Update",
            json!({"f:spec": {"f:replicas": {}}}),
        )];
        assert!(undone_by(&scaled, path, true).is_empty());
    }

    #[test]
    fn the_apply_holds_the_mode_s_count_or_nothing() {
        assert_eq!(
            build_apply(
                "infera.amd.com/v1alpha1",
                "InferaDeployment",
                "m",
                &ServingMode::Mixed,
                Some((3, 0))
            ),
            json!({"apiVersion": "infera.amd.com/v1alpha1", "kind": "InferaDeployment",
                   "metadata": {"name": "m"}, "spec": {"replicas": 3}})
        );
        assert_eq!(
            build_apply("v", "K", "m", &ServingMode::Disaggregated, Some((2, 1)))["spec"],
            json!({"serving": {"roleReplicas": {"prefill": 2, "decode": 1}}})
        );
        assert_eq!(
            build_apply("v", "K", "m", &ServingMode::Disaggregated, None)["spec"],
            json!({})
        );
    }
}
