//! One earlier `InferaDeployment` (the Go operator's schema) converted: its services
//! read (`worker`, `server`), then put together as this project's `InferaDeployment`,
//! plus the `PDTopology` that prefill and decode services imply. The result is checked
//! the way the operator will check it (the typed read-back and a render), so what is
//! written is what the operator runs.

use super::fields::Fields;
use super::findings::Findings;
use super::server::{Server, merge_container_env, read_server};
use super::worker::{Worker, read_worker};
use infera_operator::api::{InferaDeployment, PDTopology};
use infera_operator::plan::{Images, Observed, Platform};
use serde_json::{Map, Value, json};

/// The documents one earlier deployment becomes, and what could not be carried over.
#[derive(Debug, Clone, Default)]
pub struct Converted {
    /// `PDTopology` (for prefill/decode) then `InferaDeployment`.
    pub documents: Vec<Value>,
    /// Findings, in order.
    pub findings: Findings,
}

const API_VERSION: &str = "infera.amd.com/v1alpha1";
/// The annotation `kubectl apply` keeps the earlier spec in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Converts `doc`, an earlier-schema `InferaDeployment`.
pub fn convert_deployment(doc: Value) -> Converted {
    let mut f = Findings::default();
    let mut root = Fields::new("", doc, &mut f);
    root.take("apiVersion");
    root.take("kind");
    root.take("status");
    let metadata = take_metadata(&mut root, &mut f);
    let name = metadata
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut spec = root.take_fields("spec", &mut f).unwrap_or_default();
    root.report_rest(&mut f, "not a field of an InferaDeployment; dropped");
    let backend = spec
        .take_str("backendFramework", &mut f)
        .unwrap_or_else(|| "sglang".into());
    if !matches!(backend.as_str(), "sglang" | "vllm") {
        f.error(
            spec.at("backendFramework"),
            format!("{backend:?} is not sglang or vllm"),
        );
    }
    let image = spec.take_str("image", &mut f);
    let discovery_backend = spec.take_str("discoveryBackend", &mut f);
    let etcd_endpoint = spec.take_str("etcdEndpoint", &mut f);
    if etcd_endpoint.is_some() && discovery_backend.as_deref() != Some("etcd") {
        f.note(spec.at("etcdEndpoint"), "read only with discoveryBackend: etcd, as the earlier operator did (a launcher's --discovery-backend etcd still uses it)");
    }
    let nats_deployed = read_nats(&mut spec, &mut f);
    read_gaie(&mut spec, &name, &mut f);
    let envs = match spec.take("envs") {
        Some(Value::Array(e)) => e,
        None => Vec::new(),
        Some(other) => {
            f.error(
                "spec.envs",
                format!("expected a list of env vars, found {other}"),
            );
            Vec::new()
        }
    };
    let services_path = spec.at("services");
    let mut workers = Vec::new();
    let mut servers = Vec::new();
    let services = spec
        .take("services")
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default();
    spec.report_rest(&mut f, "not a field of the earlier schema; dropped");
    for (svc_name, value) in services {
        let mut svc = Fields::new(format!("{services_path}.{svc_name}"), value, &mut f);
        match svc.take_str("componentType", &mut f).as_deref() {
            Some("worker") => workers.push(read_worker(&svc_name, svc, &backend, &envs, &mut f)),
            Some("server") => servers.push((svc_name, read_server(svc, &mut f))),
            other => f.error(
                svc.at("componentType"),
                format!("{other:?}: expected server or worker"),
            ),
        }
    }
    if !envs.is_empty() && workers.iter().all(|w| w.pod.is_some()) {
        f.warn("spec.envs", "the earlier operator gave spec.envs only to services without extraPodSpec, so no engine had them; dropped");
    }
    let mut service_labels = Map::new();
    for w in &workers {
        service_labels.insert(
            w.name.clone(),
            json!({"infera.amd.com/role": w.role, "app.kubernetes.io/component": "engine"}),
        );
        let ours = if w.nodes > 1 {
            Some("LeaderWorkerSet")
        } else {
            None
        };
        if let Some(kind) =
            ours.filter(|_| matches!(w.name.as_str(), "mixed" | "prefill" | "decode"))
        {
            f.warn(&w.path, format!("the earlier operator's {kind} {name}-{} has the name of this operator's {kind} for the {} workers: delete the earlier one before applying the result (README, switching a cluster over)", w.name, w.role));
        }
    }
    for (svc_name, _) in &servers {
        service_labels.insert(
            svc_name.clone(),
            json!({"app.kubernetes.io/component": "gateway"}),
        );
        if svc_name == "gateway" {
            f.warn(format!("{services_path}.gateway"), format!("the earlier operator's Deployment and Service {name}-gateway have the names of this operator's gateway: delete them before applying the result (README, switching a cluster over)"));
        }
    }
    let mut build = Build {
        name,
        f,
        services_path,
        image,
        service_labels,
    };
    let server = match servers.len() {
        0 => {
            build.f.note(&build.services_path, "no server service: the deployment gets its own gateway (spec.gateway.replicas, default 1)");
            Server::default()
        }
        _ => {
            for (extra, _) in &servers[1..] {
                build.f.warn(format!("{}.{extra}", build.services_path), "a second router service: one gateway Deployment serves the deployment (spec.gateway.replicas); dropped");
            }
            servers.swap_remove(0).1
        }
    };
    let Some(roles) = build.roles(workers) else {
        return Converted {
            documents: Vec::new(),
            findings: build.f,
        };
    };
    let disc = Discovery {
        backend: discovery_backend,
        etcd_endpoint,
        nats_deployed,
    };
    let documents = build.documents(metadata, roles, server, &disc);
    let mut findings = build.f;
    if findings.worst() != Some(super::findings::Severity::Error) {
        check_with_operator(&documents, &mut findings);
    }
    Converted {
        documents,
        findings,
    }
}

