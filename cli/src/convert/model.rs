//! The model and each role's engine, from an earlier worker: `spec.model` (the model
//! flag and the volume it is on), the role's verbatim flags (model-folder paths moved to
//! where the operator mounts the model), and what is left of its pod as a pod template.

use super::deployment::Build;
use super::pod::mount_path;
use super::wiring::rewrite_selectors;
use super::worker::Worker;
use serde_json::{Map, Value, json};

impl Build {
    /// `spec.model` from the roles' model flags and the volume the path is on.
    pub(super) fn model(&mut self, all: &[&Worker]) -> (Value, String) {
        let first = all[0];
        let Some(path) = first.flags.model.clone() else {
            self.f.error(
                &first.flags_path,
                "no --model / --model-path: spec.model.source needs the weights",
            );
            return (Value::Null, String::new());
        };
        for w in &all[1..] {
            if w.flags.model.as_deref() != Some(path.as_str()) {
                self.f.error(
                    &w.flags_path,
                    format!(
                        "loads {:?}, the {} workers {path:?}: one model per deployment",
                        w.flags.model.as_deref().unwrap_or(""),
                        first.role
                    ),
                );
            }
        }
        let served = first
            .flags
            .served_name
            .clone()
            .unwrap_or_else(|| path.clone());
        let mut model = Map::new();
        model.insert("name".into(), json!(served));
        let source = self.model_source(first, &path);
        model.insert("source".into(), source);
        if let Some(q) = &first.flags.quantization {
            model.insert("quantization".into(), json!(q));
        }
        if let Some(rel) = first
            .flags
            .tokenizer
            .as_ref()
            .and_then(|t| t.value())
            .and_then(|t| t.strip_prefix(&format!("{path}/")))
        {
            model.insert("tokenizer".into(), json!(rel));
        }
        for w in &all[1..] {
            let differs =
                |what: &str, a: Option<&str>, b: Option<&str>| (a != b).then(|| what.to_owned());
            let diffs: Vec<String> = [
                differs(
                    "--served-model-name",
                    first.flags.served_name.as_deref(),
                    w.flags.served_name.as_deref(),
                ),
                differs(
                    "--quantization",
                    first.flags.quantization.as_deref(),
                    w.flags.quantization.as_deref(),
                ),
                differs(
                    "--kv-cache-dtype",
                    first.flags.kv_cache_dtype.as_deref(),
                    w.flags.kv_cache_dtype.as_deref(),
                ),
                differs("/dev/shm size", first.shm.as_deref(), w.shm.as_deref()),
            ]
            .into_iter()
            .flatten()
            .collect();
            if !diffs.is_empty() {
                self.f.warn(&w.flags_path, format!("{} differ from the {} workers': one value per deployment, the {} workers' kept", diffs.join(", "), first.role, first.role));
            }
        }
        if let Some(s) = all.iter().filter_map(|w| w.startup_seconds).max() {
            model.insert("startupBudgetSeconds".into(), json!(s.clamp(60, 14400)));
        }
        (Value::Object(model), path)
    }

    pub(super) fn model_source(&mut self, w: &Worker, path: &str) -> Value {
        if !path.starts_with('/') {
            let hf_id = path.split('/').count() <= 2
                && path.split('/').all(|p| {
                    !p.is_empty()
                        && p.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                });
            if !hf_id {
                self.f.error(
                    &w.flags_path,
                    format!("model {path:?} is neither a path in the pod nor a Hugging Face id"),
                );
                return Value::Null;
            }
            let mut hf = json!({"id": path});
            for e in &w.env {
                let name = e.get("name").and_then(Value::as_str).unwrap_or_default();
                if matches!(name, "HF_TOKEN" | "HUGGING_FACE_HUB_TOKEN")
                    && let Some(r) = e.pointer("/valueFrom/secretKeyRef")
                {
                    hf["tokenSecretRef"] = json!({"name": r["name"], "key": r["key"]});
                }
                if name == "HF_ENDPOINT"
                    && let Some(v) = e.get("value")
                {
                    hf["endpoint"] = v.clone();
                }
            }
            self.f.note(&w.flags_path, format!("the operator downloads {path} once into a PVC the workers share (spec.model.source.huggingFace.cacheSize, default 500Gi) instead of each engine downloading it"));
            return json!({"huggingFace": hf});
        }
        let Some(place) = w.pod.as_ref().and_then(|p| p.locate(&p.mounts, path)) else {
            self.f.error(&w.flags_path, format!("model {path} is on no volume of the pod: put the weights on a PVC or a host directory (spec.model.source)"));
            return Value::Null;
        };
        if let Some(full) = place.host_path() {
            json!({"hostPath": {"path": full}})
        } else if let Some(claim) = place.volume.pointer("/persistentVolumeClaim/claimName") {
            let mut pvc = json!({"claimName": claim});
            if !place.inner.is_empty() {
                pvc["subPath"] = json!(place.inner);
            }
            json!({"pvc": pvc})
        } else {
            self.f.error(format!("{}.volumes", w.path), format!("model volume {:?} is neither a hostPath nor a persistentVolumeClaim: wrap it in a PVC (spec.model.source.pvc)", place.name));
            Value::Null
        }
    }

