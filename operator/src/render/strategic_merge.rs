//! Kubernetes' strategic merge patch, for a pod template: what `kubectl patch` and the
//! API server do to a `PodTemplateSpec`, so a user's `podTemplate` override lands on the
//! rendered template exactly as it would on the object itself.
//!
//! Maps merge key by key (`null` deletes a key); lists that Kubernetes marks
//! `patchStrategy: merge` merge element by element on their merge key (containers by
//! `name`, env by `name`, volume mounts by `mountPath`, ...); every other list is
//! replaced. Directives: `$patch: replace|delete` on a map or a list element and
//! `$retainKeys`. The element order follows the API server's (patch elements new to the
//! list come before the unchanged elements after their predecessors). `$setElementOrder`
//! and `$deleteFromPrimitiveList` (which `kubectl` writes, not people) are refused.

use serde_json::{Map, Value};

/// A patch the merge cannot apply: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct PatchError {
    /// The patch path, e.g. `spec.containers[engine].env[0]`.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// Which object a map is, for the merge rules of its lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Template,
    Meta,
    PodSpec,
    Container,
    Other,
}

/// How a list merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListRule {
    Replace,
    MergeScalars,
    MergeBy(&'static str, Shape),
}

/// The shape of field `name` of a `shape` map, when it is a map.
fn map_shape(shape: Shape, name: &str) -> Shape {
    match (shape, name) {
        (Shape::Template, "metadata") => Shape::Meta,
        (Shape::Template, "spec") => Shape::PodSpec,
        _ => Shape::Other,
    }
}

/// How field `name` of a `shape` map merges, when it is a list (the `patchStrategy` and
/// `patchMergeKey` tags of Kubernetes' core/v1 and meta/v1 types).
fn list_rule(shape: Shape, name: &str) -> ListRule {
    use ListRule::{MergeBy, MergeScalars, Replace};
    match (shape, name) {
        (Shape::Meta, "finalizers") => MergeScalars,
        (Shape::Meta, "ownerReferences") => MergeBy("uid", Shape::Other),
        (Shape::PodSpec, "containers" | "initContainers" | "ephemeralContainers") => {
            MergeBy("name", Shape::Container)
        }
        (Shape::PodSpec, "volumes" | "imagePullSecrets" | "schedulingGates" | "resourceClaims") => {
            MergeBy("name", Shape::Other)
        }
        (Shape::PodSpec, "hostAliases") => MergeBy("ip", Shape::Other),
        (Shape::PodSpec, "topologySpreadConstraints") => MergeBy("topologyKey", Shape::Other),
        (Shape::Container, "env") => MergeBy("name", Shape::Other),
        (Shape::Container, "ports") => MergeBy("containerPort", Shape::Other),
        (Shape::Container, "volumeMounts") => MergeBy("mountPath", Shape::Other),
        (Shape::Container, "volumeDevices") => MergeBy("devicePath", Shape::Other),
        _ => Replace,
    }
}

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";

/// Applies `patch` to the pod template `original` (both as JSON).
pub fn merge_pod_template(original: Value, patch: &Value) -> Result<Value, PatchError> {
    merge_value(original, patch, Shape::Template, "")
}

fn err(path: &str, reason: impl Into<String>) -> PatchError {
    PatchError {
        path: if path.is_empty() {
            ".".into()
        } else {
            path.into()
        },
        reason: reason.into(),
    }
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.into()
    } else {
        format!("{path}.{key}")
    }
}

/// `patch` on `original` where the types agree, else `patch` itself (cleaned of
/// directives and nulls, as a merge onto nothing).
fn merge_value(
    original: Value,
    patch: &Value,
    shape: Shape,
    path: &str,
) -> Result<Value, PatchError> {
    match (original, patch) {
        (Value::Object(o), Value::Object(p)) => merge_map(o, p, shape, path).map(Value::Object),
        (_, Value::Object(p)) => merge_map(Map::new(), p, shape, path).map(Value::Object),
        (_, other) => Ok(other.clone()),
    }
}

fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    shape: Shape,
    path: &str,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(directive) = patch.get(DIRECTIVE) {
        return match directive.as_str() {
            Some("replace") => {
                let rest: Map<String, Value> = patch
                    .iter()
                    .filter(|(k, _)| k.as_str() != DIRECTIVE)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                merge_map(Map::new(), &rest, shape, path)
            }
            Some("delete") => Ok(Map::new()),
            _ => Err(err(
                path,
                format!("{DIRECTIVE}: {directive} is not a map directive (use replace or delete)"),
            )),
        };
    }
    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let keys: Option<Vec<&str>> = retain
            .as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect());
        let Some(keys) = keys else {
            return Err(err(
                &child_path(path, RETAIN_KEYS),
                "a list of the field names to keep",
            ));
        };
        if let Some(k) = patch
            .iter()
            .find(|(k, v)| !k.starts_with('$') && !v.is_null() && !keys.contains(&k.as_str()))
        {
            return Err(err(
                path,
                format!(
                    "{RETAIN_KEYS} must list every key the patch sets; it lacks {:?}",
                    k.0
                ),
            ));
        }
        original.retain(|k, _| keys.contains(&k.as_str()));
    }
    for (key, value) in patch {
        if key == RETAIN_KEYS {
            continue;
        }
        let here = child_path(path, key);
        if key.starts_with('$') {
            return Err(err(
                &here,
                "this patch directive is not supported in a podTemplate (only $patch and $retainKeys); write the list out instead",
            ));
        }
        if value.is_null() {
            original.shift_remove(key);
            continue;
        }
        let merged = match (original.shift_remove(key), value) {
            (Some(Value::Array(o)), Value::Array(p)) => {
                merge_list(o, p, list_rule(shape, key), &here)?
            }
            (_, Value::Array(p)) => merge_list(Vec::new(), p, list_rule(shape, key), &here)?,
            (o, p) => merge_value(o.unwrap_or(Value::Null), p, map_shape(shape, key), &here)?,
        };
        original.insert(key.clone(), merged);
    }
    Ok(original)
}

fn merge_list(
    original: Vec<Value>,
    patch: &[Value],
    rule: ListRule,
    path: &str,
) -> Result<Value, PatchError> {
    let merged = match rule {
        ListRule::Replace => patch
            .iter()
            .enumerate()
            .map(|(i, v)| merge_value(Value::Null, v, Shape::Other, &format!("{path}[{i}]")))
            .collect::<Result<Vec<_>, _>>()?,
        ListRule::MergeScalars => {
            let mut merged = original.clone();
            for v in patch {
                if !merged.contains(v) {
                    merged.push(v.clone());
                }
            }
            ordered(merged, patch, &original, |a, b| a == b)
        }
        ListRule::MergeBy(key, shape) => merge_keyed(original, patch, key, shape, path)?,
    };
    Ok(Value::Array(merged))
}

/// A list merged element by element on `key`.
fn merge_keyed(
    mut original: Vec<Value>,
    patch: &[Value],
    key: &str,
    shape: Shape,
    path: &str,
) -> Result<Vec<Value>, PatchError> {
    let mut plain = Vec::new();
    let mut replace = false;
    for (i, element) in patch.iter().enumerate() {
        let here = format!("{path}[{i}]");
        let Some(map) = element.as_object() else {
            return Err(err(
                &here,
                format!("expected an object with its merge key {key:?}"),
            ));
        };
        match map.get(DIRECTIVE).map(|d| d.as_str()) {
            None => plain.push(map),
            Some(Some("delete")) => {
                let Some(id) = map.get(key) else {
                    return Err(err(
                        &here,
                        format!("$patch: delete needs the merge key {key:?}"),
                    ));
                };
                original.retain(|o| o.get(key) != Some(id));
            }
            Some(Some("replace")) => replace = true,
            Some(_) => {
                return Err(err(
                    &here,
                    "a list element's $patch is delete (this element) or replace (the whole list)",
                ));
            }
        }
    }
    if replace {
        original = Vec::new();
    }
    let server_order = original.clone();
    let mut merged = original;
    for (i, element) in plain.iter().enumerate() {
        let here = format!("{path}[{i}]");
        let Some(id) = element.get(key) else {
            return Err(err(&here, format!("missing the merge key {key:?}")));
        };
        let labelled = format!("{path}[{}]", label(id));
        match merged.iter().position(|o| o.get(key) == Some(id)) {
            Some(at) => {
                let current = std::mem::take(&mut merged[at]);
                merged[at] = merge_value(
                    current,
                    &Value::Object((*element).clone()),
                    shape,
                    &labelled,
                )?;
            }
            None => merged.push(Value::Object(merge_map(
                Map::new(),
                element,
                shape,
                &labelled,
            )?)),
        }
    }
    let patch_order: Vec<Value> = plain.iter().map(|m| Value::Object((*m).clone())).collect();
    Ok(ordered(merged, &patch_order, &server_order, |a, b| {
        a.get(key).is_some() && a.get(key) == b.get(key)
    }))
}

