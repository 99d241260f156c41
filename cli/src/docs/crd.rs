//! The custom resources' reference: every field of `InferaDeployment` and `PDTopology`
//! from the CRDs the operator's Rust types generate, the schema `kubectl explain` reads.
//! One section per object, a row per field with its type, default, bounds and the doc
//! comment it has in the Rust type; the API server's CEL rules under the object they
//! check. Kubernetes' own types inside (affinity, tolerations, ...) are named, not
//! expanded: `kubectl explain` and the Kubernetes reference cover them.

use super::Page;
use super::markdown::{cell, code, table};
use anyhow::{Context, Result};
use infera_operator::api::crd::crds;
use serde_json::Value;

/// Fields whose schema is a Kubernetes type, by field name: shown, not expanded.
const KUBERNETES_TYPES: &[(&str, &str)] = &[
    ("affinity", "Affinity"),
    ("tolerations", "Toleration"),
    ("topologySpreadConstraints", "TopologySpreadConstraint"),
    ("env", "EnvVar"),
    ("resources", "ResourceRequirements"),
];

/// One page per CRD.
pub fn pages() -> Result<Vec<Page>> {
    crds()
        .into_iter()
        .map(|(file, crd)| {
            let crd = serde_json::to_value(&crd).context("serializing a CRD")?;
            let file = match file {
                "inferadeployments.yaml" => "inferadeployment.md",
                _ => "pdtopology.md",
            };
            Ok(Page {
                file,
                text: build_page(&crd),
            })
        })
        .collect()
}

/// The page of one CRD (pure).
pub fn build_page(crd: &Value) -> String {
    let spec = &crd["spec"];
    let kind = spec["names"]["kind"].as_str().unwrap_or_default();
    let group = spec["group"].as_str().unwrap_or_default();
    let mut out = format!("# {kind}\n\n");
    for version in spec["versions"].as_array().into_iter().flatten() {
        let name = version["name"].as_str().unwrap_or_default();
        let short: Vec<String> = spec["names"]["shortNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(code)
            .collect();
        out.push_str(&format!(
            "`apiVersion: {group}/{name}`, `kind: {kind}`, {} (short name{} {}). Every field \
             below is also `kubectl explain {}.<field>`.\n\n",
            spec["scope"]
                .as_str()
                .unwrap_or("Namespaced")
                .to_lowercase(),
            if short.len() == 1 { "" } else { "s" },
            short.join(", "),
            spec["names"]["singular"].as_str().unwrap_or_default(),
        ));
        if let Some(sub) = version.get("subresources") {
            let mut parts = Vec::new();
            if sub.get("status").is_some() {
                parts.push("`status`".to_owned());
            }
            if let Some(scale) = sub.get("scale") {
                parts.push(format!(
                    "`scale` (`{}` → `{}`, selector `{}`)",
                    scale["specReplicasPath"].as_str().unwrap_or_default(),
                    scale["statusReplicasPath"].as_str().unwrap_or_default(),
                    scale["labelSelectorPath"].as_str().unwrap_or_default(),
                ));
            }
            out.push_str(&format!("Subresources: {}.\n\n", parts.join(", ")));
        }
        let columns: Vec<Vec<String>> = version["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                vec![
                    code(c["name"].as_str().unwrap_or_default()),
                    code(c["jsonPath"].as_str().unwrap_or_default()),
                    cell(c["description"].as_str().unwrap_or_default()),
                ]
            })
            .collect();
        if !columns.is_empty() {
            out.push_str("`kubectl get` columns:\n\n");
            out.push_str(&table(&["column", "from", "meaning"], &columns));
            out.push('\n');
        }
        let schema = &version["schema"]["openAPIV3Schema"];
        for top in ["spec", "status"] {
            if let Some(node) = schema["properties"].get(top) {
                object_sections(&mut out, top, node);
            }
        }
    }
    out
}

/// A section for the object at `path` and, after it, one for each object field below.
fn object_sections(out: &mut String, path: &str, node: &Value) {
    let Some(props) = node["properties"].as_object() else {
        return;
    };
    out.push_str(&format!("## `{path}`\n\n"));
    if let Some(d) = node["description"].as_str() {
        out.push_str(&format!("{}\n\n", d.trim()));
    }
    let required: Vec<&str> = node["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let rows: Vec<Vec<String>> = props
        .iter()
        .map(|(name, field)| {
            let child = format!("{path}.{name}");
            let mut about = field["description"].as_str().unwrap_or_default().to_owned();
            let facts = facts(field, required.contains(&name.as_str()));
            if !facts.is_empty() {
                about = format!("{about} {}", facts.join(" "));
            }
            let name_cell = if expands(name, field) {
                format!(
                    "[{}](#{})",
                    code(name),
                    anchor(&display_path(&child, field))
                )
            } else {
                code(name)
            };
            vec![
                name_cell,
                type_of(name, field),
                default_of(field),
                cell(about.trim()),
            ]
        })
        .collect();
    out.push_str(&table(&["field", "type", "default", "description"], &rows));
    out.push('\n');
    let rules: Vec<Vec<String>> = node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            vec![
                code(r["rule"].as_str().unwrap_or_default()),
                cell(r["message"].as_str().unwrap_or_default()),
            ]
        })
        .collect();
    if !rules.is_empty() {
        out.push_str("Checked by the API server (CEL):\n\n");
        out.push_str(&table(&["rule", "message when it fails"], &rules));
        out.push('\n');
    }
    for (name, field) in props {
        if expands(name, field) {
            let child = display_path(&format!("{path}.{name}"), field);
            object_sections(out, &child, item_schema(field));
        }
    }
}

