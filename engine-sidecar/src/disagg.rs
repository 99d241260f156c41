//! Prefill/decode roles read from the engine's own flags, the `disagg_meta` a worker of
//! each role registers (the keys the earlier launchers wrote, see
//! `proto/testdata/pd/*.json`), and the preflight that refuses a configuration that would
//! silently move KV over TCP or that the decode side cannot reach.
//!
//! | engine | flags | protocol |
//! | --- | --- | --- |
//! | sglang | `--disaggregation-mode prefill\|decode` (mooncake or mori backend) | `sglang-bootstrap` |
//! | vllm | `--kv-transfer-config` `MooncakeConnector`, `kv_producer\|kv_consumer` | `vllm-mooncake` |
//! | vllm | `MoRIIOConnector` (`read_mode`, or `VLLM_MORIIO_CONNECTOR_READ_MODE`) | `vllm-mori-write` / `-read` |
//! | atom | `--kv-transfer-config` `kv_connector` mooncake (default) | `atom-mooncake` |

use crate::engine_args::flag_value;
use infera_proto::worker::{DisaggMode, EngineKind};
use serde_json::{Value, json};

/// A worker's prefill/decode role.
#[derive(Debug, Clone, PartialEq)]
pub struct DisaggRole {
    /// Prefill or decode.
    pub mode: DisaggMode,
    /// `disagg_meta.protocol`.
    pub protocol: &'static str,
    /// The engine's connector config (vLLM/ATOM `--kv-transfer-config`), if any.
    pub transfer_config: Value,
    /// SGLang bootstrap port.
    pub bootstrap_port: u16,
    /// Tensor-parallel size.
    pub tp_size: u32,
}

fn leg(role: Option<&str>) -> Result<Option<DisaggMode>, String> {
    match role {
        Some("kv_producer") => Ok(Some(DisaggMode::Prefill)),
        Some("kv_consumer") => Ok(Some(DisaggMode::Decode)),
        Some("kv_both") | None => Ok(None),
        Some(other) => Err(format!(
            "--kv-transfer-config kv_role {other:?}: expected kv_producer, kv_consumer or kv_both"
        )),
    }
}

/// The role the engine flags ask for (`None`: a mixed worker).
pub fn detect_role(
    kind: EngineKind,
    args: &[String],
    moriio_read_env: bool,
) -> Result<Option<DisaggRole>, String> {
    let tp_size = flag_value(
        args,
        &["--tensor-parallel-size", "--tp-size", "--tp", "-tp"],
    )
    .and_then(|v| v.parse().ok())
    .unwrap_or(1);
    if kind == EngineKind::Sglang {
        let mode = match flag_value(args, &["--disaggregation-mode"]) {
            None | Some("null") => return Ok(None),
            Some("prefill") => DisaggMode::Prefill,
            Some("decode") => DisaggMode::Decode,
            Some(other) => {
                return Err(format!(
                    "--disaggregation-mode {other:?}: expected null, prefill or decode"
                ));
            }
        };
        if let Some(backend) = flag_value(args, &["--disaggregation-transfer-backend"])
            && !matches!(backend, "mooncake" | "mori")
        {
            return Err(format!(
                "--disaggregation-transfer-backend {backend}: Infera routes SGLang prefill/decode over mooncake or mori only"
            ));
        }
        let bootstrap_port = flag_value(args, &["--disaggregation-bootstrap-port"])
            .and_then(|p| p.parse().ok())
            .unwrap_or(8998);
        return Ok(Some(DisaggRole {
            mode,
            protocol: "sglang-bootstrap",
            transfer_config: Value::Null,
            bootstrap_port,
            tp_size,
        }));
    }
    let Some(raw) = flag_value(args, &["--kv-transfer-config"]) else {
        return Ok(None);
    };
    let config: Value =
        serde_json::from_str(raw).map_err(|e| format!("--kv-transfer-config is not JSON: {e}"))?;
    let Some(mode) = leg(config.get("kv_role").and_then(Value::as_str))? else {
        return Ok(None);
    };
    let config = pd_connector(config);
    let connector = config
        .get("kv_connector")
        .and_then(Value::as_str)
        .unwrap_or("mooncake");
    let protocol = match (kind, connector) {
        (EngineKind::Atom, "mooncake") => "atom-mooncake",
        (EngineKind::Vllm, "MooncakeConnector" | "MooncakeStoreConnector") => "vllm-mooncake",
        (EngineKind::Vllm, "MoRIIOConnector") => {
            let extra = config.get("kv_connector_extra_config");
            let read = extra.and_then(|e| e.get("read_mode")).is_some_and(|v| {
                v.as_bool() == Some(true) || matches!(v.as_str(), Some("true" | "1"))
            });
            if read || moriio_read_env {
                "vllm-mori-read"
            } else {
                "vllm-mori-write"
            }
        }
        (_, other) => {
            return Err(format!(
                "--kv-transfer-config kv_connector {other:?} is not a prefill/decode connector Infera routes \
                 (vLLM: MooncakeConnector or MoRIIOConnector; ATOM: mooncake); NIXL is not supported"
            ));
        }
    };
    Ok(Some(DisaggRole {
        mode,
        protocol,
        transfer_config: config,
        bootstrap_port: 8998,
        tp_size,
    }))
}