fn label(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The API server's element order: the patch's elements in patch order, the others in
/// their original order, interleaved where both were in the original; an element new to
/// the list goes before the original elements not yet placed.
fn ordered(
    merged: Vec<Value>,
    patch: &[Value],
    server: &[Value],
    same: impl Fn(&Value, &Value) -> bool,
) -> Vec<Value> {
    let index = |list: &[Value], v: &Value| list.iter().position(|x| same(x, v));
    let (mut from_patch, mut server_only): (Vec<Value>, Vec<Value>) =
        merged.into_iter().partition(|v| index(patch, v).is_some());
    from_patch.sort_by_key(|v| index(patch, v));
    server_only.sort_by_key(|v| index(server, v));
    let mut out = Vec::with_capacity(from_patch.len() + server_only.len());
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        from_patch.into_iter().peekable(),
    );
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (index(server, l), index(server, r)),
                (Some(li), Some(ri)) if li < ri
            ),
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merge(original: Value, patch: Value) -> Value {
        merge_pod_template(original, &patch).expect("merges")
    }

    fn names(v: &Value) -> Vec<&str> {
        v.as_array()
            .expect("list")
            .iter()
            .map(|e| e["name"].as_str().expect("name"))
            .collect()
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let out = merge(
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
            json!({"metadata": {"labels": {"b": null, "c": "3"}, "annotations": {"x": "y"}}}),
        );
        assert_eq!(
            out,
            json!({"metadata": {"labels": {"a": "1", "c": "3"}, "annotations": {"x": "y"}}})
        );
    }

    #[test]
    fn containers_merge_by_name_and_env_by_name() {
        let out = merge(
            json!({"spec": {"containers": [
                {"name": "engine", "image": "e:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                {"name": "side", "image": "s:1"}
            ]}}),
            json!({"spec": {"containers": [
                {"name": "engine", "env": [{"name": "B", "value": "9"}, {"name": "C", "value": "3"}]}
            ]}}),
        );
        let engine = &out["spec"]["containers"][0];
        assert_eq!(engine["image"], "e:1");
        assert_eq!(
            engine["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "9"}, {"name": "C", "value": "3"}])
        );
        assert_eq!(names(&out["spec"]["containers"]), ["engine", "side"]);
    }

    #[test]
    fn new_elements_go_before_the_untouched_ones_after_them() {
        let original = json!({"spec": {"volumes": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
        let out = merge(
            original.clone(),
            json!({"spec": {"volumes": [{"name": "z"}]}}),
        );
        assert_eq!(names(&out["spec"]["volumes"]), ["z", "a", "b", "c"]);
        let out = merge(
            original,
            json!({"spec": {"volumes": [{"name": "b"}, {"name": "z"}]}}),
        );
        assert_eq!(names(&out["spec"]["volumes"]), ["a", "b", "z", "c"]);
    }

    #[test]
    fn unkeyed_lists_are_replaced() {
        let out = merge(
            json!({"spec": {"tolerations": [{"key": "a"}], "containers": [{"name": "e", "args": ["x", "y"]}]}}),
            json!({"spec": {"tolerations": [{"key": "b"}], "containers": [{"name": "e", "args": ["z"]}]}}),
        );
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "b"}]));
        assert_eq!(out["spec"]["containers"][0]["args"], json!(["z"]));
    }

    #[test]
    fn patch_directives_delete_and_replace() {
        let original = json!({"spec": {
            "volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}],
            "securityContext": {"runAsUser": 1, "fsGroup": 2}
        }});
        let out = merge(
            original.clone(),
            json!({"spec": {"volumes": [{"name": "a", "$patch": "delete"}], "securityContext": {"$patch": "replace", "runAsUser": 5}}}),
        );
        assert_eq!(names(&out["spec"]["volumes"]), ["b"]);
        assert_eq!(out["spec"]["securityContext"], json!({"runAsUser": 5}));
        let out = merge(
            original.clone(),
            json!({"spec": {"volumes": [{"$patch": "replace"}, {"name": "c", "emptyDir": {}}]}}),
        );
        assert_eq!(names(&out["spec"]["volumes"]), ["c"]);
        let out = merge(
            original,
            json!({"spec": {"volumes": [{"name": "a", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/x"}}]}}),
        );
        assert_eq!(
            out["spec"]["volumes"][0],
            json!({"name": "a", "hostPath": {"path": "/x"}})
        );
    }

    #[test]
    fn errors_name_the_path() {
        let bad = |patch: Value| {
            merge_pod_template(json!({"spec": {"containers": [{"name": "e"}]}}), &patch)
                .expect_err("refused")
        };
        assert_eq!(
            bad(json!({"spec": {"containers": [{"image": "x"}]}})).to_string(),
            "spec.containers[0]: missing the merge key \"name\""
        );
        assert!(
            bad(json!({"spec": {"$setElementOrder/containers": [{"name": "e"}]}}))
                .path
                .ends_with("$setElementOrder/containers")
        );
        assert_eq!(
            bad(json!({"spec": {"containers": [{"name": "e", "env": ["A=1"]}]}})).path,
            "spec.containers[e].env[0]"
        );
        assert!(
            bad(json!({"spec": {"$patch": "merge"}}))
                .reason
                .contains("replace or delete")
        );
    }

    #[test]
    fn finalizers_merge_as_a_set() {
        let out = merge(
            json!({"metadata": {"finalizers": ["a", "b"]}}),
            json!({"metadata": {"finalizers": ["c", "a"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["c", "a", "b"]));
    }
}
