//! One earlier `InferaDeployment` (the Go operator's schema) converted: its services
//! read (`worker`, `server`), then put together as this project's `InferaDeployment`,
//! plus the `PDTopology` that prefill and decode services imply. The result is checked
//! the way the operator will check it (the typed read-back and a render), so what is
//! written is what the operator runs.

use super::fields::Fields;
use super::findings::Findings;
use super::server::{Server, merge_container_env, read_server};
use super::worker::rdma_on;
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
    let gaie = read_gaie(&mut spec, &name, &mut f);
    let envs = spec.take_list("envs", &mut f);
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
        gaie,
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
            if n.len() > infera_operator::names::MAX_NAME_LEN {
                f.error("metadata.name", format!("{n:?} is longer than {} characters (pod names add a role, an ordinal and a hash within the 63-character label limit): rename it", infera_operator::names::MAX_NAME_LEN));
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

/// `spec.gaie` as `spec.gateway.inferencePool` (with the tokenizer for
/// `spec.gateway.tokenizer` when it is a path): the same InferencePool, picker,
/// HTTPRoute and, for prefill/decode, decode-pod frontends.
fn read_gaie(spec: &mut Fields, name: &str, f: &mut Findings) -> Option<Gaie> {
    let mut gaie = spec.take_fields("gaie", f)?;
    let enabled = gaie.take_bool("enabled", f).unwrap_or(false);
    if !enabled {
        drop(gaie);
        f.note(
            "spec.gaie",
            "enabled is false: the earlier operator built none of it; not carried over",
        );
        return None;
    }
    let mut pool = Map::new();
    let mut tokenizer = None;
    if gaie.take("eppImage").is_some() {
        f.warn(gaie.at("eppImage"), "the picker is Infera's gateway image here (spec.gateway.image, default the operator's), not the earlier Python picker's; dropped");
    }
    match gaie.take_str("tokenizerPath", f) {
        Some(path) if path.starts_with('/') => tokenizer = Some(path),
        Some(path) => f.note(gaie.at("tokenizerPath"), format!("{path:?} is a model id: the picker uses the workers' own tokenizer (the model's, fetched from their sidecars); dropped")),
        None => {}
    }
    let mut gateway_ref = Map::new();
    if let Some(name) = gaie.take_str("gatewayName", f) {
        gateway_ref.insert("name".into(), json!(name));
    }
    if let Some(ns) = gaie.take_str("gatewayNamespace", f) {
        if gateway_ref.contains_key("name") {
            gateway_ref.insert("namespace".into(), json!(ns));
        } else {
            f.warn(
                gaie.at("gatewayNamespace"),
                "no gatewayName with it; dropped",
            );
        }
    }
    if !gateway_ref.is_empty() {
        pool.insert("gatewayRef".into(), Value::Object(gateway_ref));
    }
    let hostnames = gaie.take_strings("hostnames", f);
    if !hostnames.is_empty() {
        if pool.contains_key("gatewayRef") {
            pool.insert("hostnames".into(), json!(hostnames));
        } else {
            f.warn(
                gaie.at("hostnames"),
                "the HTTPRoute they belong to needs gatewayName; dropped",
            );
        }
    }
    let frontend_port = gaie.take_int("frontendPort", f);
    if gaie.take("modelName").is_some() {
        f.note(gaie.at("modelName"), "informational in the earlier operator (requests are routed by the picker's headers); the served name is spec.model.name; dropped");
    }
    let path = gaie.path().to_owned();
    gaie.report_rest(f, "not a field of the earlier schema; dropped");
    f.warn(&path, format!("carried over as spec.gateway.inferencePool, whose InferencePool {name}-pool, HTTPRoute {name}-route and picker Deployment and Service {name}-epp have the names of the earlier operator's: delete those before applying the result (README, switching a cluster over); two pickers run here, one did"));
    Some(Gaie {
        pool,
        tokenizer,
        frontend_port,
        path,
    })
}

/// The earlier `spec.gaie`, read.
pub(super) struct Gaie {
    /// `spec.gateway.inferencePool` without the frontend port.
    pool: Map<String, Value>,
    /// An absolute tokenizer path, for `spec.gateway.tokenizer`.
    tokenizer: Option<String>,
    /// `frontendPort`, placed once the roles are known.
    frontend_port: Option<i64>,
    /// Where it was (`spec.gaie`).
    path: String,
}

impl Gaie {
    /// Into `gateway` (the converted `spec.gateway`), for workers `disaggregated` or not.
    fn place(mut self, gateway: &mut Map<String, Value>, disaggregated: bool, f: &mut Findings) {
        let at = format!("{}.frontendPort", self.path);
        match (self.frontend_port, disaggregated) {
            (Some(port), false) => f.note(at, format!("{port}: mixed workers are the pool's endpoints themselves here, on the engine port 8000 (no frontend); dropped")),
            (Some(port), true) if port == i64::from(infera_operator::render::engine::ENGINE_PORT) => f.warn(at, format!("{port} is the engine's port here: the decode pods' frontends listen on {} (the pool's target port)", infera_operator::api::DEFAULT_FRONTEND_PORT)),
            (Some(port), true) => {
                self.pool.insert("frontendPort".into(), json!(port));
            }
            (None, _) => {}
        }
        if let Some(t) = self.tokenizer
            && !gateway.contains_key("tokenizer")
        {
            gateway.insert("tokenizer".into(), json!(t));
        }
        gateway.insert("inferencePool".into(), Value::Object(self.pool));
    }
}

/// The discovery and messaging the earlier spec chose.
pub(super) struct Discovery {
    pub(super) backend: Option<String>,
    pub(super) etcd_endpoint: Option<String>,
    pub(super) nats_deployed: bool,
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

pub(super) struct Build {
    pub(super) name: String,
    pub(super) f: Findings,
    pub(super) services_path: String,
    pub(super) image: Option<String>,
    /// This operator's pod labels for each earlier service name.
    pub(super) service_labels: Map<String, Value>,
    /// `spec.gaie`, for `spec.gateway.inferencePool`.
    pub(super) gaie: Option<Gaie>,
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

pub(super) fn set(map: &mut Map<String, Value>, key: &str, value: Value) {
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
        let mut gateway = self.gateway(server.gateway.clone(), &server, &model_path, &all);
        if let Some(gaie) = self.gaie.take() {
            gaie.place(&mut gateway, spec.contains_key("serving"), &mut self.f);
        }
        set(&mut spec, "gateway", Value::Object(gateway));
        set(&mut spec, "discovery", self.discovery(&all, &server, disc));
        set(&mut spec, "messaging", self.messaging(&all, &server, disc));
        set(&mut spec, "kvCache", self.kv_cache(&all));
        set(&mut spec, "scheduling", scheduling);
        let idep = json!({"apiVersion": API_VERSION, "kind": "InferaDeployment", "metadata": metadata, "spec": spec});
        topology.into_iter().chain([idep]).collect()
    }
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
        ..Default::default()
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
                "--lora-modules".to_owned(),
                "/models/lora".to_owned(),
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
            json!([
                "--max-num-seqs",
                "$SEQS",
                "--lora-modules",
                "/models/lora",
                "--tokenizer",
                "/model-store/tok"
            ])
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
        assert!(
            c.findings.0.iter().any(|f| f.severity == Severity::Warning
                && f.message.starts_with(
                    "/models/lora: on the model's volume (/models) but outside the model folder"
                )),
            "{:?}",
            c.findings
        );
    }

    #[test]
    fn router_flags_the_gateway_reads_from_env_are_carried_there() {
        let router = json!({"componentType": "server", "args": ["--router-mode", "direct", "--request-max-retries", "2",
            "--breaker-failure-threshold", "0", "--router-backend", "python", "--kv-overlap-weight", "3",
            "--enable-profiling", "--enable-scaling-api", "--kvd-socket-path", "/run/kvd.sock"]});
        let c = convert_deployment(earlier(
            json!({"router": router, "w": worker("mixed", 1, json!({}))}),
        ));
        assert!(errors(&c).is_empty(), "{:?}", c.findings);
        let gateway = &c.documents[0]["spec"]["gateway"];
        assert_eq!(
            gateway["podTemplate"]["spec"]["containers"],
            json!([{"name": "gateway", "env": [
                {"name": "INFERA_ROUTER_MODE", "value": "direct"},
                {"name": "INFERA_REQUEST_MAX_RETRIES", "value": "2"},
                {"name": "INFERA_BREAKER_FAILURE_THRESHOLD", "value": "0"},
                {"name": "INFERA_ENABLE_PROFILING", "value": "1"},
            ]}])
        );
        assert_eq!(gateway["scalingApi"], true);
        assert_eq!(
            (
                gateway["kvOverlapWeight"].clone(),
                gateway["kvPrefillOverlapWeight"].clone()
            ),
            (json!(3.0), json!(3.0))
        );
        let warned: Vec<&str> = c
            .findings
            .0
            .iter()
            .filter(|f| f.severity == Severity::Warning)
            .map(|f| f.message.as_str())
            .collect();
        assert!(
            warned.is_empty(),
            "every earlier router flag is carried or accepted: {warned:?}"
        );
        let noted = |prefix: &str| {
            c.findings
                .0
                .iter()
                .any(|f| f.severity == Severity::Note && f.message.starts_with(prefix))
        };
        for prefix in [
            "--router-backend python: the gateway is a Rust router",
            "--enable-scaling-api: spec.gateway.scalingApi: true",
            "--kvd-socket-path: dropped",
            "--breaker-failure-threshold 0: no field of spec.gateway",
        ] {
            assert!(noted(prefix), "{prefix}: {:?}", c.findings);
        }
    }
}
