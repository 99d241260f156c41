//! An earlier `extraPodSpec` taken apart: the main container (named `main` or `infera`,
//! else the first) gives the image, the command line, env and resources; the pod-level
//! placement becomes scheduling; the earlier overlay (the init container that copied
//! the Python payload in) goes, since the operator injects its own sidecar; volumes
//! and mounts are handed to whoever recognises them (the model, /dev/shm,
//! /dev/infiniband, kvd's socket), and everything left becomes a pod template that the
//! operator merges onto its own pods.

use super::fields::Fields;
use super::findings::Findings;
use infera_proto::discovery::DEPLOYMENT_LABEL;
use serde_json::{Map, Value, json};

/// Env the earlier operator or overlay set and this operator sets (or no longer needs).
pub const OPERATOR_ENV: &[&str] = &[
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IP",
    "NATS_SERVER",
    "INFERA_K8S_LABEL_SELECTOR",
    "INFERA_KVD_SOCKET",
    "INFERA_REQUIRE_NATIVE",
];

/// Pod fields that are placement: `spec.scheduling` of the deployment.
pub const SCHEDULING: &[&str] = &[
    "nodeSelector",
    "tolerations",
    "affinity",
    "priorityClassName",
    "topologySpreadConstraints",
];

/// A container of the pod that runs the earlier kvd.
#[derive(Debug, Clone, PartialEq)]
pub struct SideContainer {
    /// Its path.
    pub path: String,
    /// Command and args.
    pub words: Vec<String>,
    /// Its volume mounts.
    pub mounts: Vec<Value>,
}

/// The parts of one `extraPodSpec`.
#[derive(Debug, Clone, Default)]
pub struct PodParts {
    /// Path of the main container.
    pub main_path: String,
    /// Main container's image.
    pub image: Option<String>,
    /// Main container's command then args.
    pub words: Vec<String>,
    /// Main container's env.
    pub env: Vec<Value>,
    /// Main container's resources.
    pub resources: Map<String, Value>,
    /// Main container's mounts not taken yet.
    pub mounts: Vec<Value>,
    /// Pod volumes not taken yet.
    pub volumes: Vec<Value>,
    /// Seconds the startup probe allowed (period × failure threshold).
    pub startup_seconds: Option<i64>,
    /// The main container runs privileged.
    pub privileged: bool,
    /// Capabilities the main container adds.
    pub capabilities: Vec<String>,
    /// `hostNetwork: true`.
    pub host_network: bool,
    /// A kvd container.
    pub kvd: Option<SideContainer>,
    /// Placement fields.
    pub scheduling: Map<String, Value>,
    /// Main container fields left (imagePullPolicy, workingDir, ...).
    pub main_rest: Map<String, Value>,
    /// Pod fields left (imagePullSecrets, other containers, ...).
    pub spec_rest: Map<String, Value>,
    /// Volumes whose use became a field (the model, /dev/shm, ...): dropped quietly.
    pub taken: Vec<String>,
    /// Path of the pod spec.
    pub path: String,
}

fn is_overlay(init: &Value) -> bool {
    let image = init.get("image").and_then(Value::as_str).unwrap_or("");
    let words = init.to_string();
    image.contains("infera-overlay") || words.contains("/payload/")
}

fn runs_module(container: &Value, module: &str) -> bool {
    ["command", "args"].iter().any(|k| {
        container
            .get(*k)
            .and_then(Value::as_array)
            .is_some_and(|w| {
                w.iter()
                    .any(|s| s.as_str().is_some_and(|s| s.contains(module)))
            })
    })
}

