//! The earlier router service (`componentType: server`, `python -m infera.server`) read
//! into `spec.gateway`: replicas, port, policy and weights, resources, placement, and a
//! pod template for what is left. Its image is not kept: the gateway is this project's.

use super::command::{Program, parse_invocation};
use super::fields::Fields;
use super::findings::Findings;
use super::pod::{OPERATOR_ENV, take_apart, take_cpu_memory, take_pod_labels};
use serde_json::{Map, Value, json};

/// The earlier router's port.
pub const DEFAULT_SERVER_PORT: i64 = 8000;

/// What the router service says.
#[derive(Debug, Clone, Default)]
pub struct Server {
    /// `spec.gateway` fields.
    pub gateway: Map<String, Value>,
    /// `--router-tokenizer-path`, and where.
    pub tokenizer: Option<(String, String)>,
    /// `--kv-event-transport`.
    pub kv_event_transport: Option<String>,
    /// `--nats-server`.
    pub nats_server: Option<String>,
    /// `--etcd-prefix`.
    pub etcd_prefix: Option<String>,
    /// Router flags the gateway reads from its env (no `spec.gateway` field).
    pub env: Vec<Value>,
}

/// Reads router service `name` (its `componentType` already taken).
pub fn read_server(mut svc: Fields, findings: &mut Findings) -> Server {
    let mut s = Server::default();
    let g = &mut s.gateway;
    if svc.take("role").is_some() {
        findings.note(svc.at("role"), "not read for a server, as before");
    }
    if let Some(n) = svc.take_int("replicas", findings) {
        g.insert("replicas".into(), json!(n));
    }
    if svc
        .take_int("numberOfNodes", findings)
        .is_some_and(|n| n > 1)
    {
        findings.warn(
            svc.at("numberOfNodes"),
            "a gateway runs on one node; dropped",
        );
    }
    if svc.take("skipReadinessProbe").is_some() {
        findings.note(
            svc.at("skipReadinessProbe"),
            "not read for a server, as before",
        );
    }
    if svc.take_str("image", findings).is_some() {
        findings.note(svc.at("image"), "the gateway runs the Infera image (spec.gateway.image names a mirror of it); the earlier router image is not used");
    }
    let mut port = svc.take_int("port", findings);
    let labels = take_pod_labels(&mut svc, &[], findings);
    let mut env: Vec<Value> = svc.take_list("env", findings);
    let mut words = [
        vec!["python3".into(), "-m".into(), "infera.server".into()],
        svc.take_strings("args", findings),
    ]
    .concat();
    let mut words_path = svc.at("args");
    let mut resources = Map::new();
    if let Some(mut r) = svc.take_fields("resources", findings) {
        resources = take_cpu_memory(&mut r, findings);
        r.report_rest(
            findings,
            "a gateway needs no GPUs or shared memory; dropped",
        );
    }
    let mut template = None;
    if let Some(pod) = svc.take("extraPodSpec") {
        let path = svc.at("extraPodSpec");
        let mut parts = take_apart(&path, pod, findings);
        if let Some(image) = &parts.image {
            findings.note(format!("{}.image", parts.main_path), format!("{image}: the gateway runs the Infera image (spec.gateway.image names a mirror of it); the earlier router image is not used"));
        }
        words = std::mem::take(&mut parts.words);
        words_path = parts.main_path.clone();
        if parts.startup_seconds.is_some() {
            findings.note(
                format!("{}.startupProbe", parts.main_path),
                "the gateway's probes are the operator's; dropped",
            );
        }
        if parts.host_network {
            findings.note(
                format!("{path}.hostNetwork"),
                "gateways run on the pod network; dropped",
            );
        }
        if parts.privileged || !parts.capabilities.is_empty() {
            findings.note(
                format!("{}.securityContext", parts.main_path),
                "a gateway needs no privileges or capabilities; dropped",
            );
        }
        env = std::mem::take(&mut parts.env);
        resources = std::mem::take(&mut parts.resources);
        for section in ["requests", "limits"] {
            if let Some(Value::Object(list)) = resources.get_mut(section) {
                list.retain(|k, _| !k.contains("gpu"));
            }
        }
        if !parts.scheduling.is_empty() {
            g.insert(
                "scheduling".into(),
                Value::Object(std::mem::take(&mut parts.scheduling)),
            );
        }
        if !parts.mounts.is_empty() {
            findings.note(
                format!("{}.volumeMounts", parts.main_path),
                "the gateway reads the tokenizer from the model's source or from the workers; the earlier router's mounts (model, overlay) are not kept",
            );
            let names: Vec<String> = parts
                .mounts
                .iter()
                .filter_map(|m| m.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect();
            parts.drop_mounts_of(&names);
        }
        template = Some(parts);
    }
    svc.report_rest(findings, "not a field of the earlier schema; dropped");
    env.retain(|e| {
        !OPERATOR_ENV.contains(&e.get("name").and_then(Value::as_str).unwrap_or_default())
    });
    if !resources.is_empty() {
        g.insert("resources".into(), Value::Object(resources));
    }
    match parse_invocation(&words) {
        Ok(inv) if inv.program == Program::Server => {
            if !inv.wrapper.is_empty() {
                findings.note(
                    &words_path,
                    format!(
                        "ran through {}: the operator runs the gateway itself",
                        inv.wrapper.join(" ")
                    ),
                );
            }
            for flag in inv.flags {
                read_server_flag(&flag, &words_path, &mut s, &mut port, findings);
            }
        }
        Ok(_) => findings.error(
            &words_path,
            "a server service must run python3 -m infera.server",
        ),
        Err(why) => findings.error(
            &words_path,
            format!("{why}: the operator runs the gateway itself; set spec.gateway by hand"),
        ),
    }
    // The earlier router weighed prefill and decode picks with --kv-overlap-weight
    // unless their own flags were given.
    let g = &mut s.gateway;
    match g.get("kvOverlapWeight").cloned() {
        Some(w) => {
            for field in ["kvPrefillOverlapWeight", "kvDecodeOverlapWeight"] {
                g.entry(field).or_insert_with(|| w.clone());
            }
        }
        None if !g.contains_key("kvPrefillOverlapWeight") && !g.contains_key("kvDecodeOverlapWeight") => findings.note(
            &words_path,
            "no cache weights given: the earlier router weighed cached blocks 1 against load (prefill and decode alike), this gateway 4, 20 and 2 (README, defaults that differ); set spec.gateway.kvOverlapWeight, kvPrefillOverlapWeight and kvDecodeOverlapWeight to 1 to keep the earlier routing",
        ),
        None => {}
    }
    if let Some(p) = port.filter(|p| *p != DEFAULT_SERVER_PORT) {
        s.gateway.insert("service".into(), json!({"port": p}));
    }
    let mut pod =
        template.and_then(|parts| parts.into_template("gateway", labels.clone(), findings));
    if pod.is_none() && !labels.is_empty() {
        pod = Some(json!({"metadata": {"labels": labels}}));
    }
    env.append(&mut s.env);
    if !env.is_empty() {
        let p = pod.get_or_insert_with(|| json!({}));
        merge_container_env(p, "gateway", env);
    }
    if let Some(p) = pod {
        s.gateway.insert("podTemplate".into(), p);
    }
    s
}

/// Adds `env` to container `name` of pod template `template`.
pub fn merge_container_env(template: &mut Value, name: &str, env: Vec<Value>) {
    let containers = template["spec"]["containers"].as_array_mut();
    match containers {
        Some(list) => {
            if let Some(c) = list.iter_mut().find(|c| c["name"] == json!(name)) {
                c["env"] = Value::Array(env);
            } else {
                list.insert(0, json!({"name": name, "env": env}));
            }
        }
        None => template["spec"]["containers"] = json!([{"name": name, "env": env}]),
    }
}

/// Router flags this gateway reads from its env too.
const GATEWAY_ENV: &[(&str, &str)] = &[
    ("--router-mode", "INFERA_ROUTER_MODE"),
    ("--request-max-retries", "INFERA_REQUEST_MAX_RETRIES"),
    (
        "--breaker-failure-threshold",
        "INFERA_BREAKER_FAILURE_THRESHOLD",
    ),
    ("--breaker-cooldown-s", "INFERA_BREAKER_COOLDOWN_S"),
    ("--breaker-max-cooldown-s", "INFERA_BREAKER_MAX_COOLDOWN_S"),
];

fn read_server_flag(
    flag: &super::command::Flag,
    path: &str,
    s: &mut Server,
    port: &mut Option<i64>,
    findings: &mut Findings,
) {
    let value = flag.value().map(str::to_owned);
    let number = || value.as_deref().and_then(|v| v.parse::<f64>().ok());
    match flag.name.as_str() {
        "--host" | "--discovery-backend" | "--etcd-endpoint" | "--k8s-label-selector" | "--k8s-namespace" => {}
        "--etcd-prefix" => s.etcd_prefix = value,
        "--port" => *port = value.as_deref().and_then(|v| v.parse().ok()),
        "--router-policy" => match value.as_deref() {
            Some(p @ ("kv-aware" | "round-robin" | "random")) => {
                s.gateway.insert("policy".into(), json!(p));
            }
            other => findings.warn(path, format!("--router-policy {}: not a policy here (kv-aware, round-robin, random); the default kv-aware is used", other.unwrap_or_default())),
        },
        name @ ("--kv-overlap-weight" | "--kv-prefill-overlap-weight" | "--kv-decode-overlap-weight") if number().is_some() => {
            let field = match name {
                "--kv-overlap-weight" => "kvOverlapWeight",
                "--kv-prefill-overlap-weight" => "kvPrefillOverlapWeight",
                _ => "kvDecodeOverlapWeight",
            };
            s.gateway.insert(field.into(), json!(number()));
        }
        "--router-tokenizer-path" => s.tokenizer = value.map(|v| (v, path.to_owned())),
        "--kv-event-transport" => s.kv_event_transport = value,
        "--nats-server" => s.nats_server = value,
        "--request-transport" => {
            if value.as_deref() != Some("http") {
                findings.note(path, "--request-transport nats: the gateway reaches workers over HTTP (the NATS request plane is not built here)");
            }
        }
        "--router-backend" => findings.note(
            path,
            format!("{}: the gateway is a Rust router and accepts the flag choosing nothing; dropped", flag.words.join(" ")),
        ),
        "--enable-scaling-api" => {
            s.gateway.insert("scalingApi".into(), json!(true));
            findings.note(path, "--enable-scaling-api: spec.gateway.scalingApi: true (the gateways get a Role to get and patch this deployment, and the flag)");
        }
        "--enable-profiling" => {
            findings.note(path, "--enable-profiling: no field of spec.gateway; carried as the gateway container's INFERA_ENABLE_PROFILING");
            s.env.push(json!({"name": "INFERA_ENABLE_PROFILING", "value": "1"}));
        }
        "--kvd-socket-path" => findings.note(
            path,
            "--kvd-socket-path: dropped; with spec.kvCache the gateways send prewarm hints through each worker's sidecar to the kvd beside it",
        ),
        name => match GATEWAY_ENV.iter().find(|(f, _)| *f == name) {
            Some((_, var)) if value.is_some() => {
                findings.note(path, format!("{}: no field of spec.gateway; carried as the gateway container's {var}", flag.words.join(" ")));
                s.env.push(json!({"name": var, "value": value}));
            }
            _ => findings.warn(
                path,
                format!("{}: no field of spec.gateway holds it (the operator renders the gateway's flags); dropped", flag.words.join(" ")),
            ),
        },
    }
}