/// `metadata`: name, namespace, labels and annotations; what the server set is dropped.
fn take_metadata(root: &mut Fields, f: &mut Findings) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(mut m) = root.take_fields("metadata", f) else {
        f.error("metadata.name", "the deployment has no name");
        return out;
    };
    match m.take_str("name", f) {
        Some(n) => {
            if n.len() > infera_operator::render::names::MAX_NAME_LEN {
                f.error("metadata.name", format!("{n:?} is longer than {} characters (pod names add a role, an ordinal and a hash within the 63-character label limit): rename it", infera_operator::render::names::MAX_NAME_LEN));
            }
            out.insert("name".into(), json!(n));
        }
        None => f.error("metadata.name", "the deployment has no name"),
    }
    if let Some(ns) = m.take("namespace") {
        out.insert("namespace".into(), ns);
    }
    if let Some(l) = m.take("labels") {
        out.insert("labels".into(), l);
    }
    if let Some(Value::Object(mut a)) = m.take("annotations") {
        a.remove(LAST_APPLIED);
        if !a.is_empty() {
            out.insert("annotations".into(), Value::Object(a));
        }
    }
    // uid, resourceVersion, generation, creationTimestamp, managedFields, ...: the
    // API server's, from `kubectl get -o yaml`.
    out
}

/// `spec.nats`: whether the earlier operator ran a NATS for this deployment.
fn read_nats(spec: &mut Fields, f: &mut Findings) -> bool {
    let Some(mut nats) = spec.take_fields("nats", f) else {
        return true;
    };
    let deployed = nats.take_bool("deploy", f).unwrap_or(true);
    for key in ["image", "storageSize", "storageClassName"] {
        if nats.take(key).is_some() {
            f.warn(
                nats.at(key),
                "the operator runs no NATS per deployment: the chart's NATS serves every deployment (chart values nats.image, nats.jetstream.storage); dropped",
            );
        }
    }
    nats.report_rest(f, "not a field of the earlier schema; dropped");
    deployed
}

/// `spec.gaie`: not built here.
fn read_gaie(spec: &mut Fields, name: &str, f: &mut Findings) {
    let Some(mut gaie) = spec.take_fields("gaie", f) else {
        return;
    };
    let enabled = gaie.take_bool("enabled", f).unwrap_or(false);
    let rest: Vec<String> = gaie.into_map().keys().cloned().collect();
    let what = format!(
        "the Gateway API Inference Extension (endpoint picker, InferencePool, per-worker frontends) is not built: the deployment's own gateways route kv-aware; attach an HTTPRoute to the {name}-gateway Service instead{}; dropped",
        if rest.is_empty() {
            String::new()
        } else {
            format!(" (fields {})", rest.join(", "))
        }
    );
    if enabled || !rest.is_empty() {
        f.warn("spec.gaie", what);
    }
}

/// The discovery and messaging the earlier spec chose.
struct Discovery {
    backend: Option<String>,
    etcd_endpoint: Option<String>,
    nats_deployed: bool,
}

/// The worker services, by role.
enum Roles {
    Mixed(Box<Worker>),
    Disaggregated(Box<Worker>, Box<Worker>),
}

impl Roles {
    fn all(&self) -> Vec<&Worker> {
        match self {
            Roles::Mixed(w) => vec![w],
            Roles::Disaggregated(p, d) => vec![p, d],
        }
    }
}

struct Build {
    name: String,
    f: Findings,
    services_path: String,
    image: Option<String>,
    /// This operator's pod labels for each earlier service name.
    service_labels: Map<String, Value>,
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn set(map: &mut Map<String, Value>, key: &str, value: Value) {
    let empty = match &value {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        _ => false,
    };
    if !empty {
        map.insert(key.into(), value);
    }
}

impl Build {
    /// Mixed, or one prefill and one decode service.
    fn roles(&mut self, workers: Vec<Worker>) -> Option<Roles> {
        let names = |role: &str| -> Vec<String> {
            workers
                .iter()
                .filter(|w| w.role == role)
                .map(|w| w.name.clone())
                .collect()
        };
        let (mixed, prefill, decode) = (names("mixed"), names("prefill"), names("decode"));
        let path = self.services_path.clone();
        if workers.is_empty() {
            self.f
                .error(path, "no worker service: nothing to serve the model");
            return None;
        }
        if !mixed.is_empty() && (!prefill.is_empty() || !decode.is_empty()) {
            self.f.error(path, format!("mixed workers ({}) beside prefill/decode ones: an InferaDeployment is one or the other; put the mixed pool in a manifest of its own and convert each", mixed.join(", ")));
            return None;
        }
        for (role, list) in [
            ("mixed", &mixed),
            ("prefill", &prefill),
            ("decode", &decode),
        ] {
            if list.len() > 1 {
                self.f.error(&path, format!("several {role} pools ({}): an InferaDeployment has one per role; one manifest per pool", list.join(", ")));
                return None;
            }
        }
        let take = |role: &str| {
            workers
                .iter()
                .position(|w| w.role == role)
                .map(|i| Box::new(workers[i].clone()))
        };
        if let Some(w) = take("mixed") {
            return Some(Roles::Mixed(w));
        }
        match (take("prefill"), take("decode")) {
            (Some(p), Some(d)) => Some(Roles::Disaggregated(p, d)),
            _ => {
                self.f.error(
                    path,
                    "prefill workers need decode workers (and the other way round)",
                );
                None
            }
        }
    }