fn strings(v: Option<Value>) -> Vec<String> {
    match v {
        Some(Value::Array(items)) => items
            .into_iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// Takes `pod` (the `extraPodSpec` at `path`) apart.
pub fn take_apart(path: &str, pod: Value, findings: &mut Findings) -> PodParts {
    let mut parts = PodParts {
        path: path.to_owned(),
        ..Default::default()
    };
    let Value::Object(mut spec) = pod else {
        findings.error(path, "expected a pod spec (an object)");
        return parts;
    };
    let containers = match spec.remove("containers") {
        Some(Value::Array(c)) => c,
        _ => {
            findings.error(
                format!("{path}.containers"),
                "no containers: the engine's container (named main or infera) is needed",
            );
            return parts;
        }
    };
    let main_at = containers
        .iter()
        .position(|c| {
            matches!(
                c.get("name").and_then(Value::as_str),
                Some("main" | "infera")
            )
        })
        .unwrap_or(0);
    let mut others = Vec::new();
    for (i, c) in containers.into_iter().enumerate() {
        let at = format!("{path}.containers[{i}]");
        if i == main_at {
            take_main(&at, c, &mut parts, findings);
        } else if runs_module(&c, "infera.kvd") && parts.kvd.is_none() {
            let mut c = c;
            let words = [
                strings(c.get_mut("command").map(Value::take)),
                strings(c.get_mut("args").map(Value::take)),
            ]
            .concat();
            parts.kvd = Some(SideContainer {
                path: at.clone(),
                words,
                mounts: match c.get("volumeMounts") {
                    Some(Value::Array(m)) => m.clone(),
                    _ => Vec::new(),
                },
            });
            findings.note(at, "the earlier kvd container: the operator runs kvd itself (spec.kvCache), with resources sized from the RAM tier");
        } else {
            others.push(c);
        }
    }
    if !others.is_empty() {
        spec.insert("containers".into(), Value::Array(others));
    }
    if let Some(Value::Array(inits)) = spec.remove("initContainers") {
        let (overlay, keep): (Vec<_>, Vec<_>) = inits.into_iter().partition(is_overlay);
        if !overlay.is_empty() {
            findings.note(
                format!("{path}.initContainers"),
                "the earlier overlay (the Infera Python payload copied into the vendor image) is not needed: the operator adds its own sidecar; the engine image runs as it is",
            );
        }
        if !keep.is_empty() {
            spec.insert("initContainers".into(), Value::Array(keep));
        }
    }
    parts.volumes = match spec.remove("volumes") {
        Some(Value::Array(v)) => v,
        _ => Vec::new(),
    };
    parts.host_network = spec
        .remove("hostNetwork")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    if spec.get("dnsPolicy").and_then(Value::as_str) == Some("ClusterFirstWithHostNet")
        && parts.host_network
    {
        spec.remove("dnsPolicy");
    }
    for key in [
        "serviceAccountName",
        "serviceAccount",
        "automountServiceAccountToken",
    ] {
        if spec.remove(key).is_some() {
            findings.warn(
                format!("{path}.{key}"),
                "the operator gives its pods their own ServiceAccount (discovery needs its permissions); dropped: grant what else the pod needs to that account",
            );
        }
    }
    if spec.remove("terminationGracePeriodSeconds").is_some() {
        findings.note(
            format!("{path}.terminationGracePeriodSeconds"),
            "the operator sizes the grace period from spec.engine.drainSeconds (max(120, drain + 65) s)",
        );
    }
    for key in SCHEDULING {
        if let Some(v) = spec.remove(*key) {
            parts.scheduling.insert((*key).into(), v);
        }
    }
    parts.spec_rest = spec;
    parts
}

fn take_main(at: &str, container: Value, parts: &mut PodParts, findings: &mut Findings) {
    let Value::Object(mut c) = container else {
        findings.error(at, "expected a container (an object)");
        return;
    };
    parts.main_path = at.to_owned();
    if let Some(name) = c
        .remove("name")
        .filter(|n| !matches!(n.as_str(), Some("main" | "infera")))
    {
        findings.note(
            format!("{at}.name"),
            format!("the earlier operator took the first container ({name}) as the engine's; here it is the container named engine"),
        );
    }
    parts.image = c
        .remove("image")
        .and_then(|v| v.as_str().map(str::to_owned));
    parts.words = [strings(c.remove("command")), strings(c.remove("args"))].concat();
    if let Some(Value::Array(env)) = c.remove("env") {
        parts.env = env;
    }
    if let Some(Value::Object(r)) = c.remove("resources") {
        parts.resources = r;
    }
    parts.mounts = match c.remove("volumeMounts") {
        Some(Value::Array(m)) => m,
        _ => Vec::new(),
    };
    if c.remove("ports").is_some() {
        findings.note(
            format!("{at}.ports"),
            "the operator's own (the engine's HTTP and KV-event ports); dropped",
        );
    }
    if let Some(probe) = c.remove("startupProbe") {
        let n = |k: &str, default: i64| probe.get(k).and_then(Value::as_i64).unwrap_or(default);
        parts.startup_seconds =
            Some(n("initialDelaySeconds", 0) + n("periodSeconds", 10) * n("failureThreshold", 3));
    }
    for key in ["readinessProbe", "livenessProbe", "lifecycle"] {
        if c.remove(key).is_some() {
            findings.note(
                format!("{at}.{key}"),
                "the operator's own: readiness is the sidecar's registration, liveness its health check, and the sidecar drains on stop",
            );
        }
    }
    if let Some(Value::Object(mut sc)) = c.remove("securityContext") {
        parts.privileged = sc
            .remove("privileged")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        if let Some(Value::Object(mut caps)) = sc.remove("capabilities") {
            parts.capabilities = strings(caps.remove("add"));
            if !caps.is_empty() {
                sc.insert("capabilities".into(), Value::Object(caps));
            }
        }
        if !sc.is_empty() {
            c.insert("securityContext".into(), Value::Object(sc));
        }
    }
    parts.main_rest = c;
}

/// A path located on a pod's volume.
#[derive(Debug, Clone, PartialEq)]
pub struct Located {
    /// The volume's name.
    pub name: String,
    /// The volume.
    pub volume: Value,
    /// The path inside the volume (the mount's `subPath`, then the rest); empty for its root.
    pub inner: String,
}

impl Located {
    /// The path on the node, for a `hostPath` volume.
    pub fn host_path(&self) -> Option<String> {
        let host = self
            .volume
            .pointer("/hostPath/path")
            .and_then(Value::as_str)?;
        Some(if self.inner.is_empty() {
            host.to_owned()
        } else {
            format!("{}/{}", host.trim_end_matches('/'), self.inner)
        })
    }
}

/// A service's `podLabels`, without the labels the operator sets on its pods
/// (`app.kubernetes.io/*`, `infera.amd.com/deployment`, and `own`), which are reported.
pub fn take_pod_labels(
    svc: &mut Fields,
    own: &[&str],
    findings: &mut Findings,
) -> Map<String, Value> {
    let mut labels = Map::new();
    let path = svc.at("podLabels");
    for (key, value) in svc
        .take("podLabels")
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default()
    {
        if key.starts_with("app.kubernetes.io/")
            || key == DEPLOYMENT_LABEL
            || own.contains(&key.as_str())
        {
            findings.warn(
                format!("{path}.{key}"),
                "a label the operator sets on its pods; dropped",
            );
        } else {
            labels.insert(key, value);
        }
    }
    labels
}

/// A flat service's `resources.cpu` and `.memory` as container requests (empty if
/// neither is set).
pub fn take_cpu_memory(r: &mut Fields, findings: &mut Findings) -> Map<String, Value> {
    let mut requests = Map::new();
    for key in ["cpu", "memory"] {
        if let Some(q) = r.take_str(key, findings) {
            requests.insert(key.into(), json!(q));
        }
    }
    let mut resources = Map::new();
    if !requests.is_empty() {
        resources.insert("requests".into(), Value::Object(requests));
    }
    resources
}

/// A string field of a manifest object, empty when absent.
pub fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// A mount's path, without a trailing slash.
pub fn mount_path(mount: &Value) -> &str {
    str_field(mount, "mountPath").trim_end_matches('/')
}

/// Of `mounts`, the one whose path holds `path` (the longest).
pub fn mount_holding<'a>(mounts: &'a [Value], path: &str) -> Option<&'a Value> {
    mounts
        .iter()
        .filter(|m| {
            let p = mount_path(m);
            !p.is_empty() && (path == p || path.starts_with(&format!("{p}/")))
        })
        .max_by_key(|m| mount_path(m).len())
}

