//! A user's `podTemplate` overrides on a rendered pod template: merged by Kubernetes'
//! strategic-merge rules ([`super::strategic_merge`]), then read back as a
//! `PodTemplateSpec`, so a misspelt or mistyped field is refused with its path instead
//! of vanishing. Infera's own pod labels stay as rendered: selectors match on them.

use super::strategic_merge::merge_pod_template;
use crate::plan::{PodOverride, ValidateError};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

/// `template` with each of `overrides` merged on, in order.
pub fn apply_overrides(
    template: PodTemplateSpec,
    overrides: &[&PodOverride],
) -> Result<PodTemplateSpec, ValidateError> {
    if overrides.is_empty() {
        return Ok(template);
    }
    let own_labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let mut merged = serde_json::to_value(&template).map_err(|e| invalid("", e.to_string()))?;
    let mut typed = template;
    for o in overrides {
        merged = merge_pod_template(merged, &o.patch).map_err(|e| ValidateError::PodTemplate {
            field: format!("{}.{}", o.field, e.path),
            reason: e.reason,
        })?;
        typed = serde_path_to_error::deserialize(merged.clone())
            .map_err(|e| invalid(&o.field, format!("{} at {}", e.inner(), e.path())))?;
        let read_back =
            serde_json::to_value(&typed).map_err(|e| invalid(&o.field, e.to_string()))?;
        if let Some(path) = first_unknown(&merged, &read_back, "") {
            return Err(ValidateError::PodTemplate {
                field: format!("{}.{path}", o.field),
                reason: "no such field in a pod template (check its spelling and nesting: kubectl explain pod.spec)".into(),
            });
        }
        let labels = typed.metadata.as_ref().and_then(|m| m.labels.as_ref());
        if let Some((key, _)) = own_labels
            .iter()
            .find(|(k, v)| labels.and_then(|l| l.get(*k)) != Some(*v))
        {
            return Err(ValidateError::PodTemplate {
                field: format!("{}.metadata.labels.{key}", o.field),
                reason: "Infera's own label (selectors, discovery and network policies read it): leave it out".into(),
            });
        }
        merged = read_back;
    }
    Ok(typed)
}

fn invalid(field: &str, reason: String) -> ValidateError {
    ValidateError::PodTemplate {
        field: field.into(),
        reason,
    }
}

/// The first path of `merged` that reading it as a type dropped.
fn first_unknown(merged: &Value, read_back: &Value, path: &str) -> Option<String> {
    match (merged, read_back) {
        (Value::Object(m), Value::Object(r)) => m.iter().find_map(|(k, v)| {
            let here = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            match r.get(k) {
                None if !v.is_null() => Some(here),
                None => None,
                Some(rv) => first_unknown(v, rv, &here),
            }
        }),
        (Value::Array(m), Value::Array(r)) => m
            .iter()
            .zip(r)
            .enumerate()
            .find_map(|(i, (v, rv))| first_unknown(v, rv, &format!("{path}[{i}]"))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> PodTemplateSpec {
        serde_json::from_value(json!({
            "metadata": {"labels": {"app": "x"}},
            "spec": {"containers": [{"name": "engine", "image": "e:1"}]}
        }))
        .expect("template")
    }

    fn over(field: &str, patch: Value) -> PodOverride {
        PodOverride {
            field: field.into(),
            patch,
        }
    }

    #[test]
    fn overrides_apply_in_order() {
        let all = over(
            "spec.engine.podTemplate",
            json!({"metadata": {"labels": {"team": "a"}}}),
        );
        let role = over(
            "spec.engine.rolePodTemplates.prefill",
            json!({"metadata": {"labels": {"team": "b"}}, "spec": {"containers": [{"name": "engine", "image": "e:2"}]}}),
        );
        let out = apply_overrides(base(), &[&all, &role]).expect("applies");
        let labels = out.metadata.expect("meta").labels.expect("labels");
        assert_eq!(labels["team"], "b");
        assert_eq!(labels["app"], "x");
        assert_eq!(
            out.spec.expect("spec").containers[0].image.as_deref(),
            Some("e:2")
        );
    }

    #[test]
    fn misspelt_and_mistyped_fields_are_refused_with_their_path() {
        let typo = over(
            "spec.gateway.podTemplate",
            json!({"spec": {"containers": [{"name": "engine", "imagePullPolicyy": "Always"}]}}),
        );
        assert_eq!(
            apply_overrides(base(), &[&typo])
                .expect_err("refused")
                .to_string(),
            "spec.gateway.podTemplate.spec.containers[0].imagePullPolicyy: no such field in a pod template (check its spelling and nesting: kubectl explain pod.spec)"
        );
        let relabel = over(
            "spec.engine.podTemplate",
            json!({"metadata": {"labels": {"app": null}}}),
        );
        assert_eq!(
            apply_overrides(base(), &[&relabel])
                .expect_err("refused")
                .to_string(),
            "spec.engine.podTemplate.metadata.labels.app: Infera's own label (selectors, discovery and network policies read it): leave it out"
        );
        let wrong = over(
            "spec.engine.podTemplate",
            json!({"spec": {"terminationGracePeriodSeconds": "long"}}),
        );
        let e = apply_overrides(base(), &[&wrong])
            .expect_err("refused")
            .to_string();
        assert!(
            e.starts_with("spec.engine.podTemplate: invalid type"),
            "{e}"
        );
        assert!(e.contains("spec.terminationGracePeriodSeconds"), "{e}");
    }
}