    /// What is left of a worker's pod, as a pod template for the `engine` container.
    pub(super) fn template(&mut self, w: &Worker, model_path: &str) -> Option<Value> {
        let mut labels = w.labels.clone();
        labels.retain(|_, v| v.is_string());
        let Some(mut parts) = w.pod.clone() else {
            return (!labels.is_empty()).then(|| json!({"metadata": {"labels": labels}}));
        };
        if let Some(at) = parts
            .mount_holding(model_path)
            .map(|m| mount_path(m).to_owned())
        {
            parts.take_mount_at(&at);
        }
        if let Some(kvd) = &w.kvd {
            let names: Vec<String> = kvd
                .mounts
                .iter()
                .filter_map(|m| m.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect();
            parts.drop_mounts_of(&names);
        }
        let mut t = parts.into_template("engine", labels, &mut self.f)?;
        rewrite_selectors(&mut t, &mut self.f, &w.path, &self.service_labels);
        Some(t)
    }

    /// A role's verbatim engine flags. Paths in the model folder move to where the
    /// operator mounts the model; SGLang decode workers keep the radix cache the earlier
    /// launcher turned on for them.
    pub(super) fn role_args(
        &mut self,
        w: &Worker,
        model_path: &str,
        rdma: bool,
    ) -> Vec<Vec<String>> {
        let mut args: Vec<Vec<String>> = w.flags.args.iter().map(|a| a.words.clone()).collect();
        if !w.flags.ib_devices.is_empty() && !rdma {
            args.push(vec![
                "--disaggregation-ib-device".into(),
                w.flags.ib_devices.join(","),
            ]);
        }
        if let Some(t) = &w.flags.tokenizer {
            args.push(t.words.clone());
        }
        let launcher_radix = w.engine == "sglang"
            && w.role == "decode"
            && w.flags.transport.backend.as_deref() == Some("mooncake")
            && w.flags.kv_events
            && !args.iter().flatten().any(|a| {
                a == "--disaggregation-decode-enable-radix-cache"
                    || a.starts_with("--speculative-algorithm")
            });
        if launcher_radix {
            args.push(vec!["--disaggregation-decode-enable-radix-cache".into()]);
            self.f.note(&w.flags_path, "--disaggregation-decode-enable-radix-cache: the earlier launcher added it for SGLang decode workers over Mooncake with KV events; kept as an argument");
        }
        if model_path.starts_with('/') {
            let mount = infera_operator::render::engine::MODEL_MOUNT;
            // Where the earlier pod mounted the model's volume: the operator mounts only
            // the model folder, so other paths on that volume do not exist in its pods.
            let volume_mount = w
                .pod
                .as_ref()
                .and_then(|p| p.mount_holding(model_path))
                .map(|m| mount_path(m).to_owned());
            for word in args.iter_mut().flatten() {
                if let Some(rest) = word
                    .strip_prefix(model_path)
                    .filter(|r| r.is_empty() || r.starts_with('/'))
                {
                    *word = format!("{mount}{rest}");
                } else if let Some(v) = volume_mount
                    .as_deref()
                    .filter(|v| word.starts_with(&format!("{v}/")))
                {
                    self.f.warn(&w.flags_path, format!("{word}: on the model's volume ({v}) but outside the model folder, which is all the operator mounts: mount it through spec.engine.podTemplate, or move it into the model folder"));
                }
            }
        }
        args
    }
}