    fn documents(
        &mut self,
        metadata: Map<String, Value>,
        roles: Roles,
        server: Server,
        disc: &Discovery,
    ) -> Vec<Value> {
        let all = roles.all();
        let first = all[0];
        for w in &all[1..] {
            if w.engine != first.engine {
                self.f.error(
                    &w.flags_path,
                    format!(
                        "engine {} beside {}: one engine per deployment",
                        w.engine, first.engine
                    ),
                );
            }
        }
        let mut spec = Map::new();
        let (model, model_path) = self.model(&all);
        let mut engine = Map::new();
        engine.insert("kind".into(), json!(first.engine));
        let image = first.image.clone().or_else(|| self.image.clone());
        match &image {
            Some(i) => {
                engine.insert("image".into(), json!(i));
            }
            None => self.f.error(
                &first.image_path,
                "no image: spec.engine.image (the engine's image) is required",
            ),
        }
        let mut templates: Vec<Option<Value>> =
            all.iter().map(|w| self.template(w, &model_path)).collect();
        for (i, w) in all.iter().enumerate().skip(1) {
            let own = w.image.clone().or_else(|| self.image.clone());
            if own.is_some() && own != image {
                self.f.warn(&w.image_path, format!("the {} workers run another image than the {} workers: kept in spec.engine.rolePodTemplates.{}, but the operator renders flags for one engine version", w.role, first.role, w.role));
                let t = templates[i].get_or_insert_with(|| json!({}));
                merge_container_field(t, "engine", "image", json!(own));
            }
        }
        // Env and args every role shares go to the engine; the rest to the role.
        let shared_env: Vec<Value> = first
            .env
            .iter()
            .filter(|e| all.iter().all(|w| w.env.contains(e)))
            .cloned()
            .collect();
        set(&mut engine, "env", Value::Array(shared_env.clone()));
        if let Roles::Disaggregated(..) = roles {
            for (i, w) in all.iter().enumerate() {
                let own: Vec<Value> = w
                    .env
                    .iter()
                    .filter(|e| !shared_env.contains(e))
                    .cloned()
                    .collect();
                if !own.is_empty() {
                    merge_container_env(
                        templates[i].get_or_insert_with(|| json!({})),
                        "engine",
                        own,
                    );
                }
            }
        }
        let scheduling = self.scheduling(&all, &mut templates);
        let rdma = rdma_on(&all);
        let per_role: Vec<Vec<Vec<String>>> = all
            .iter()
            .map(|w| self.role_args(w, &model_path, rdma))
            .collect();
        let shared_args: Vec<Vec<String>> = per_role[0]
            .iter()
            .filter(|a| per_role.iter().all(|r| r.contains(a)))
            .cloned()
            .collect();
        set(&mut engine, "args", json!(shared_args.concat()));
        let parallelism: Vec<Map<String, Value>> = all.iter().map(parallelism).collect();
        let gpu_names: Vec<&str> = all
            .iter()
            .filter_map(|w| w.gpus.as_ref().map(|g| g.1.as_str()))
            .collect();
        if let Some(g) = gpu_names.first() {
            if gpu_names.iter().any(|n| n != g) {
                self.f.warn(&self.services_path, format!("roles request GPUs as different resources ({}): one spec.engine.gpuResourceName; {g} kept", gpu_names.join(", ")));
            }
            if *g != "amd.com/gpu" {
                engine.insert("gpuResourceName".into(), json!(g));
            }
        }
        let shm: Vec<&String> = all.iter().filter_map(|w| w.shm.as_ref()).collect();
        if let Some(s) = shm.first() {
            engine.insert("sharedMemorySize".into(), json!(s));
        }
        // Without the flag the earlier SGLang and vLLM launchers chose fp8 (unless
        // INFERA_DEFAULT_KV_FP8=0); ATOM kept its own default, bf16.
        let dtype = first.flags.kv_cache_dtype.clone().unwrap_or_else(|| {
            if first.engine == "atom" || !first.default_kv_fp8 {
                "auto".into()
            } else {
                "fp8".into()
            }
        });
        if dtype != "fp8" {
            engine.insert("kvCacheDtype".into(), json!(dtype));
        }
        if let Some(d) = all.iter().filter_map(|w| w.drain_seconds).max() {
            engine.insert("drainSeconds".into(), json!(d.clamp(0, 86400)));
        }
        let mut topology = None;
        match &roles {
            Roles::Mixed(w) => {
                spec.insert("replicas".into(), json!(w.replicas));
                set(
                    &mut engine,
                    "parallelism",
                    Value::Object(parallelism[0].clone()),
                );
                set(&mut engine, "resources", Value::Object(w.resources.clone()));
                set(
                    &mut engine,
                    "podTemplate",
                    templates[0].take().unwrap_or(Value::Null),
                );
            }
            Roles::Disaggregated(p, d) => {
                let units = gcd(p.replicas, d.replicas);
                let (pn, dn) = if units == 0 {
                    (1, 1)
                } else {
                    (p.replicas / units, d.replicas / units)
                };
                if units == 0 && p.replicas + d.replicas > 0 {
                    self.f.error(
                        &self.services_path,
                        format!(
                            "{} prefill and {} decode workers: a topology unit needs both",
                            p.replicas, d.replicas
                        ),
                    );
                }
                spec.insert("replicas".into(), json!(units));
                let layout = match (pn, dn) {
                    (1, 1) => "1P1D",
                    (2, 1) => "2P1D",
                    (1, 2) => "1P2D",
                    _ => "custom",
                };
                let role = |i: usize, w: &Worker, n: i64| {
                    let mut r = Map::new();
                    if layout == "custom" {
                        r.insert("replicas".into(), json!(n));
                    }
                    set(&mut r, "parallelism", Value::Object(parallelism[i].clone()));
                    let own: Vec<String> = per_role[i]
                        .iter()
                        .filter(|a| !shared_args.contains(a))
                        .flatten()
                        .cloned()
                        .collect();
                    set(&mut r, "args", json!(own));
                    if p.resources != d.resources {
                        set(&mut r, "resources", Value::Object(w.resources.clone()));
                    }
                    Value::Object(r)
                };
                let mut tspec = Map::new();
                tspec.insert("layout".into(), json!(layout));
                set(&mut tspec, "prefill", role(0, p, pn));
                set(&mut tspec, "decode", role(1, d, dn));
                set(&mut tspec, "transport", self.transport(p, d));
                if p.resources == d.resources {
                    set(&mut engine, "resources", Value::Object(p.resources.clone()));
                }
                if templates[0] == templates[1] {
                    set(
                        &mut engine,
                        "podTemplate",
                        templates[0].take().unwrap_or(Value::Null),
                    );
                } else {
                    let mut rt = Map::new();
                    set(
                        &mut rt,
                        "prefill",
                        templates[0].take().unwrap_or(Value::Null),
                    );
                    set(
                        &mut rt,
                        "decode",
                        templates[1].take().unwrap_or(Value::Null),
                    );
                    set(&mut engine, "rolePodTemplates", Value::Object(rt));
                }
                let mut tmeta = Map::new();
                tmeta.insert("name".into(), json!(self.name));
                if let Some(ns) = metadata.get("namespace") {
                    tmeta.insert("namespace".into(), ns.clone());
                }
                topology = Some(
                    json!({"apiVersion": API_VERSION, "kind": "PDTopology", "metadata": tmeta, "spec": tspec}),
                );
                spec.insert(
                    "serving".into(),
                    json!({"mode": "disaggregated", "topologyRef": self.name}),
                );
            }
        }
        if spec.get("replicas") == Some(&json!(1)) {
            spec.remove("replicas");
        }
        spec.insert("model".into(), model);
        spec.insert("engine".into(), Value::Object(engine));
        set(&mut spec, "network", self.network(&all));
        let gateway = self.gateway(server.gateway.clone(), &server, &model_path, &all);
        set(&mut spec, "gateway", Value::Object(gateway));
        set(&mut spec, "discovery", self.discovery(&all, &server, disc));
        set(&mut spec, "messaging", self.messaging(&all, &server, disc));
        set(&mut spec, "kvCache", self.kv_cache(&all));
        set(&mut spec, "scheduling", scheduling);
        let idep = json!({"apiVersion": API_VERSION, "kind": "InferaDeployment", "metadata": metadata, "spec": spec});
        topology.into_iter().chain([idep]).collect()
    }

