//! `infera convert` as users run it: the earlier-schema examples convert to the
//! checked-in results (which `infera up --sim` plans), every field of the earlier CRD's
//! schema is either carried over or reported, and the command's exit codes, `--strict`,
//! lists and pass-through behave as documented.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera::convert::convert_text;
use infera::convert::findings::Severity;
use serde_json::{Map, Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_infera");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `examples/migrate/earlier-<name>.yaml` and its converted file.
fn examples() -> Vec<(PathBuf, PathBuf)> {
    let dir = root().join("examples/migrate");
    let mut out: Vec<(PathBuf, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let name = path
                .file_name()?
                .to_str()?
                .strip_prefix("earlier-")?
                .to_owned();
            Some((path.clone(), dir.join("converted").join(name)))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_examples_convert_to_the_checked_in_results_which_infera_up_plans() {
    let examples = examples();
    assert_eq!(examples.len(), 5, "{examples:?}");
    for (earlier, converted) in examples {
        let origin = format!(
            "examples/migrate/{}",
            earlier.file_name().unwrap().to_str().unwrap()
        );
        let out = convert_text(&std::fs::read_to_string(&earlier).unwrap(), &origin).unwrap();
        assert_ne!(
            out.worst(),
            Some(Severity::Error),
            "{origin}: {:?}",
            out.findings
        );
        let yaml = out.to_yaml().unwrap();
        if std::env::var_os("INFERA_UPDATE_SNAPSHOTS").is_some() {
            std::fs::write(&converted, &yaml).unwrap();
        }
        let expected = std::fs::read_to_string(&converted).unwrap_or_default();
        assert_eq!(
            yaml,
            expected,
            "{origin} converts differently; INFERA_UPDATE_SNAPSHOTS=1 rewrites {}",
            converted.display()
        );
        let manifests = infera::up::manifest::parse_manifests(&yaml, &origin).unwrap();
        let opts = infera::up::plan::PlanOptions {
            sim: true,
            port: None,
            etcd: false,
        };
        infera::up::plan::plan(&manifests, &opts, &|_| false)
            .unwrap_or_else(|e| panic!("{origin}: infera up --sim refuses it: {e}"));
    }
}

#[test]
fn infera_up_sim_serves_every_converted_example() {
    for (_, converted) in examples() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let out = Command::new(BIN)
            .args(["up", "--sim", "--check", "--port", &port.to_string()])
            .arg(&converted)
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success(),
            "{}: {stdout}\n{stderr}",
            converted.display()
        );
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&std::fs::read_to_string(&converted).unwrap()).unwrap();
        let model = docs
            .iter()
            .find(|d| d["kind"] == "InferaDeployment")
            .unwrap()["spec"]["model"]["name"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(stdout.contains(&format!("models: {model}")), "{stdout}");
    }
}

/// One leaf of the earlier CRD's schema: its path (`spec.services.<svc>.args[0]`) and
/// the schema node.
fn leaves(schema: &Value, path: &str, out: &mut Vec<(String, Value)>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, s) in props {
            leaves(s, &format!("{path}.{k}"), out);
        }
        return;
    }
    if let Some(items) = schema.get("items") {
        leaves(items, &format!("{path}[0]"), out);
        return;
    }
    if let Some(add) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        let key = if path.ends_with(".services") {
            "SERVICE"
        } else {
            "probe-key"
        };
        leaves(add, &format!("{path}.{key}"), out);
        return;
    }
    out.push((path.trim_start_matches('.').to_owned(), schema.clone()));
}

/// A value of `schema`'s type, unlike its default; objects get their required fields.
fn sample(schema: &Value) -> Value {
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        let default = schema.get("default");
        return e
            .iter()
            .find(|v| Some(*v) != default)
            .cloned()
            .unwrap_or_else(|| e[0].clone());
    }
    if schema.get("x-kubernetes-int-or-string") == Some(&json!(true)) {
        return json!("7");
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => json!("probe-value"),
        Some("integer") => json!(7),
        Some("number") => json!(0.5),
        Some("boolean") => json!(schema.get("default") != Some(&json!(true))),
        Some("array") => json!([sample(&schema["items"])]),
        Some("object") => {
            let mut m = Map::new();
            for r in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let key = r.as_str().unwrap();
                m.insert(key.into(), sample(&schema["properties"][key]));
            }
            if m.is_empty() && schema.get("properties").is_none() {
                m.insert("probe-key".into(), json!("probe-value"));
            }
            Value::Object(m)
        }
        _ => json!("probe-value"),
    }
}

/// Sets `value` at `path` (dots and `[0]`) in `doc`, creating what is missing.
fn set_path(doc: &mut Value, path: &str, value: Value) {
    let mut node = doc;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let (key, index) = match part.strip_suffix("[0]") {
            Some(k) => (k, true),
            None => (*part, false),
        };
        let last = i + 1 == parts.len();
        if index {
            let list = node
                .as_object_mut()
                .unwrap()
                .entry(key)
                .or_insert_with(|| json!([{}]));
            if list.as_array().is_none_or(|l| l.is_empty()) {
                *list = json!([{}]);
            }
            node = &mut list[0];
            if last {
                *node = value;
                return;
            }
        } else if last {
            node[key] = value;
            return;
        } else {
            if node.get(key).is_none_or(|v| !v.is_object()) {
                node[key] = json!({});
            }
            node = &mut node[key];
        }
    }
}

