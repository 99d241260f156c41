//! `infera convert`: manifests of the earlier Go operator's `InferaDeployment` (same
//! group, version and kind, another schema: `backendFramework`, `services`, ...) become
//! this project's `InferaDeployment` and, for prefill/decode services, the
//! `PDTopology` they imply. Documents in this project's schema, and other kinds, pass
//! through unchanged; a `kind: List` (`kubectl get idep -o yaml`) is read item by item.
//! What has no equivalent is reported on stderr (and at the top of the converted
//! document) with its path and what to do; `--strict` makes that an error.

pub mod command;
pub mod deployment;
pub mod engine_flags;
pub mod fields;
pub mod findings;
pub mod model;
pub mod pod;
pub mod server;
pub mod wiring;
pub mod worker;

use anyhow::{Context, Result};
use clap::Args;
use findings::{Finding, Severity};
use serde_json::Value;
use std::io::Read;
use std::path::PathBuf;

/// `infera convert` flags.
#[derive(Debug, Clone, Args)]
pub struct ConvertArgs {
    /// Manifest in the earlier schema (several documents, mixed with others), or `-`
    /// for standard input.
    pub file: String,
    /// Fail, writing nothing, when a field has no equivalent (warnings), not only when
    /// a deployment cannot be converted (errors).
    #[arg(long)]
    pub strict: bool,
    /// Write the result here instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// One input document's findings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentFinding {
    /// `InferaDeployment <name> (document <n>)`.
    pub document: String,
    /// The finding.
    pub finding: Finding,
}

/// The converted manifest.
#[derive(Debug, Clone, Default)]
pub struct Output {
    /// The documents, in input order (a deployment's `PDTopology` before it).
    pub documents: Vec<Value>,
    /// Comment lines to put above each document.
    pub comments: Vec<Vec<String>>,
    /// Every finding.
    pub findings: Vec<DocumentFinding>,
    /// Earlier deployments converted.
    pub converted: usize,
}

impl Output {
    /// The most severe finding.
    pub fn worst(&self) -> Option<Severity> {
        self.findings.iter().map(|f| f.finding.severity).max()
    }

    /// Multi-document YAML.
    pub fn to_yaml(&self) -> Result<String> {
        let mut out = String::new();
        for (i, (doc, comments)) in self.documents.iter().zip(&self.comments).enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            for line in comments {
                out.push_str("# ");
                out.push_str(line);
                out.push('\n');
            }
            let yaml = serde_saphyr::to_string(doc).context("writing YAML")?;
            out.push_str(&yaml);
            if !yaml.ends_with('\n') {
                out.push('\n');
            }
        }
        Ok(out)
    }
}

/// Whether an `infera.amd.com/v1alpha1` `InferaDeployment` is in the earlier schema.
pub fn is_earlier_schema(doc: &Value) -> bool {
    let earlier = [
        "services",
        "backendFramework",
        "discoveryBackend",
        "etcdEndpoint",
        "nats",
        "gaie",
        "envs",
        "image",
    ];
    doc.get("apiVersion").and_then(Value::as_str) == Some("infera.amd.com/v1alpha1")
        && doc.get("kind").and_then(Value::as_str) == Some("InferaDeployment")
        && doc.get("spec").and_then(Value::as_object).is_some_and(|s| {
            earlier.iter().any(|k| s.contains_key(*k)) || !s.contains_key("engine")
        })
}

/// Converts every document of `text` (from `origin`, for messages).
pub fn convert_text(text: &str, origin: &str) -> Result<Output> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).with_context(|| format!("{origin}: not valid YAML"))?;
    let mut out = Output::default();
    let mut items = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        if doc.is_null() {
            continue;
        }
        let list = doc
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k.ends_with("List"));
        match (list, doc.get("items")) {
            (true, Some(Value::Array(list_items))) => {
                items.extend(list_items.iter().cloned().map(|item| (i + 1, item)));
            }
            _ => items.push((i + 1, doc)),
        }
    }
    for (n, doc) in items {
        if !is_earlier_schema(&doc) {
            out.documents.push(doc);
            out.comments.push(Vec::new());
            continue;
        }
        let name = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("<no name>")
            .to_owned();
        let label = format!("InferaDeployment {name} (document {n})");
        let converted = deployment::convert_deployment(doc);
        out.converted += 1;
        let mut comments = vec![format!(
            "Converted by `infera convert` from the earlier InferaDeployment {name} ({origin}, document {n})."
        )];
        comments.extend(
            converted
                .findings
                .0
                .iter()
                .filter(|f| f.severity != Severity::Note)
                .map(|f| f.to_string()),
        );
        for (j, d) in converted.documents.into_iter().enumerate() {
            out.documents.push(d);
            out.comments
                .push(if j == 0 { comments.clone() } else { Vec::new() });
        }
        out.findings.extend(
            converted
                .findings
                .0
                .into_iter()
                .map(|finding| DocumentFinding {
                    document: label.clone(),
                    finding,
                }),
        );
    }
    Ok(out)
}

/// Runs `infera convert`; returns the exit code.
pub fn run(args: &ConvertArgs) -> Result<u8> {
    let (text, origin) = if args.file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading standard input")?;
        (s, "<stdin>".to_owned())
    } else {
        (
            std::fs::read_to_string(&args.file)
                .with_context(|| format!("reading {}", args.file))?,
            args.file.clone(),
        )
    };
    let out = convert_text(&text, &origin)?;
    for f in &out.findings {
        eprintln!("{}: {}", f.document, f.finding);
    }
    let count = |s: Severity| {
        out.findings
            .iter()
            .filter(|f| f.finding.severity == s)
            .count()
    };
    let (errors, warnings, notes) = (
        count(Severity::Error),
        count(Severity::Warning),
        count(Severity::Note),
    );
    let summary = format!(
        "{} earlier deployment(s) converted: {errors} error(s), {warnings} warning(s), {notes} note(s)",
        out.converted
    );
    if out.converted == 0 {
        eprintln!(
            "infera convert: {origin} holds no InferaDeployment in the earlier schema; written unchanged"
        );
    }
    if errors > 0 || (args.strict && warnings > 0) {
        let why = if errors > 0 {
            "errors"
        } else {
            "warnings, with --strict"
        };
        eprintln!("infera convert: {summary}; nothing written ({why})");
        return Ok(1);
    }
    let yaml = out.to_yaml()?;
    match &args.output {
        Some(path) => {
            std::fs::write(path, yaml).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{yaml}"),
    }
    eprintln!("infera convert: {summary}");
    Ok(0)
}