    /// `spec.model` from the roles' model flags and the volume the path is on.
    fn model(&mut self, all: &[&Worker]) -> (Value, String) {
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

    fn model_source(&mut self, w: &Worker, path: &str) -> Value {
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
        let Some(mount) = w.pod.as_ref().and_then(|p| p.mount_holding(path)) else {
            self.f.error(&w.flags_path, format!("model {path} is on no volume of the pod: put the weights on a PVC or a host directory (spec.model.source)"));
            return Value::Null;
        };
        let mount_path = mount
            .get("mountPath")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .trim_end_matches('/');
        let sub = mount
            .get("subPath")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let rest = path[mount_path.len()..].trim_start_matches('/');
        let inner: Vec<&str> = [sub, rest].into_iter().filter(|s| !s.is_empty()).collect();
        let inner = inner.join("/");
        let name = mount
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let volume = w
            .pod
            .as_ref()
            .and_then(|p| p.volume(name))
            .cloned()
            .unwrap_or(Value::Null);
        if let Some(host) = volume.pointer("/hostPath/path").and_then(Value::as_str) {
            let full = if inner.is_empty() {
                host.to_owned()
            } else {
                format!("{}/{inner}", host.trim_end_matches('/'))
            };
            json!({"hostPath": {"path": full}})
        } else if let Some(claim) = volume.pointer("/persistentVolumeClaim/claimName") {
            let mut pvc = json!({"claimName": claim});
            if !inner.is_empty() {
                pvc["subPath"] = json!(inner);
            }
            json!({"pvc": pvc})
        } else {
            self.f.error(format!("{}.volumes", w.path), format!("model volume {name:?} is neither a hostPath nor a persistentVolumeClaim: wrap it in a PVC (spec.model.source.pvc)"));
            Value::Null
        }
    }

    /// What is left of a worker's pod, as a pod template for the `engine` container.
    fn template(&mut self, w: &Worker, model_path: &str) -> Option<Value> {
        let mut labels = w.labels.clone();
        labels.retain(|_, v| v.is_string());
        let Some(mut parts) = w.pod.clone() else {
            return (!labels.is_empty()).then(|| json!({"metadata": {"labels": labels}}));
        };
        if let Some(mount_path) = parts
            .mount_holding(model_path)
            .and_then(|m| m.get("mountPath"))
            .and_then(Value::as_str)
            .map(str::to_owned)
        {
            parts.take_mount_at(&mount_path);
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
    fn role_args(&mut self, w: &Worker, model_path: &str, rdma: bool) -> Vec<Vec<String>> {
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
            for word in args.iter_mut().flatten() {
                if let Some(rest) = word
                    .strip_prefix(model_path)
                    .filter(|r| r.is_empty() || r.starts_with('/'))
                {
                    *word = format!("{mount}{rest}");
                }
            }
        }
        args
    }

    fn transport(&mut self, p: &Worker, d: &Worker) -> Value {
        let (tp, td) = (&p.flags.transport, &d.flags.transport);
        if tp.backend.is_some() && td.backend.is_some() && tp.backend != td.backend {
            self.f.error(
                &d.flags_path,
                format!(
                    "KV transport {:?} here, {:?} on the prefill workers",
                    td.backend.as_deref().unwrap_or(""),
                    tp.backend.as_deref().unwrap_or("")
                ),
            );
        }
        let backend = tp.backend.clone().or_else(|| td.backend.clone());
        let mut t = Map::new();
        match backend.as_deref() {
            Some("nixl") => self.f.error(&p.flags_path, "the NIXL transport is not supported (no connector of the router speaks it): use mooncake or mori"),
            Some(b @ ("mooncake" | "mori")) => {
                t.insert("backend".into(), json!(b));
            }
            Some(other) => self.f.error(&p.flags_path, format!("KV transport {other:?}: mooncake or mori")),
            None => self.f.note(&p.flags_path, "no KV transport named: mooncake, the engines' default"),
        }
        if tp.read_mode || td.read_mode || p.mori_read_env || d.mori_read_env {
            t.insert("readMode".into(), json!(true));
        }
        for (key, v) in [
            ("bootstrapPort", tp.bootstrap_port.or(td.bootstrap_port)),
            ("handshakePort", tp.handshake_port.or(td.handshake_port)),
            ("notifyPort", tp.notify_port.or(td.notify_port)),
        ] {
            if let Some(v) = v {
                t.insert(key.into(), json!(v));
            }
        }
        Value::Object(t)
    }

    fn network(&mut self, all: &[&Worker]) -> Value {
        let mut rdma = Map::new();
        if !rdma_on(all) {
            if let Some(w) = all.iter().find(|w| w.host_network) {
                self.f.warn(format!("{}.extraPodSpec.hostNetwork", w.path), "engine pods run on the host network only with RDMA (spec.network.rdma.hostNetwork); dropped");
            }
            return Value::Null;
        }
        rdma.insert("enabled".into(), json!(true));
        if let Some((resource, count)) = all.iter().find_map(|w| w.rdma_resource.clone()) {
            if resource != "rdma/hca" {
                rdma.insert("resourceName".into(), json!(resource));
            }
            if count != 1 {
                rdma.insert("count".into(), json!(count));
            }
        } else {
            rdma.insert("hostDevices".into(), json!(true));
        }
        if all.iter().any(|w| w.host_network) {
            rdma.insert("hostNetwork".into(), json!(true));
        }
        if let Some(w) = all.iter().find(|w| !w.flags.ib_devices.is_empty()) {
            rdma.insert("interfaces".into(), json!(w.flags.ib_devices));
        }
        json!({"rdma": rdma})
    }

    fn gateway(
        &mut self,
        mut g: Map<String, Value>,
        server: &Server,
        model_path: &str,
        all: &[&Worker],
    ) -> Map<String, Value> {
        if let Some((t, path)) = &server.tokenizer {
            let same_model = t == model_path
                || all[0].flags.served_name.as_deref() == Some(t.as_str())
                || t.rsplit('/').next() == model_path.rsplit('/').next();
            if !same_model {
                self.f.warn(path, format!("--router-tokenizer-path {t}: the gateway reads the model's own tokenizer (spec.model.tokenizer for a folder inside the model); dropped"));
            }
        }
        if let Some(Value::Object(s)) = g.get_mut("scheduling") {
            let mut v = Value::Object(std::mem::take(s));
            rewrite_selectors(&mut v, &mut self.f, "spec.services", &self.service_labels);
            g.insert("scheduling".into(), v);
        }
        g
    }

    fn discovery(&mut self, all: &[&Worker], server: &Server, disc: &Discovery) -> Value {
        let flag = all.iter().find_map(|w| w.flags.discovery.clone());
        let endpoint = all
            .iter()
            .find_map(|w| w.flags.etcd_endpoint.clone())
            .or_else(|| disc.etcd_endpoint.clone());
        let backend = flag
            .or_else(|| disc.backend.clone())
            .unwrap_or_else(|| "kubernetes".into());
        if backend != "etcd" {
            return Value::Null;
        }
        let prefix = all
            .iter()
            .find_map(|w| w.flags.etcd_prefix.clone())
            .or_else(|| server.etcd_prefix.clone());
        let Some(endpoint) = endpoint else {
            self.f.note(
                "spec.discoveryBackend",
                "etcd without an endpoint: the chart's etcd (etcd.enabled=true)",
            );
            return json!({"backend": "etcd"});
        };
        let endpoints: Vec<String> = endpoint
            .split(',')
            .filter(|e| !e.is_empty())
            .map(etcd_url)
            .collect();
        let mut etcd = json!({"endpoints": endpoints});
        if endpoints.iter().any(|e| e.starts_with("https://")) {
            self.f.warn("spec.etcdEndpoint", "an https:// etcd: name its CA and client certificate Secret in spec.discovery.etcd.tlsSecretName");
        }
        if let Some(p) = prefix.filter(|p| p != infera_proto::discovery::DEFAULT_ETCD_PREFIX) {
            etcd["prefix"] = json!(p);
        }
        json!({"backend": "etcd", "etcd": etcd})
    }

    fn messaging(&mut self, all: &[&Worker], server: &Server, disc: &Discovery) -> Value {
        let default = if all[0].engine == "atom" {
            "zmq"
        } else {
            "nats"
        };
        let transport = all
            .iter()
            .find_map(|w| w.flags.kv_event_transport.clone())
            .unwrap_or_else(|| default.into());
        if let Some(s) = server
            .kv_event_transport
            .as_deref()
            .filter(|s| *s != transport)
        {
            self.f.warn("spec.services", format!("the router reads KV events over {s}, the workers publish them over {transport}: {transport} kept"));
        }
        if transport != "nats" {
            return Value::Null;
        }
        let managed = format!("nats://{}-nats:4222", self.name);
        let env_url = all.iter().find_map(|w| w.nats_env.clone());
        let url = all
            .iter()
            .find_map(|w| w.flags.nats_server.clone())
            .or_else(|| server.nats_server.clone())
            .or(env_url)
            .filter(|u| *u != managed);
        match url {
            Some(u) => {
                let u = if u.contains("://") {
                    u
                } else {
                    format!("nats://{u}")
                };
                json!({"backend": "nats", "natsUrl": u})
            }
            None => {
                let why = if disc.nats_deployed {
                    "the NATS the earlier operator ran for this deployment"
                } else {
                    "no NATS named"
                };
                self.f.note("spec.nats", format!("{why}: KV events travel over the chart's NATS (nats.enabled=true), or name one in spec.messaging.natsUrl"));
                json!({"backend": "nats"})
            }
        }
    }

    fn kv_cache(&mut self, all: &[&Worker]) -> Value {
        if !all.iter().any(|w| w.flags.kvd || w.kvd.is_some()) {
            return Value::Null;
        }
        if let Some(w) = all.iter().find(|w| !w.flags.kvd && w.kvd.is_none()) {
            self.f.note(&w.path, format!("kvd ran beside some roles only; spec.kvCache runs it beside every engine pod, the {} workers too", w.role));
        }
        let mut kv = json!({"enabled": true});
        if let Some(w) = all.iter().find(|w| w.kvd.is_some())
            && let Some(c) = &w.kvd
        {
            self.kvd_flags(w, c, &mut kv);
        }
        kv
    }

    fn kvd_flags(&mut self, w: &Worker, c: &super::pod::SideContainer, kv: &mut Value) {
        let flags = match super::command::parse_invocation(&c.words) {
            Ok(inv) => inv.flags,
            Err(why) => {
                self.f.warn(
                    &c.path,
                    format!("{why}: kvd's tiers not read; set spec.kvCache by hand"),
                );
                return;
            }
        };
        let value = |name: &str| {
            flags
                .iter()
                .rev()
                .find(|f| f.name == name)
                .and_then(|f| f.value().map(str::to_owned))
        };
        if let Some(b) = value("--max-bytes").and_then(|b| b.parse::<u64>().ok()) {
            kv["ram"] = json!(bytes_quantity(b));
        }
        if let Some(dir) = value("--long-path") {
            let size = value("--long-bytes").and_then(|b| b.parse::<u64>().ok());
            let mount = c
                .mounts
                .iter()
                .filter(|m| {
                    m.get("mountPath")
                        .and_then(Value::as_str)
                        .is_some_and(|p| dir.starts_with(p.trim_end_matches('/')))
                })
                .max_by_key(|m| {
                    m.get("mountPath")
                        .and_then(Value::as_str)
                        .map_or(0, str::len)
                });
            let volume = mount.and_then(|m| m.get("name")).and_then(|n| {
                w.pod
                    .as_ref()
                    .and_then(|p| p.volume(n.as_str().unwrap_or_default()))
            });
            match (volume.and_then(|v| v.pointer("/hostPath/path")).and_then(Value::as_str), mount, size) {
                (Some(host), Some(m), Some(size)) => {
                    let rest = dir[m["mountPath"].as_str().unwrap_or_default().trim_end_matches('/').len()..].trim_start_matches('/');
                    let path = if rest.is_empty() { host.to_owned() } else { format!("{}/{rest}", host.trim_end_matches('/')) };
                    kv["nvme"] = json!({"path": path, "size": bytes_quantity(size)});
                }
                _ => self.f.warn(&c.path, format!("--long-path {dir}: kvd's NVMe tier is a host directory here (spec.kvCache.nvme.path, under the operator's allowed paths), not a PVC; dropped")),
            }
        }
        for f in &flags {
            if !matches!(
                f.name.as_str(),
                "--max-bytes" | "--long-path" | "--long-bytes" | "--socket"
            ) {
                self.f.warn(
                    &c.path,
                    format!(
                        "{}: a kvd flag with no field in spec.kvCache; dropped",
                        f.words.join(" ")
                    ),
                );
            }
        }
    }

    /// One placement for every engine pod, else each role's in its pod template.
    fn scheduling(&mut self, all: &[&Worker], templates: &mut [Option<Value>]) -> Value {
        let first = &all[0].scheduling;
        if all.iter().all(|w| w.scheduling == *first) {
            let mut v = Value::Object(first.clone());
            rewrite_selectors(&mut v, &mut self.f, &all[0].path, &self.service_labels);
            return v;
        }
        for (w, t) in all.iter().zip(templates.iter_mut()) {
            if w.scheduling.is_empty() {
                continue;
            }
            let t = t.get_or_insert_with(|| json!({}));
            for (key, value) in &w.scheduling {
                t["spec"][key.as_str()] = value.clone();
            }
            rewrite_selectors(t, &mut self.f, &w.path, &self.service_labels);
        }
        Value::Null
    }
}

fn rdma_on(all: &[&Worker]) -> bool {
    all.iter()
        .any(|w| w.rdma_resource.is_some() || w.host_devices)
}

/// A worker's `parallelism`, defaults left out.
fn parallelism(w: &&Worker) -> Map<String, Value> {
    let mut p = Map::new();
    let tp = w.flags.tensor_parallel.unwrap_or(1);
    let dp = w.flags.data_parallel.unwrap_or(1);
    if tp != 1 {
        p.insert("tensorParallelSize".into(), json!(tp));
    }
    if dp != 1 {
        p.insert("dataParallelSize".into(), json!(dp));
    }
    if w.flags.expert_parallel {
        p.insert("expertParallel".into(), json!(true));
    }
    if w.nodes != 1 {
        p.insert("nodesPerWorker".into(), json!(w.nodes));
    }
    if let Some((gpus, _)) = w.gpus {
        let default = (tp * dp / w.nodes).max(1);
        if gpus != default && gpus > 0 {
            p.insert("gpusPerWorker".into(), json!(gpus));
        }
    }
    p
}

/// `host:port` or a URL as an etcd client URL.
fn etcd_url(e: &str) -> String {
    let e = e.trim();
    let with_scheme = if e.contains("://") {
        e.to_owned()
    } else {
        format!("http://{e}")
    };
    let host_port = with_scheme.split("://").nth(1).unwrap_or_default();
    if host_port.contains(':') {
        with_scheme
    } else {
        format!("{with_scheme}:2379")
    }
}

/// Bytes as a Kubernetes quantity (`32Gi` when exact).
fn bytes_quantity(b: u64) -> String {
    const GI: u64 = 1 << 30;
    const MI: u64 = 1 << 20;
    if b.is_multiple_of(GI) {
        format!("{}Gi", b / GI)
    } else if b.is_multiple_of(MI) {
        format!("{}Mi", b / MI)
    } else {
        b.to_string()
    }
}

/// Sets `field` of container `name` in pod template `t`.
fn merge_container_field(t: &mut Value, name: &str, field: &str, value: Value) {
    merge_container_env(t, name, Vec::new());
    if let Some(list) = t["spec"]["containers"].as_array_mut() {
        for c in list.iter_mut().filter(|c| c["name"] == json!(name)) {
            if c["env"] == json!([]) {
                c.as_object_mut().map(|m| m.remove("env"));
            }
            c[field] = value.clone();
        }
    }
}

/// The earlier operator labelled pods `infera.amd.com/service: <service>`; selectors
/// in affinity and spread constraints that name it are pointed at this operator's
/// labels (`infera.amd.com/role`), which `matchExpressions` cannot be: reported.
fn rewrite_selectors(v: &mut Value, f: &mut Findings, path: &str, services: &Map<String, Value>) {
    const SERVICE: &str = "infera.amd.com/service";
    match v {
        Value::Object(m) => {
            if let Some(Value::Object(ml)) = m.get_mut("matchLabels")
                && let Some(svc) = ml.remove(SERVICE)
            {
                match svc
                    .as_str()
                    .and_then(|s| services.get(s))
                    .and_then(Value::as_object)
                {
                    Some(labels) => ml.extend(labels.clone()),
                    None => {
                        f.warn(path, format!("a selector on {SERVICE}={svc}, a service this manifest does not have: dropped from the selector"));
                    }
                }
            }
            if let Some(Value::Array(exprs)) = m.get("matchExpressions")
                && exprs.iter().any(|e| e.get("key") == Some(&json!(SERVICE)))
            {
                f.warn(path, format!("a matchExpressions on {SERVICE}: this operator's pods carry infera.amd.com/role (mixed, prefill, decode) and app.kubernetes.io/component (engine, gateway) instead; rewrite it by hand"));
            }
            for child in m.values_mut() {
                rewrite_selectors(child, f, path, services);
            }
        }
        Value::Array(items) => {
            for item in items {
                rewrite_selectors(item, f, path, services);
            }
        }
        _ => {}
    }
}

/// Reads the documents back as the operator will, and renders them: a conversion the
/// operator would refuse is an error here.
fn check_with_operator(documents: &[Value], f: &mut Findings) {
    let mut idep = None;
    let mut topology = None;
    for d in documents {
        match d.get("kind").and_then(Value::as_str) {
            Some("PDTopology") => match serde_json::from_value::<PDTopology>(d.clone()) {
                Ok(t) => topology = Some(t),
                Err(e) => f.error(
                    "spec",
                    format!("the PDTopology written does not read back: {e}"),
                ),
            },
            _ => match serde_json::from_value::<InferaDeployment>(d.clone()) {
                Ok(i) => idep = Some(i),
                Err(e) => f.error(
                    "spec",
                    format!("the InferaDeployment written does not read back: {e}"),
                ),
            },
        }
    }
    let Some(mut idep) = idep else { return };
    // Rendering names owners and namespaces; the API server would set these.
    idep.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    idep.metadata
        .namespace
        .get_or_insert_with(|| "default".into());
    let mut platform = Platform::with_images(Images::from_registry("registry.invalid", "convert"));
    platform.etcd_endpoints = vec!["http://etcd.invalid:2379".into()];
    platform.nats_url = Some("nats://nats.invalid:4222".into());
    let observed = Observed {
        topology: topology.as_ref(),
        model_ready: true,
        etcd_client_tls: None,
    };
    if let Err(e) = infera_operator::render::render(&idep, observed, &platform) {
        f.error("spec", format!("the operator would refuse the result: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::findings::Severity;

    fn worker(role: &str, replicas: i64, extra: Value) -> Value {
        let mut w = json!({"componentType": "worker", "role": role, "replicas": replicas,
            "args": ["--model-path", "org/model", "--tp-size", "2"],
            "resources": {"gpu": 2}});
        for (k, v) in extra.as_object().unwrap() {
            w[k] = v.clone();
        }
        w
    }

    fn earlier(services: Value) -> Value {
        json!({"apiVersion": API_VERSION, "kind": "InferaDeployment", "metadata": {"name": "mk", "namespace": "ns"},
            "spec": {"image": "registry.invalid/sglang:1", "nats": {"deploy": false}, "services": services}})
    }

    fn errors(c: &Converted) -> Vec<String> {
        c.findings
            .0
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .map(|f| f.to_string())
            .collect()
    }

    #[test]
    fn prefill_and_decode_counts_become_units_of_a_layout() {
        for ((p, d), (layout, units)) in [
            ((2, 4), ("1P2D", 2)),
            ((4, 2), ("2P1D", 2)),
            ((3, 3), ("1P1D", 3)),
            ((3, 2), ("custom", 1)),
        ] {
            let c = convert_deployment(earlier(json!({
                "prefill": worker("prefill", p, json!({})),
                "decode": worker("decode", d, json!({})),
            })));
            assert!(errors(&c).is_empty(), "{:?}", c.findings);
            let (topology, idep) = (&c.documents[0], &c.documents[1]);
            assert_eq!(topology["spec"]["layout"], layout, "{p}P{d}D");
            assert_eq!(
                idep["spec"].get("replicas").cloned().unwrap_or(json!(1)),
                json!(units)
            );
            if layout == "custom" {
                assert_eq!(topology["spec"]["prefill"]["replicas"], 3);
                assert_eq!(topology["spec"]["decode"]["replicas"], 2);
            }
            assert_eq!(
                topology["spec"]["prefill"]["parallelism"],
                json!({"tensorParallelSize": 2})
            );
            assert_eq!(
                idep["spec"]["serving"],
                json!({"mode": "disaggregated", "topologyRef": "mk"})
            );
        }
    }

    #[test]
    fn pools_that_do_not_make_one_deployment_are_errors() {
        let c = convert_deployment(earlier(json!({
            "a": worker("mixed", 1, json!({})),
            "p": worker("prefill", 1, json!({})),
            "d": worker("decode", 1, json!({})),
        })));
        assert!(c.documents.is_empty());
        assert!(
            errors(&c)[0].contains("mixed workers (a) beside prefill/decode"),
            "{:?}",
            errors(&c)
        );
        let c = convert_deployment(earlier(json!({"p": worker("prefill", 1, json!({}))})));
        assert!(
            errors(&c)[0].contains("prefill workers need decode workers"),
            "{:?}",
            errors(&c)
        );
    }

    #[test]
    fn placement_per_role_goes_to_role_templates_with_selectors_renamed() {
        let anti = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"infera.amd.com/deployment": "mk", "infera.amd.com/service": "d"}}}]}});
        let pod = |node: &str, affinity: Value| {
            json!({"extraPodSpec": {
            "nodeSelector": {"kubernetes.io/hostname": node}, "affinity": affinity,
            "containers": [{"name": "main", "image": "registry.invalid/sglang:1",
                "command": ["python3", "-m", "infera.engine.sglang", "--model-path", "org/model", "--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"],
                "resources": {"limits": {"amd.com/gpu": 2}}}]}})
        };
        let c = convert_deployment(earlier(json!({
            "p": worker("prefill", 1, pod("node-a", json!({}))),
            "d": worker("decode", 1, pod("node-b", anti)),
        })));
        assert!(errors(&c).is_empty(), "{:?}", c.findings);
        let idep = &c.documents[1];
        assert!(idep["spec"].get("scheduling").is_none());
        let rt = &idep["spec"]["engine"]["rolePodTemplates"];
        assert_eq!(
            rt["prefill"]["spec"]["nodeSelector"],
            json!({"kubernetes.io/hostname": "node-a"})
        );
        let selector = &rt["decode"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0]["labelSelector"]["matchLabels"];
        assert_eq!(
            selector,
            &json!({"infera.amd.com/deployment": "mk", "infera.amd.com/role": "decode", "app.kubernetes.io/component": "engine"})
        );
        // Data-parallel attention stays an SGLang flag: its ranks share the TP GPUs.
        assert_eq!(
            idep["spec"]["engine"]["args"],
            json!(["--enable-dp-attention", "--dp-size", "2"])
        );
    }

    #[test]
    fn what_the_earlier_launchers_read_from_env_and_flags_is_kept() {
        let pod = |role: &str, graphs: &[&str]| {
            let mut command: Vec<String> = [
                "python3",
                "-m",
                "infera.engine.vllm",
                "--model",
                "/models/m",
                "--tokenizer",
                "/models/m/tok",
                "--cuda-graph-sizes",
            ]
            .iter()
            .map(|w| (*w).to_owned())
            .collect();
            command.extend(graphs.iter().map(|g| (*g).to_owned()));
            command.extend([
                "--kv-transfer-config".to_owned(),
                r#"{"kv_connector":"MoRIIOConnector"}"#.to_owned(),
                "--max-num-seqs".to_owned(),
                "$SEQS".to_owned(),
            ]);
            worker(
                role,
                1,
                json!({"args": null, "extraPodSpec": {
                "containers": [{"name": "main", "image": "registry.invalid/vllm:1", "command": command,
                    "env": [{"name": "INFERA_DRAIN_TIMEOUT", "value": "300"}, {"name": "NATS_SERVER", "value": "nats://bus.infra:4222"},
                        {"name": "INFERA_DEFAULT_KV_FP8", "value": "0"}, {"name": "VLLM_MORIIO_CONNECTOR_READ_MODE", "value": "1"}],
                    "volumeMounts": [{"name": "models", "mountPath": "/models"}]}],
                "volumes": [{"name": "models", "hostPath": {"path": "/mnt/w"}}]}}),
            )
        };
        let mut doc = earlier(
            json!({"p": pod("prefill", &["1", "2", "4"]), "d": pod("decode", &["1", "2", "8"])}),
        );
        doc["spec"]["nats"] = json!({"deploy": true});
        let c = convert_deployment(doc);
        assert!(errors(&c).is_empty(), "{:?}", c.findings);
        let (topology, idep) = (&c.documents[0], &c.documents[1]);
        let spec = &idep["spec"];
        assert_eq!(spec["engine"]["drainSeconds"], 300);
        assert_eq!(spec["engine"]["kvCacheDtype"], "auto");
        assert_eq!(
            spec["messaging"],
            json!({"backend": "nats", "natsUrl": "nats://bus.infra:4222"})
        );
        assert_eq!(
            topology["spec"]["transport"],
            json!({"backend": "mori", "readMode": true})
        );
        assert_eq!(
            spec["model"]["source"],
            json!({"hostPath": {"path": "/mnt/w/m"}})
        );
        assert_eq!(spec["model"]["tokenizer"], "tok");
        // Multi-valued flags stay whole: shared when equal, per role when not; paths in
        // the model folder move to where the operator mounts it.
        assert_eq!(
            spec["engine"]["args"],
            json!(["--max-num-seqs", "$SEQS", "--tokenizer", "/model-store/tok"])
        );
        assert_eq!(
            topology["spec"]["prefill"]["args"],
            json!(["--cuda-graph-sizes", "1", "2", "4"])
        );
        assert_eq!(
            topology["spec"]["decode"]["args"],
            json!(["--cuda-graph-sizes", "1", "2", "8"])
        );
        assert!(spec["engine"].get("env").is_none(), "{spec}");
        assert!(
            c.findings.0.iter().any(|f| f.severity == Severity::Warning
                && f.message
                    .starts_with("--max-num-seqs $SEQS: a shell variable")),
            "{:?}",
            c.findings
        );
    }
}