impl PodParts {
    /// The volume named `name`.
    pub fn volume(&self, name: &str) -> Option<&Value> {
        self.volumes
            .iter()
            .find(|v| v.get("name").and_then(Value::as_str) == Some(name))
    }

    /// Takes the main container's mount at `mount_path`; returns its volume.
    pub fn take_mount_at(&mut self, mount_path: &str) -> Option<Value> {
        let i = self
            .mounts
            .iter()
            .position(|m| self::mount_path(m) == mount_path.trim_end_matches('/'))?;
        let mount = self.mounts.remove(i);
        let name = str_field(&mount, "name");
        self.taken.push(name.to_owned());
        Some(self.volume(name).cloned().unwrap_or(Value::Null))
    }

    /// The main container's mount whose path holds `path` (the longest), without
    /// taking it.
    pub fn mount_holding(&self, path: &str) -> Option<&Value> {
        mount_holding(&self.mounts, path)
    }

    /// Where `path`, as a container with `mounts` sees it, lies on this pod's volumes.
    pub fn locate(&self, mounts: &[Value], path: &str) -> Option<Located> {
        let mount = mount_holding(mounts, path)?;
        let rest = path[mount_path(mount).len()..].trim_start_matches('/');
        let inner: Vec<&str> = [str_field(mount, "subPath"), rest]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        let name = str_field(mount, "name");
        Some(Located {
            name: name.to_owned(),
            volume: self.volume(name).cloned().unwrap_or(Value::Null),
            inner: inner.join("/"),
        })
    }

