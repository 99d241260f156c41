//! An earlier engine launcher's flags (`python -m infera.engine.<engine> ...`), sorted
//! into what becomes a field of the `InferaDeployment` or `PDTopology`, what the
//! operator now renders itself (ports, role, discovery), what has no equivalent
//! (reported), and the rest: engine flags passed on verbatim.

use super::command::Flag;
use super::findings::Findings;
use serde_json::Value;

/// The KV transport a prefill/decode worker was given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transport {
    /// `mooncake`, `mori` or `nixl`.
    pub backend: Option<String>,
    /// MoRI read mode.
    pub read_mode: bool,
    /// SGLang's bootstrap port.
    pub bootstrap_port: Option<i64>,
    /// Connector handshake port.
    pub handshake_port: Option<i64>,
    /// Connector notify port.
    pub notify_port: Option<i64>,
}

/// What a worker's flags say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineFlags {
    /// `--model` / `--model-path`, and where it was written.
    pub model: Option<String>,
    /// `--served-model-name`.
    pub served_name: Option<String>,
    /// `--tokenizer` / `--tokenizer-path` as written.
    pub tokenizer: Option<Flag>,
    /// Tensor-parallel size.
    pub tensor_parallel: Option<i64>,
    /// Data-parallel size.
    pub data_parallel: Option<i64>,
    /// Expert parallelism on.
    pub expert_parallel: bool,
    /// `fp8` or `mxfp4`.
    pub quantization: Option<String>,
    /// `fp8`, `auto` or `bf16`.
    pub kv_cache_dtype: Option<String>,
    /// `--disaggregation-mode` as written.
    pub disaggregation_mode: Option<String>,
    /// The prefill/decode transport.
    pub transport: Transport,
    /// kvd wired in (`--infera-kvd-socket`, vLLM's `InferaKvdConnector`).
    pub kvd: bool,
    /// `--drain-timeout`, whole seconds.
    pub drain_seconds: Option<i64>,
    /// `--kv-event-transport`.
    pub kv_event_transport: Option<String>,
    /// `--nats-server`.
    pub nats_server: Option<String>,
    /// `--discovery-backend`.
    pub discovery: Option<String>,
    /// `--etcd-endpoint`.
    pub etcd_endpoint: Option<String>,
    /// `--etcd-prefix`.
    pub etcd_prefix: Option<String>,
    /// `--disaggregation-ib-device` (SGLang).
    pub ib_devices: Vec<String>,
    /// KV events on (the earlier launchers' `--enable-kv-events`, default on).
    pub kv_events: bool,
    /// Engine flags passed on verbatim.
    pub args: Vec<Flag>,
}

/// Flags of the earlier launchers that the operator renders itself now.
const RENDERED: &[&str] = &[
    "--host",
    "--port",
    "--server-port",
    "--k8s-namespace",
    "--advertise-host",
    "--kv-events-bind",
    "--kv-events-advertise",
    "--kv-snapshot-host",
    "--kv-snapshot-port",
    "--kv-snapshot-advertise",
    "--enable-kv-events",
];

/// Flags read into fields, each with one value.
const SINGLE_VALUED: &[&str] = &[
    "--model",
    "--model-path",
    "--tokenizer",
    "--tokenizer-path",
    "--tensor-parallel-size",
    "-tp",
    "--tp-size",
    "--tp",
    "--data-parallel-size",
    "-dp",
    "--dp-size",
    "--dp",
    "--quantization",
    "-q",
    "--kv-cache-dtype",
    "--kv_cache_dtype",
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--disaggregation-bootstrap-port",
    "--disaggregation-ib-device",
    "--kv-transfer-config",
    "--drain-timeout",
    "--kv-event-transport",
    "--nats-server",
    "--discovery-backend",
    "--etcd-endpoint",
    "--etcd-prefix",
    "--request-transport",
    "--host",
    "--port",
];

