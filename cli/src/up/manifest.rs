//! Reading `InferaDeployment` and `PDTopology` manifests (multi-document YAML) into the
//! operator's API types, with errors that name the document and what is wrong.

use infera_operator::api::{InferaDeployment, PDTopology};
use serde_json::Value;

/// The resources of a manifest file.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    /// Deployments, in file order.
    pub deployments: Vec<InferaDeployment>,
    /// Topologies.
    pub topologies: Vec<PDTopology>,
}

/// Why a manifest cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ManifestError {
    /// Not YAML.
    #[error("{origin}: not valid YAML: {message}")]
    Yaml {
        /// File.
        origin: String,
        /// Parser message.
        message: String,
    },
    /// A document of the wrong shape.
    #[error("{origin}, document {index} ({what}): {message}")]
    Document {
        /// File.
        origin: String,
        /// 1-based document number.
        index: usize,
        /// Kind and name.
        what: String,
        /// What is wrong.
        message: String,
    },
    /// Nothing to run.
    #[error("{origin} holds no InferaDeployment")]
    Empty {
        /// File.
        origin: String,
    },
}

/// Parses every document of `text` (from `origin`, for messages).
pub fn parse_manifests(text: &str, origin: &str) -> Result<Manifests, ManifestError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| ManifestError::Yaml {
        origin: origin.to_owned(),
        message: e.to_string(),
    })?;
    let mut out = Manifests::default();
    for (i, doc) in docs.into_iter().enumerate() {
        if doc.is_null() {
            continue;
        }
        let kind = doc
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let name = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("<no name>")
            .to_owned();
        let fail = |message: String| ManifestError::Document {
            origin: origin.to_owned(),
            index: i + 1,
            what: format!("{kind} {name}"),
            message,
        };
        let api = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if api != "infera.amd.com/v1alpha1" {
            return Err(fail(format!(
                "apiVersion {api:?} is not infera.amd.com/v1alpha1"
            )));
        }
        if crate::convert::is_earlier_schema(&doc) {
            return Err(fail(format!(
                "written in the earlier Go operator's schema (services, backendFramework, ...): convert it first with `infera convert {origin}`"
            )));
        }
        match kind.as_str() {
            "InferaDeployment" => out
                .deployments
                .push(serde_json::from_value(doc).map_err(|e| fail(format!("spec: {e}")))?),
            "PDTopology" => out
                .topologies
                .push(serde_json::from_value(doc).map_err(|e| fail(format!("spec: {e}")))?),
            other => {
                return Err(fail(format!(
                    "kind {other:?} is not InferaDeployment or PDTopology"
                )));
            }
        }
    }
    if out.deployments.is_empty() {
        return Err(ManifestError::Empty {
            origin: origin.to_owned(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_examples_and_names_bad_documents() {
        let pd = include_str!("../../../examples/local-1p1d/deployment.yaml");
        let m = parse_manifests(pd, "pd.yaml").unwrap();
        assert_eq!((m.deployments.len(), m.topologies.len()), (1, 1));
        let bad = "apiVersion: infera.amd.com/v1alpha1\nkind: InferaDeployment\nmetadata: {name: x}\nspec:\n  model: {name: m, source: {}}\n  engine: {kind: tgi}\n";
        let err = parse_manifests(bad, "bad.yaml").unwrap_err().to_string();
        assert!(
            err.starts_with(
                "bad.yaml, document 1 (InferaDeployment x): spec: unknown variant `tgi`"
            ),
            "{err}"
        );
        let earlier = "apiVersion: infera.amd.com/v1alpha1\nkind: InferaDeployment\nmetadata: {name: old}\nspec:\n  services: {}\n";
        let err = parse_manifests(earlier, "old.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("convert it first with `infera convert old.yaml`"),
            "{err}"
        );
        let err = parse_manifests("kind: Pod\napiVersion: v1\n", "pod.yaml").unwrap_err();
        assert!(err.to_string().contains("is not infera.amd.com/v1alpha1"));
        assert_eq!(
            parse_manifests("", "e.yaml").unwrap_err(),
            ManifestError::Empty {
                origin: "e.yaml".into()
            }
        );
        assert!(matches!(
            parse_manifests("a: [", "y.yaml").unwrap_err(),
            ManifestError::Yaml { .. }
        ));
    }
}