/// A converting earlier deployment: a `router` and an `engine` worker, both run from a
/// pod (for `extraPodSpec` leaves) or from flat fields.
fn base(with_pod: bool) -> Value {
    let pod = |command: Value| {
        json!({"extraPodSpec": {"containers": [{
        "name": "main", "image": "registry.invalid/engine:1", "command": command}]}})
    };
    let (mut engine, mut router) = (json!({"args": ["--model", "org/model"]}), json!({}));
    if with_pod {
        engine = pod(json!([
            "python3",
            "-m",
            "infera.engine.vllm",
            "--model",
            "org/model"
        ]));
        router = pod(json!(["python3", "-m", "infera.server"]));
    }
    engine["componentType"] = json!("worker");
    router["componentType"] = json!("server");
    json!({"apiVersion": "infera.amd.com/v1alpha1", "kind": "InferaDeployment",
        "metadata": {"name": "probe"},
        "spec": {"image": "registry.invalid/engine:1",
            "services": {"router": router, "engine": engine}}})
}

fn convert(doc: &Value) -> (String, Vec<(String, Severity, String)>) {
    let text = serde_json::to_string(doc).unwrap();
    let out = convert_text(&text, "probe").unwrap();
    let yaml = out
        .to_yaml()
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    (
        yaml,
        out.findings
            .into_iter()
            .map(|f| (f.finding.path, f.finding.severity, f.finding.message))
            .collect(),
    )
}

#[test]
fn every_field_of_the_earlier_schema_is_carried_over_or_reported() {
    let text =
        std::fs::read_to_string(root().join("cli/testdata/legacy_operator/crd.yaml")).unwrap();
    assert!(
        text.starts_with("# github.com/AMD-AGI/Infera@5890f7f:"),
        "the fixture names its source commit"
    );
    let crd: Value = serde_saphyr::from_str(&text).unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut all = Vec::new();
    leaves(schema, ".spec", &mut all);
    assert!(
        all.len() > 700,
        "{} leaves: the schema was not walked",
        all.len()
    );
    let mut uncovered = Vec::new();
    let mut errors = 0;
    for with_pod in [false, true] {
        let base = base(with_pod);
        let (plain, known) = convert(&base);
        assert!(
            known.iter().all(|(_, s, _)| *s != Severity::Error),
            "{known:?}"
        );
        let pod_leaf = |p: &str| p.contains(".extraPodSpec.");
        let probes = all
            .iter()
            .filter(|(p, _)| pod_leaf(p) == with_pod)
            .flat_map(|(p, leaf)| {
                let services = if p.contains("SERVICE") {
                    vec!["engine", "router"]
                } else {
                    vec![""]
                };
                services
                    .into_iter()
                    .map(move |s| (p.replace("SERVICE", s), leaf))
            });
        for (path, leaf) in probes {
            let path = &path;
            let mut doc = base.clone();
            set_path(&mut doc, path, sample(leaf));
            if doc == base {
                continue;
            }
            let (yaml, findings) = convert(&doc);
            // A finding the base already has does not count for this field.
            let reported = findings
                .iter()
                .filter(|f| !known.contains(f))
                .any(|(f, _, _)| path.starts_with(f.as_str()) || f.starts_with(path.as_str()));
            errors += usize::from(findings.iter().any(|(_, s, _)| *s == Severity::Error));
            if yaml == plain && !reported {
                uncovered.push(path.clone());
            }
        }
    }
    assert!(
        uncovered.is_empty(),
        "{} fields neither carried over nor reported: {uncovered:#?}",
        uncovered.len()
    );
    eprintln!(
        "{} leaves, {errors} probes refused with an error",
        all.len()
    );
}

fn run(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(BIN)
        .arg("convert")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const WITH_GAIE: &str = "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: gaie-probe}
spec:
  backendFramework: vllm
  image: registry.invalid/engine:1
  gaie: {enabled: true, eppImage: registry.invalid/epp:1, tokenizerPath: org/model, gatewayName: gw}
  services:
    engine: {componentType: worker, args: [--model, org/model]}
";

#[test]
fn strict_turns_warnings_into_a_failure_that_writes_nothing() {
    let (code, out, err) = run(&["-"], WITH_GAIE);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("kind: InferaDeployment") && out.contains("# warning: spec.gaie.eppImage:"),
        "{out}"
    );
    assert!(
        err.contains("warning: spec.gaie.eppImage: the picker is Infera's gateway image"),
        "{err}"
    );
    let (code, out, err) = run(&["--strict", "-"], WITH_GAIE);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("nothing written (warnings, with --strict)"),
        "{err}"
    );
}

#[test]
fn lists_are_read_item_by_item_and_other_documents_pass_through() {
    let ours = std::fs::read_to_string(root().join("examples/local/deployment.yaml")).unwrap();
    let earlier: Value = serde_saphyr::from_str(WITH_GAIE).unwrap();
    let list =
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": [earlier]}))
            .unwrap();
    let input = format!(
        "{list}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: keep-me}}\n---\n{ours}"
    );
    let (code, out, err) = run(&["-"], &input);
    assert_eq!(code, 0, "{err}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&out).unwrap();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["InferaDeployment", "ConfigMap", "InferaDeployment"]);
    assert_eq!(docs[0]["spec"]["engine"]["kind"], "vllm");
    let ours: Value = serde_saphyr::from_str(&ours).unwrap();
    assert_eq!(
        docs[2], ours,
        "a deployment in this schema passes through unchanged"
    );
}

#[test]
fn an_unconvertible_deployment_fails_naming_the_field() {
    let input = WITH_GAIE.replace("[--model, org/model]", "[--trust-remote-code]");
    let (code, out, err) = run(&["-"], &input);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(
        err.contains("error: spec.services.engine.args: no --model / --model-path"),
        "{err}"
    );
    let (code, _, err) = run(&["/nonexistent/earlier.yaml"], "");
    assert_eq!(code, 2);
    assert!(err.contains("reading /nonexistent/earlier.yaml"), "{err}");
}