/// Multi-node rendezvous flags: rendered for `nodesPerWorker` > 1.
const MULTI_NODE: &[&str] = &[
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--master-addr",
    "--master-port",
];

/// Reads `flags` of an `engine` launcher; `path` is where they were written.
pub fn read_engine_flags(
    engine: &str,
    flags: &[Flag],
    path: &str,
    findings: &mut Findings,
) -> EngineFlags {
    let mut out = EngineFlags {
        kv_events: true,
        ..EngineFlags::default()
    };
    let mut split = Vec::new();
    for flag in flags {
        // A flag read into a field takes one value; words after it are positional
        // (verbatim). Other flags keep all their values (`--cuda-graph-bs 1 2 4`).
        if flag.values.len() > 1
            && SINGLE_VALUED.contains(&flag.name.as_str())
            && !flag.words[0].contains('=')
        {
            let mut head = flag.clone();
            head.values.truncate(1);
            head.words.truncate(2);
            split.push(head);
            for w in &flag.values[1..] {
                split.push(Flag {
                    name: String::new(),
                    values: vec![w.clone()],
                    words: vec![w.clone()],
                });
            }
        } else {
            split.push(flag.clone());
        }
    }
    for flag in &split {
        let name = flag.name.as_str();
        let value = flag.value().map(str::to_owned);
        let int = || value.as_deref().and_then(|v| v.parse::<i64>().ok());
        match name {
            "--model" | "--model-path" => out.model = value,
            "" if engine == "vllm" && out.model.is_none() && out.args.is_empty() => {
                out.model = value;
            }
            "--served-model-name" => {
                if flag.values.len() > 1 {
                    findings.warn(
                        path,
                        format!(
                            "{name}: several names ({}); the deployment serves one, spec.model.name = {:?}",
                            flag.values.join(", "),
                            flag.values[0]
                        ),
                    );
                }
                out.served_name = value;
            }
            "--tokenizer" | "--tokenizer-path" => out.tokenizer = Some(flag.clone()),
            "--tensor-parallel-size" | "-tp" | "--tp-size" | "--tp" if int().is_some() => {
                out.tensor_parallel = int();
            }
            "--data-parallel-size" | "-dp" | "--dp-size" | "--dp" if int().is_some() => {
                out.data_parallel = int();
            }
            "--enable-expert-parallel" | "--enable-ep-moe" | "-ep" => out.expert_parallel = true,
            "--quantization" | "-q" if matches!(value.as_deref(), Some("fp8" | "mxfp4")) => {
                out.quantization = value;
            }
            "--kv-cache-dtype" | "--kv_cache_dtype" => match kv_cache_dtype(value.as_deref()) {
                Some(dtype) => out.kv_cache_dtype = Some(dtype.into()),
                None => out.args.push(flag.clone()),
            },
            "--disaggregation-mode" => out.disaggregation_mode = value,
            "--disaggregation-transfer-backend" => out.transport.backend = value,
            "--disaggregation-bootstrap-port" if int().is_some() => {
                out.transport.bootstrap_port = int();
            }
            "--disaggregation-ib-device" => {
                out.ib_devices = value
                    .unwrap_or_default()
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
            }
            "--kv-transfer-config" => {
                read_kv_transfer_config(value.as_deref(), path, &mut out, findings);
            }
            "--infera-kvd-socket" => out.kvd = true,
            "--hicache-storage-backend" if value.as_deref() == Some("infera-kvd") => out.kvd = true,
            "--drain-timeout" => match value.as_deref().and_then(|v| v.parse::<f64>().ok()) {
                Some(s) if s.is_finite() && s >= 0.0 => out.drain_seconds = Some(s.ceil() as i64),
                _ => findings.warn(path, format!("{name} {value:?}: not a number of seconds; spec.engine.drainSeconds keeps its default")),
            },
            "--kv-event-transport" => out.kv_event_transport = value,
            "--nats-server" => out.nats_server = value,
            "--discovery-backend" => out.discovery = value,
            "--etcd-endpoint" => out.etcd_endpoint = value,
            "--etcd-prefix" => out.etcd_prefix = value,
            "--request-transport" => {
                if value.as_deref() != Some("http") {
                    findings.note(path, format!("{name} {}: the gateway reaches workers over HTTP (the NATS request plane is not built here)", value.unwrap_or_default()));
                }
            }
            "--no-enable-kv-events" | "--kv-events" if name == "--no-enable-kv-events" || value.as_deref() == Some("off") => {
                findings.note(path, format!("{}: the operator turns KV events on for kv-aware gateways (spec.gateway.policy) and off otherwise", flag.words.join(" ")));
            }
            "--kv-events" => {}
            "--index-block-size" | "--disaggregation-allow-tcp" | "--nats-req-idle-timeout"
            | "--nats-req-max-duration" | "--nats-req-max-pending" => findings.warn(
                path,
                format!("{}: an earlier launcher flag with no equivalent here; dropped", flag.words.join(" ")),
            ),
            n if RENDERED.contains(&n) || MULTI_NODE.contains(&n) => {}
            _ => {
                if flag.words.iter().any(|w| shell_variable(w)) {
                    findings.warn(
                        path,
                        format!("{}: a shell variable, which no shell expands here: write $(NAME) (Kubernetes expands it from the container's env) or the value", flag.words.join(" ")),
                    );
                }
                out.args.push(flag.clone());
            }
        }
    }
    // SGLang's data-parallel attention runs its ranks inside the tensor-parallel GPUs:
    // not the deployment's data parallelism (which multiplies GPUs), so kept verbatim.
    if engine == "sglang"
        && out.args.iter().any(|a| a.name == "--enable-dp-attention")
        && let Some(dp) = out.data_parallel.take()
    {
        let words = vec!["--dp-size".to_owned(), dp.to_string()];
        out.args.push(Flag {
            name: words[0].clone(),
            values: vec![words[1].clone()],
            words,
        });
    }
    out
}