/// The prefill/decode connector of a vLLM `MultiConnector` (e.g. kvd's connector beside
/// Mooncake): the first inner one that is not kvd's, with the outer `engine_id` when it
/// names none (vLLM gives the inner connectors the outer one's). Others: as given.
fn pd_connector(config: Value) -> Value {
    if config.get("kv_connector").and_then(Value::as_str) != Some("MultiConnector") {
        return config;
    }
    let inner = config
        .pointer("/kv_connector_extra_config/connectors")
        .and_then(Value::as_array)
        .and_then(|list| {
            list.iter().find(|c| {
                c.get("kv_connector").and_then(Value::as_str) != Some("InferaKvdConnector")
            })
        })
        .cloned();
    match inner {
        Some(mut c) => {
            if c.get("engine_id").is_none()
                && let (Some(map), Some(id)) = (c.as_object_mut(), config.get("engine_id"))
            {
                map.insert("engine_id".into(), id.clone());
            }
            c
        }
        None => config,
    }
}

fn port_of(v: Option<&Value>, default: u64) -> u64 {
    v.and_then(|p| p.as_u64().or_else(|| p.as_str()?.parse().ok()))
        .unwrap_or(default)
}

/// The `disagg_meta` of a worker in `role` reachable at `host:http_port`.
pub fn build_disagg_meta(role: &DisaggRole, host: &str, http_port: u16, dp_size: u32) -> Value {
    let cfg = &role.transfer_config;
    let extra = cfg
        .get("kv_connector_extra_config")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let params = match role.protocol {
        "sglang-bootstrap" => match role.mode {
            DisaggMode::Prefill => {
                json!({"bootstrap_addr": format!("{host}:{}", role.bootstrap_port)})
            }
            _ => json!({}),
        },
        "vllm-mooncake" => json!({
            "engine_id": cfg.get("engine_id").cloned().unwrap_or(Value::Null),
            "kv_ip": cfg.get("kv_ip").cloned().unwrap_or_else(|| json!("127.0.0.1")),
            "kv_port": cfg.get("kv_port").cloned().unwrap_or_else(|| json!(14579)),
            "kv_connector_extra_config": extra,
            "bootstrap_addr": format!("http://{host}:{}", role.bootstrap_port),
        }),
        "vllm-mori-write" | "vllm-mori-read" => {
            let mut extra = extra;
            if let Some(map) = extra.as_object_mut() {
                // vLLM's own defaults, written out so the router can build the request id.
                map.entry("handshake_port").or_insert(json!(6301));
                map.entry("notify_port").or_insert(json!(61005));
                map.entry("tp_size").or_insert(json!(role.tp_size));
            }
            json!({
                "engine_id": cfg.get("engine_id").cloned().unwrap_or(Value::Null),
                "kv_ip": cfg.get("kv_ip").cloned().unwrap_or_else(|| json!("127.0.0.1")),
                "kv_port": cfg.get("kv_port").cloned().unwrap_or_else(|| json!(14579)),
                "kv_connector_extra_config": extra,
            })
        }
        _ => json!({
            "host": host,
            "http_port": http_port,
            "handshake_port": port_of(cfg.get("handshake_port"), 6301),
            "tp_size": role.tp_size,
            "dp_size": port_of(cfg.get("dp_size"), u64::from(dp_size)),
        }),
    };
    json!({"protocol": role.protocol, "params": params})
}