    /// Takes the main container's mounts of volumes that are not needed any more
    /// (the overlay's).
    pub fn drop_mounts_of(&mut self, volume_names: &[String]) {
        self.taken.extend(volume_names.iter().cloned());
        self.mounts.retain(|m| {
            !m.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| volume_names.iter().any(|v| v == n))
        });
    }

    /// Names of volumes some init container named as the overlay's target (emptyDirs
    /// the earlier overlay filled), found by mount path `/overlay`.
    pub fn overlay_volumes(&self) -> Vec<String> {
        self.mounts
            .iter()
            .filter(|m| mount_path(m) == "/overlay")
            .filter_map(|m| m.get("name").and_then(Value::as_str).map(str::to_owned))
            .collect()
    }

    /// What is left, as a pod template whose main container is `container`: empty when
    /// nothing is left. Volumes no container mounts any more are dropped.
    pub fn into_template(
        self,
        container: &str,
        labels: Map<String, Value>,
        findings: &mut Findings,
    ) -> Option<Value> {
        let mut spec = self.spec_rest;
        let mut main = self.main_rest;
        if !self.mounts.is_empty() {
            main.insert("volumeMounts".into(), Value::Array(self.mounts.clone()));
        }
        let mut containers = Vec::new();
        if !main.is_empty() {
            let mut named = Map::new();
            named.insert("name".into(), json!(container));
            named.extend(main);
            containers.push(Value::Object(named));
        }
        if let Some(Value::Array(others)) = spec.remove("containers") {
            containers.extend(others);
        }
        let referenced = |name: &str| {
            let needle = json!({"name": name});
            let mounts_it = |c: &Value| {
                c.get("volumeMounts")
                    .and_then(Value::as_array)
                    .is_some_and(|m| m.iter().any(|m| m.get("name") == needle.get("name")))
            };
            containers.iter().any(mounts_it)
                || spec
                    .get("initContainers")
                    .and_then(Value::as_array)
                    .is_some_and(|i| i.iter().any(mounts_it))
        };
        let mut volumes = Vec::new();
        for (i, v) in self.volumes.into_iter().enumerate() {
            let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
            if referenced(name) {
                volumes.push(v);
            } else if !self.taken.iter().any(|t| t == name) {
                findings.note(
                    format!("{}.volumes[{i}]", self.path),
                    format!("volume {name:?} is mounted by no container; dropped"),
                );
            }
        }
        if !containers.is_empty() {
            spec.insert("containers".into(), Value::Array(containers));
        }
        if !volumes.is_empty() {
            spec.insert("volumes".into(), Value::Array(volumes));
        }
        let mut template = Map::new();
        if !labels.is_empty() {
            template.insert("metadata".into(), json!({"labels": labels}));
        }
        if !spec.is_empty() {
            template.insert("spec".into(), Value::Object(spec));
        }
        (!template.is_empty()).then_some(Value::Object(template))
    }
}