/// `$NAME` or `${NAME}`: what `sh -c` expanded; Kubernetes expands only `$(NAME)`.
fn shell_variable(word: &str) -> bool {
    word.match_indices('$').any(|(i, _)| {
        word[i + 1..]
            .chars()
            .next()
            .is_some_and(|c| c == '{' || c == '_' || c.is_ascii_alphabetic())
    })
}

/// The deployment's `kvCacheDtype` for an engine's `--kv-cache-dtype` value.
fn kv_cache_dtype(value: Option<&str>) -> Option<&'static str> {
    match value? {
        // What the operator renders for fp8 (vLLM `fp8`, an E4M3 cache; SGLang
        // `fp8_e4m3`); other fp8 formats stay verbatim flags.
        "fp8" | "fp8_e4m3" => Some("fp8"),
        "auto" => Some("auto"),
        "bfloat16" | "bf16" => Some("bf16"),
        _ => None,
    }
}

/// vLLM's `--kv-transfer-config`: the prefill/decode connector and kvd's become fields
/// (the operator renders the whole config); anything else is reported.
fn read_kv_transfer_config(
    value: Option<&str>,
    path: &str,
    out: &mut EngineFlags,
    findings: &mut Findings,
) {
    let Some(config) = value.and_then(|v| serde_json::from_str::<Value>(v).ok()) else {
        findings.error(path, "--kv-transfer-config: not JSON");
        return;
    };
    let connectors: Vec<&Value> = match config.get("kv_connector").and_then(Value::as_str) {
        Some("MultiConnector") => config
            .pointer("/kv_connector_extra_config/connectors")
            .and_then(Value::as_array)
            .map(|c| c.iter().collect())
            .unwrap_or_default(),
        _ => vec![&config],
    };
    for c in connectors {
        let extra = c.get("kv_connector_extra_config");
        let port = |key: &str| extra.and_then(|e| e.get(key)).and_then(Value::as_i64);
        match c.get("kv_connector").and_then(Value::as_str) {
            Some("MooncakeConnector" | "mooncake") => {
                out.transport.backend = Some("mooncake".into());
                out.transport.handshake_port = c.get("handshake_port").and_then(Value::as_i64);
            }
            Some("MoRIIOConnector") => {
                out.transport.backend = Some("mori".into());
                out.transport.read_mode = extra
                    .and_then(|e| e.get("read_mode"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                out.transport.handshake_port = port("handshake_port");
                out.transport.notify_port = port("notify_port");
            }
            Some("NixlConnector") => out.transport.backend = Some("nixl".into()),
            Some("InferaKvdConnector") => out.kvd = true,
            other => findings.warn(
                path,
                format!(
                    "--kv-transfer-config: connector {} has no equivalent (the operator renders the prefill/decode and kvd connectors); dropped",
                    other.unwrap_or("<unnamed>")
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::command::group_flags;

    fn read(engine: &str, words: &[&str]) -> (EngineFlags, Findings) {
        let words: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
        let mut findings = Findings::default();
        let flags = read_engine_flags(engine, &group_flags(&words), "p", &mut findings);
        (flags, findings)
    }

    #[test]
    fn sglang_flags_become_fields_and_the_rest_stays() {
        let (f, findings) = read(
            "sglang",
            &[
                "--host",
                "0.0.0.0",
                "--port",
                "30000",
                "--model-path",
                "/models/q",
                "--tp-size",
                "4",
                "--trust-remote-code",
                "--kv-event-transport",
                "zmq",
                "--disaggregation-mode",
                "prefill",
                "--disaggregation-transfer-backend",
                "mori",
                "--disaggregation-ib-device",
                "rdma0,rdma1",
                "--mem-fraction-static",
                "0.8",
                "--kv-cache-dtype",
                "fp8_e4m3",
                "--nats-req-max-pending",
                "4",
            ],
        );
        assert_eq!(f.model.as_deref(), Some("/models/q"));
        assert_eq!(f.tensor_parallel, Some(4));
        assert_eq!(f.transport.backend.as_deref(), Some("mori"));
        assert_eq!(f.ib_devices, ["rdma0", "rdma1"]);
        assert_eq!(f.kv_cache_dtype.as_deref(), Some("fp8"));
        assert_eq!(f.kv_event_transport.as_deref(), Some("zmq"));
        let verbatim: Vec<String> = f.args.iter().flat_map(|a| a.words.clone()).collect();
        assert_eq!(
            verbatim,
            ["--trust-remote-code", "--mem-fraction-static", "0.8"]
        );
        assert_eq!(findings.0.len(), 1, "{findings:?}");
        assert!(
            findings.0[0]
                .message
                .starts_with("--nats-req-max-pending 4")
        );
    }

    #[test]
    fn vllm_transfer_config_with_kvd_becomes_transport_and_kvd() {
        let config = r#"{"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":[{"kv_connector":"MoRIIOConnector","kv_role":"kv_producer","kv_connector_extra_config":{"read_mode":true,"handshake_port":7000}},{"kv_connector":"InferaKvdConnector","kv_role":"kv_both"}]}}"#;
        let (f, findings) = read(
            "vllm",
            &[
                "--model",
                "org/m",
                "--kv-transfer-config",
                config,
                "--drain-timeout",
                "12.5",
            ],
        );
        assert!(findings.0.is_empty(), "{findings:?}");
        assert_eq!(f.transport.backend.as_deref(), Some("mori"));
        assert!(f.transport.read_mode);
        assert_eq!(f.transport.handshake_port, Some(7000));
        assert!(f.kvd);
        assert_eq!(f.drain_seconds, Some(13));
        assert!(f.args.is_empty());
        let (_, findings) = read(
            "vllm",
            &[
                "--kv-transfer-config",
                r#"{"kv_connector":"LMCacheConnectorV1"}"#,
            ],
        );
        assert!(
            findings.0[0].message.contains("LMCacheConnectorV1"),
            "{findings:?}"
        );
    }
}