/// Refuses what would silently run prefill/decode over TCP or be unreachable, unless
/// `allow_tcp`, saying what to change.
pub fn preflight(role: &DisaggRole, advertise_host: &str, allow_tcp: bool) -> Result<(), String> {
    if allow_tcp {
        return Ok(());
    }
    let host = advertise_host.trim_start_matches('[').trim_end_matches(']');
    let unreachable = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified());
    if unreachable {
        return Err(format!(
            "prefill/decode worker advertised at {advertise_host}: other workers cannot reach a loopback or wildcard \
             address for the KV transfer; set --advertise-host to this pod's or node's IP \
             (or --disaggregation-allow-tcp for a single-machine test)"
        ));
    }
    let tcp = role
        .transfer_config
        .get("kv_connector_extra_config")
        .and_then(|e| e.get("mooncake_protocol"))
        .and_then(Value::as_str)
        .is_some_and(|p| p.eq_ignore_ascii_case("tcp"));
    if tcp {
        return Err(
            "kv_connector_extra_config.mooncake_protocol is \"tcp\": KV would cross the network over TCP instead of RDMA; \
             set it to \"rdma\" (or pass --disaggregation-allow-tcp to accept TCP)"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn fixture_params(protocol: &str) -> Value {
        let path = format!(
            "{}/../proto/testdata/pd/{protocol}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let f: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        f["prefill_record_params"].clone()
    }

    #[test]
    fn records_carry_the_launchers_params() {
        let sg = detect_role(
            EngineKind::Sglang,
            &args(&["--disaggregation-mode", "prefill"]),
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            build_disagg_meta(&sg, "10.0.0.1", 30001, 1)["params"],
            fixture_params("sglang-bootstrap")
        );
        let mc = r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_producer","engine_id":"eng-42","kv_connector_extra_config":{"mooncake_protocol":"rdma"}}"#;
        let vm = detect_role(
            EngineKind::Vllm,
            &args(&["--kv-transfer-config", mc]),
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            build_disagg_meta(&vm, "10.0.0.22", 8000, 1)["params"],
            fixture_params("vllm-mooncake")
        );
        // With kvd beside it (vLLM's MultiConnector, the engine id outside): the same record.
        let multi = r#"{"kv_connector":"MultiConnector","kv_role":"kv_producer","engine_id":"eng-42","kv_connector_extra_config":{"connectors":[{"kv_connector":"InferaKvdConnector","kv_role":"kv_both","kv_connector_module_path":"infera.engine.vllm.kvd_connector"},{"kv_connector":"MooncakeConnector","kv_role":"kv_producer","kv_connector_extra_config":{"mooncake_protocol":"rdma"}}]}}"#;
        let vk = detect_role(
            EngineKind::Vllm,
            &args(&["--kv-transfer-config", multi]),
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (vk.mode, vk.protocol),
            (DisaggMode::Prefill, "vllm-mooncake")
        );
        assert_eq!(
            build_disagg_meta(&vk, "10.0.0.22", 8000, 1)["params"],
            fixture_params("vllm-mooncake")
        );
        let kvd_only = r#"{"kv_connector":"InferaKvdConnector","kv_role":"kv_both"}"#;
        assert_eq!(
            detect_role(
                EngineKind::Vllm,
                &args(&["--kv-transfer-config", kvd_only]),
                false
            ),
            Ok(None),
            "kvd alone is a mixed worker"
        );
        let mori = r#"{"kv_connector":"MoRIIOConnector","kv_role":"kv_producer","engine_id":"eng-p","kv_connector_extra_config":{"handshake_port":6301,"notify_port":61005,"tp_size":8}}"#;
        let mw = detect_role(
            EngineKind::Vllm,
            &args(&["--kv-transfer-config", mori]),
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(mw.protocol, "vllm-mori-write");
        assert_eq!(
            build_disagg_meta(&mw, "10.0.0.22", 30501, 1)["params"],
            fixture_params("vllm-mori-write")
        );
        assert_eq!(
            detect_role(
                EngineKind::Vllm,
                &args(&["--kv-transfer-config", mori]),
                true
            )
            .unwrap()
            .unwrap()
            .protocol,
            "vllm-mori-read"
        );
        let atom = detect_role(
            EngineKind::Atom,
            &args(&[
                "-tp",
                "8",
                "--kv-transfer-config",
                r#"{"kv_role":"kv_consumer"}"#,
            ]),
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(atom.mode, DisaggMode::Decode);
        assert_eq!(
            build_disagg_meta(&atom, "10.0.0.22", 30001, 1)["params"],
            fixture_params("atom-mooncake")
        );
    }

    #[test]
    fn mixed_and_unsupported_configurations() {
        assert_eq!(
            detect_role(EngineKind::Sglang, &args(&["--model-path", "/m"]), false),
            Ok(None)
        );
        let both = r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both"}"#;
        assert_eq!(
            detect_role(
                EngineKind::Vllm,
                &args(&["--kv-transfer-config", both]),
                false
            ),
            Ok(None)
        );
        let nixl = r#"{"kv_connector":"NixlConnector","kv_role":"kv_producer"}"#;
        assert!(
            detect_role(
                EngineKind::Vllm,
                &args(&["--kv-transfer-config", nixl]),
                false
            )
            .unwrap_err()
            .contains("NIXL")
        );
    }

    #[test]
    fn preflight_refuses_unreachable_hosts_and_tcp() {
        let role = detect_role(
            EngineKind::Sglang,
            &args(&["--disaggregation-mode", "decode"]),
            false,
        )
        .unwrap()
        .unwrap();
        for host in ["127.0.0.1", "0.0.0.0", "localhost", "::1", "[::]"] {
            assert!(
                preflight(&role, host, false)
                    .unwrap_err()
                    .contains("--advertise-host"),
                "{host}"
            );
        }
        assert!(preflight(&role, "127.0.0.1", true).is_ok());
        assert!(preflight(&role, "10.0.0.5", false).is_ok());
        let tcp = r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_producer","kv_connector_extra_config":{"mooncake_protocol":"tcp"}}"#;
        let role = detect_role(
            EngineKind::Vllm,
            &args(&["--kv-transfer-config", tcp]),
            false,
        )
        .unwrap()
        .unwrap();
        assert!(
            preflight(&role, "10.0.0.5", false)
                .unwrap_err()
                .contains("rdma")
        );
    }
}