/// The object a field holds: itself, or its array's items.
fn item_schema(field: &Value) -> &Value {
    if field["type"] == "array" {
        &field["items"]
    } else {
        field
    }
}

/// A field's section heading path: `[]` after an array of objects.
fn display_path(path: &str, field: &Value) -> String {
    if field["type"] == "array" {
        format!("{path}[]")
    } else {
        path.to_owned()
    }
}

/// Whether a field gets a section of its own (an object of ours with fields).
fn expands(name: &str, field: &Value) -> bool {
    !KUBERNETES_TYPES.iter().any(|(n, _)| *n == name)
        && item_schema(field)["properties"].as_object().is_some()
}

/// mdBook's heading anchor for `` `path` ``: lowercase, punctuation other than `-` and
/// `_` dropped.
fn anchor(path: &str) -> String {
    path.chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
        .flat_map(char::to_lowercase)
        .collect()
}

fn type_of(name: &str, field: &Value) -> String {
    if let Some((_, k8s)) = KUBERNETES_TYPES.iter().find(|(n, _)| *n == name) {
        return if field["type"] == "array" {
            format!("list of Kubernetes `{k8s}`")
        } else {
            format!("Kubernetes `{k8s}`")
        };
    }
    if field["x-kubernetes-int-or-string"] == true {
        return "quantity (integer or string)".into();
    }
    if field["x-kubernetes-preserve-unknown-fields"] == true {
        return "object (free-form)".into();
    }
    match field["type"].as_str() {
        Some("array") => format!("list of {}", type_of("", &field["items"])),
        Some("object") if field.get("additionalProperties").is_some() => {
            format!("map of {}", type_of("", &field["additionalProperties"]))
        }
        Some(t) => t.to_owned(),
        None => "any".into(),
    }
}

fn default_of(field: &Value) -> String {
    match field.get("default") {
        None => String::new(),
        Some(Value::Object(m)) if m.is_empty() => "`{}`".into(),
        Some(v @ (Value::Object(_) | Value::Array(_))) => code(&v.to_string()),
        Some(Value::String(s)) => code(s),
        Some(v) => code(&v.to_string()),
    }
}

/// Required, enum values, bounds, pattern and format, as short sentences.
fn facts(field: &Value, required: bool) -> Vec<String> {
    let mut facts = Vec::new();
    if required {
        facts.push("Required.".to_owned());
    }
    let item = if field["type"] == "array" {
        &field["items"]
    } else {
        field
    };
    if let Some(values) = item["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .map(|v| code(v.as_str().map_or(&v.to_string(), |s| s)))
            .collect();
        facts.push(format!("One of {}.", values.join(", ")));
    }
    for (key, what) in [
        ("minimum", "at least"),
        ("maximum", "at most"),
        ("minLength", "at least this many characters:"),
        ("maxLength", "at most this many characters:"),
        ("maxItems", "at most this many items:"),
    ] {
        if let Some(v) = field.get(key) {
            facts.push(format!("{} {}.", capitalize(what), number(v)));
        }
    }
    if let Some(p) = field["pattern"].as_str() {
        facts.push(format!("Matches {}.", code(p)));
    }
    if field["nullable"] == true && !required {
        facts.push("Optional.".to_owned());
    }
    facts
}

/// A bound as written in the Rust type: `1024`, not the `1024.0` JSON may carry.
fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => v.to_string(),
    }
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_crd(spec: Value) -> Value {
        json!({"spec": {
            "group": "example.test", "scope": "Namespaced",
            "names": {"kind": "Fixture", "singular": "fixture", "shortNames": ["fx"]},
            "versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"properties": {"spec": spec}}}}]
        }})
    }

    #[test]
    fn objects_get_sections_and_fields_rows_with_their_facts() {
        let page = build_page(&mk_crd(json!({
            "type": "object", "required": ["size"],
            "x-kubernetes-validations": [{"rule": "self.size > 0", "message": "size must be positive"}],
            "properties": {
                "size": {"type": "integer", "minimum": 1, "description": "How many."},
                "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                "inner": {"type": "object", "nullable": true, "properties": {"x": {"type": "string"}}},
                "affinity": {"type": "object", "properties": {"nodeAffinity": {"type": "object", "properties": {}}}},
                "list": {"type": "array", "items": {"type": "object", "properties": {"y": {"type": "boolean"}}}},
            }
        })));
        assert!(page.contains("# Fixture"), "{page}");
        assert!(
            page.contains("| `size` | integer |  | How many. Required. At least 1. |"),
            "{page}"
        );
        assert!(
            page.contains("| `mode` | string | `a` | One of `a`, `b`. |"),
            "{page}"
        );
        assert!(
            page.contains("| [`inner`](#specinner) | object |  | Optional. |"),
            "{page}"
        );
        assert!(page.contains("## `spec.inner`"), "{page}");
        assert!(
            page.contains("| `affinity` | Kubernetes `Affinity` |"),
            "{page}"
        );
        assert!(
            !page.contains("nodeAffinity"),
            "Kubernetes types are not expanded: {page}"
        );
        assert!(page.contains("## `spec.list[]`"), "{page}");
        assert!(
            page.contains("| `self.size > 0` | size must be positive |"),
            "{page}"
        );
    }
}
