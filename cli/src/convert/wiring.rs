//! Where the converted deployment connects: the prefill/decode transport, RDMA, the
//! gateway, discovery, messaging, kvd and placement, each read from what the earlier
//! services said, with selectors on the earlier operator's labels rewritten to this
//! operator's.

use super::deployment::{Build, Discovery};
use super::findings::Findings;
use super::server::Server;
use super::worker::{Worker, rdma_on};
use serde_json::{Map, Value, json};

impl Build {
    pub(super) fn transport(&mut self, p: &Worker, d: &Worker) -> Value {
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

    pub(super) fn network(&mut self, all: &[&Worker]) -> Value {
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

    pub(super) fn gateway(
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

    pub(super) fn discovery(
        &mut self,
        all: &[&Worker],
        server: &Server,
        disc: &Discovery,
    ) -> Value {
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

    pub(super) fn messaging(
        &mut self,
        all: &[&Worker],
        server: &Server,
        disc: &Discovery,
    ) -> Value {
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

    pub(super) fn kv_cache(&mut self, all: &[&Worker]) -> Value {
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

    pub(super) fn kvd_flags(&mut self, w: &Worker, c: &super::pod::SideContainer, kv: &mut Value) {
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
            let host = w
                .pod
                .as_ref()
                .and_then(|p| p.locate(&c.mounts, &dir))
                .and_then(|place| place.host_path());
            match (host, size) {
                (Some(path), Some(size)) => {
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
    pub(super) fn scheduling(&mut self, all: &[&Worker], templates: &mut [Option<Value>]) -> Value {
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

/// The earlier operator labelled pods `infera.amd.com/service: <service>`; selectors
/// in affinity and spread constraints that name it are pointed at this operator's
/// labels (`infera.amd.com/role`), which `matchExpressions` cannot be: reported.
pub(super) fn rewrite_selectors(
    v: &mut Value,
    f: &mut Findings,
    path: &str,
    services: &Map<String, Value>,
) {
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
