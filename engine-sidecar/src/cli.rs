//! The sidecar's command line, shaped like the earlier launchers':
//! `infera-engine-sidecar <vllm|sglang|atom|sim> [infera flags] [engine flags]`. Infera
//! flags are matched by their exact names (never by prefix); every other argument goes to
//! the engine verbatim. Each infera flag has an `INFERA_*` environment variable
//! (flag > environment > default).

use infera_engine_prep::Launch;
use infera_etcd_conn::EtcdSecurity;
use infera_proto::kv_tiers::{
    DEFAULT_KV_BYTES_PER_TOKEN, DEFAULT_PREFILL_MS_PER_TOKEN, DeclaredTiers, KvTier, TierCost,
};
use std::time::Duration;
use thiserror::Error;

/// The sidecar's own settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SidecarArgs {
    /// What runs: the engine, or `infera-sim` imitating the one its `--engine` flag names.
    pub engine: Launch,
    /// etcd endpoints.
    pub etcd_endpoints: Vec<String>,
    /// etcd prefix.
    pub etcd_prefix: String,
    /// TLS and auth of the etcd connection.
    pub etcd_security: EtcdSecurity,
    /// Host other machines reach the engine at.
    pub advertise_host: String,
    /// Longest drain.
    pub drain_timeout: Duration,
    /// Lease TTL (30 s by contract; shorter for tests).
    pub lease_ttl: Duration,
    /// Longest wait for the engine's `/health`.
    pub health_timeout: Duration,
    /// Publish KV events (engines get a KV-event endpoint).
    pub enable_kv_events: bool,
    /// Program to run for `sim` (default `infera-sim` on PATH).
    pub sim_binary: String,
    /// Port of the sidecar's own `/health` and `/metrics` (0: none).
    pub status_port: u16,
    /// What a `/drain` call from outside the Pod's loopback must present
    /// (`x-infera-drain-token`); unset: loopback callers only.
    pub drain_token: Option<String>,
    /// The revision of the engine spec this worker runs, registered in its record
    /// (`$INFERA_ENGINE_REVISION`, environment only: engines have a `--revision` flag).
    pub revision: Option<String>,
    /// RoCEv2 GID index; detected from sysfs when absent.
    pub gid_index: Option<u32>,
    /// Root of sysfs (a fake tree in tests).
    pub sysfs_root: String,
    /// NATS server to relay KV events to (`--kv-event-transport nats`).
    pub relay_nats: Option<String>,
    /// Serve requests over the NATS request plane (`--request-transport nats`).
    pub request_plane: Option<crate::request_plane::PlaneSettings>,
    /// Attach to an engine running elsewhere (its own container) instead of launching it.
    pub attach: bool,
    /// Accept a prefill/decode configuration that moves KV over TCP or a loopback host.
    pub disaggregation_allow_tcp: bool,
    /// Register in this Pod's annotation (`kubernetes`) instead of etcd.
    pub kubernetes_pod: Option<(String, String)>,
    /// kvd's socket beside the engine: prefetch hints posted to the status port's
    /// `/kvd/prefetch` go there (a gateway's `POST /v1/cache/prewarm`).
    pub kvd_socket: Option<std::path::PathBuf>,
    /// The tiers below the engine's memory its KV connector loads from (kvd's RAM, NVMe
    /// and shared tiers), declared in the record for routers to score.
    pub kv_tiers: DeclaredTiers,
    /// Everything else, for the engine.
    pub engine_args: Vec<String>,
}

/// A command line that cannot work.
#[derive(Debug, Error, PartialEq)]
pub enum CliError {
    /// No engine kind.
    #[error(
        "usage: infera-engine-sidecar <vllm|sglang|atom|sim> [infera flags] [engine flags]\n\n{USAGE}"
    )]
    Usage,
    /// Unknown engine kind.
    #[error("unknown engine {0:?}: expected vllm, sglang, atom or sim")]
    UnknownEngine(String),
    /// A flag lacks its value.
    #[error("{0} needs a value")]
    MissingValue(&'static str),
    /// A value does not parse.
    #[error("{flag}: {message}")]
    BadValue {
        /// Flag.
        flag: &'static str,
        /// Why.
        message: String,
    },
    /// Flags that cannot work together.
    #[error("{0}")]
    Invalid(String),
    /// `--help`.
    #[error("{USAGE}")]
    Help,
}

/// `--help` text.
pub const USAGE: &str = "Infera flags (each also as the environment variable in brackets):
  --etcd-endpoint URL[,URL]   etcd to register in [INFERA_ETCD_ENDPOINT] (http://127.0.0.1:2379)
  --etcd-prefix PREFIX        key prefix of worker records [INFERA_ETCD_PREFIX] (/infera/workers/)
  --etcd-ca-file, --etcd-cert-file, --etcd-key-file PEM   TLS to https:// etcd endpoints: the CA
                              of etcd's certificate, a client certificate and its key
                              [INFERA_ETCD_CA_FILE, INFERA_ETCD_CERT_FILE, INFERA_ETCD_KEY_FILE]
  --etcd-user USER, --etcd-password-file FILE   etcd auth [INFERA_ETCD_USER, INFERA_ETCD_PASSWORD_FILE]
  --discovery-backend etcd|kubernetes   kubernetes: the record goes in this Pod's
                              infera.amd.com/worker-info annotation (POD_NAME from the downward API)
                              [INFERA_DISCOVERY_BACKEND] (etcd)
  --k8s-namespace NS          the Pod's namespace [INFERA_K8S_NAMESPACE] (POD_NAMESPACE, else default)
  --advertise-host HOST       host the gateway reaches the engine at [INFERA_ADVERTISE_HOST] (127.0.0.1)
  --drain-timeout SECONDS     longest wait for in-flight requests on shutdown [INFERA_DRAIN_TIMEOUT] (60)
  --lease-ttl SECONDS         etcd lease TTL; keepalive every third of it [INFERA_LEASE_TTL] (30)
  --health-timeout SECONDS    longest wait for the engine to load [INFERA_HEALTH_TIMEOUT] (1800)
  --enable-kv-events / --no-enable-kv-events   give the engine a KV-event endpoint [INFERA_ENABLE_KV_EVENTS] (on)
  --sim-binary PATH           program for `sim` [INFERA_SIM_BINARY] (infera-sim)
  --status-port PORT          the sidecar's own /health, /metrics and /drain [INFERA_STATUS_PORT] (off);
                              /drain answers loopback callers, and others that send the header
                              x-infera-drain-token: $INFERA_DRAIN_TOKEN (environment only)
  $INFERA_ENGINE_REVISION     the revision of the engine spec, registered as the record's
                              `revision` (environment only); gateways pair a prefill and a
                              decode worker only of one revision
  --kvd-socket PATH           kvd's socket beside the engine: POST /kvd/prefetch on --status-port
                              leaves a prefetch_hint there (gateways forward POST /v1/cache/prewarm;
                              callers outside the Pod send x-infera-drain-token, as for /drain)
                              [INFERA_KVD_SOCKET] (none: /kvd/prefetch answers 503)
  --kv-tiers host[,disk][,remote]   the tiers below HBM the engine's KV connector loads from
                              (kvd's RAM, NVMe and shared tiers), declared in the record's
                              `kv.tiers` for kv-aware routers to score, while kvd answers
                              on --kvd-socket when one is given [INFERA_KV_TIERS] (none)
  --kv-tier-cost TIER=RTT_MS:GBYTES_PER_S[,...]   a declared tier's load cost instead of the
                              measured default (host=0.1:54.8, disk=1:0.439, remote=0.37:0.338)
                              [INFERA_KV_TIER_COST]
  --disaggregation-allow-tcp  accept a prefill/decode worker on a loopback host or TCP transport
                              [INFERA_DISAGGREGATION_ALLOW_TCP] (refused otherwise)
  --attach                    the engine runs in its own container: watch it, do not launch it;
                              its preStop calls GET /drain on --status-port [INFERA_ATTACH]
  --gid-index N               RoCEv2 GID index for MC_/NCCL_IB_/MORI_IB_GID_INDEX [INFERA_GID_INDEX]
                              (default: detected from the NIC's GID table in sysfs)
  --sysfs-root PATH           where sysfs is [INFERA_SYSFS_ROOT] (/sys)
  --kv-event-transport zmq|nats   nats: relay the engine's KV events to JetStream [INFERA_KV_EVENT_TRANSPORT] (zmq)
  --nats-server URL           NATS for the relay and the request plane [INFERA_NATS_SERVER]
                              (else $NATS_SERVER, else $NATS_URL, else nats://127.0.0.1:4222)
  --request-transport http|nats   nats: also serve requests on this worker's NATS subject
                              (infera.req.<token>) and register request_transport nats
                              [INFERA_REQUEST_TRANSPORT] (http)
  --nats-req-max-duration SECONDS   longest NATS request, then it is ended on the worker
                              [INFERA_NATS_REQ_MAX_DURATION] (0: no cap)
  --nats-req-max-pending N    above 0, take requests from the INFERA_REQUESTS JetStream work
                              queue so gateways can hold back at N queued (the gateways'
                              value) [INFERA_NATS_REQ_MAX_PENDING] (0)
  --nats-req-idle-timeout SECONDS   accepted for the earlier worker's command lines; the
                              gateway enforces it [INFERA_NATS_REQ_IDLE_TIMEOUT]
Every other argument goes to the engine unchanged; the engine's --port (ATOM: --server-port)
builds the worker URL.

infera-engine-sidecar node-env --engine E [--rdma] [--model-link NAME=PATH]: writes what the
engine needs from this node as a sh file for an engine container to source (an engine pod's
init container); `node-env --help` says more.";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn seconds(flag: &'static str, v: &str) -> Result<Duration, CliError> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| CliError::BadValue {
            flag,
            message: format!("{v:?} is not a positive number of seconds"),
        })
}

fn seconds_or_off(flag: &'static str, v: &str) -> Result<Duration, CliError> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| CliError::BadValue {
            flag,
            message: format!("{v:?} is not 0 (off) or a positive number of seconds"),
        })
}

/// Parses the arguments after the program name.
pub fn parse_args(args: &[String]) -> Result<SidecarArgs, CliError> {
    let Some(first) = args.first() else {
        return Err(CliError::Usage);
    };
    if first == "--help" || first == "-h" {
        return Err(CliError::Help);
    }
    let word = first.as_str();
    if !matches!(word, "vllm" | "sglang" | "atom" | "sim") {
        return Err(CliError::UnknownEngine(word.to_owned()));
    }
    let mut values: Vec<(&'static str, String)> = Vec::new();
    let mut kv_events: Option<bool> = None;
    let mut attach = matches!(env_or("INFERA_ATTACH", "0").as_str(), "1" | "true" | "yes");
    let mut allow_tcp = matches!(
        env_or("INFERA_DISAGGREGATION_ALLOW_TCP", "0").as_str(),
        "1" | "true" | "yes"
    );
    let mut engine_args = Vec::new();
    const VALUED: [&str; 26] = [
        "--etcd-endpoint",
        "--etcd-prefix",
        "--etcd-ca-file",
        "--etcd-cert-file",
        "--etcd-key-file",
        "--etcd-user",
        "--etcd-password-file",
        "--advertise-host",
        "--drain-timeout",
        "--lease-ttl",
        "--health-timeout",
        "--sim-binary",
        "--status-port",
        "--gid-index",
        "--sysfs-root",
        "--kv-event-transport",
        "--nats-server",
        "--request-transport",
        "--nats-req-max-duration",
        "--nats-req-max-pending",
        "--nats-req-idle-timeout",
        "--discovery-backend",
        "--k8s-namespace",
        "--kvd-socket",
        "--kv-tiers",
        "--kv-tier-cost",
    ];
    let mut it = args[1..].iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (arg.as_str(), None),
        };
        if let Some(flag) = VALUED.iter().find(|f| **f == name) {
            let value = match inline {
                Some(v) => v,
                None => it.next().cloned().ok_or(CliError::MissingValue(flag))?,
            };
            values.push((flag, value));
        } else if arg == "--enable-kv-events" {
            kv_events = Some(true);
        } else if arg == "--no-enable-kv-events" {
            kv_events = Some(false);
        } else if arg == "--attach" {
            attach = true;
        } else if arg == "--disaggregation-allow-tcp" {
            allow_tcp = true;
        } else if arg == "--help" {
            return Err(CliError::Help);
        } else {
            engine_args.push(arg.clone());
        }
    }
    let get = |flag: &str, env: &str, default: &str| {
        values
            .iter()
            .rev()
            .find(|(f, _)| *f == flag)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| env_or(env, default))
    };
    let etcd_endpoints = get(
        "--etcd-endpoint",
        "INFERA_ETCD_ENDPOINT",
        "http://127.0.0.1:2379",
    )
    .split(',')
    .map(str::trim)
    .filter(|e| !e.is_empty())
    .map(str::to_owned)
    .collect();
    let enable_kv_events = match kv_events {
        Some(b) => b,
        None => !matches!(
            env_or("INFERA_ENABLE_KV_EVENTS", "1").as_str(),
            "0" | "false" | "no"
        ),
    };
    let status_port = get("--status-port", "INFERA_STATUS_PORT", "0");
    let optional = |flag: &str, env: &str| Some(get(flag, env, "")).filter(|v| !v.is_empty());
    let etcd_security = EtcdSecurity {
        ca_file: optional("--etcd-ca-file", "INFERA_ETCD_CA_FILE").map(Into::into),
        cert_file: optional("--etcd-cert-file", "INFERA_ETCD_CERT_FILE").map(Into::into),
        key_file: optional("--etcd-key-file", "INFERA_ETCD_KEY_FILE").map(Into::into),
        user: optional("--etcd-user", "INFERA_ETCD_USER"),
        password_file: optional("--etcd-password-file", "INFERA_ETCD_PASSWORD_FILE")
            .map(Into::into),
    };
    let gid_index = match get("--gid-index", "INFERA_GID_INDEX", "").as_str() {
        "" => None,
        v => Some(v.parse().map_err(|_| CliError::BadValue {
            flag: "--gid-index",
            message: format!("{v:?} is not a GID index"),
        })?),
    };
    seconds_or_off(
        "--nats-req-idle-timeout",
        &get(
            "--nats-req-idle-timeout",
            "INFERA_NATS_REQ_IDLE_TIMEOUT",
            "0",
        ),
    )?;
    let nats_url = Some(get("--nats-server", "INFERA_NATS_SERVER", ""))
        .filter(|u| !u.is_empty())
        .or_else(|| std::env::var("NATS_SERVER").ok().filter(|u| !u.is_empty()))
        .or_else(|| std::env::var("NATS_URL").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let engine = Launch::from_word(word, &engine_args)
        .ok_or_else(|| CliError::UnknownEngine(word.to_owned()))?;
    let args = SidecarArgs {
        engine,
        etcd_endpoints,
        etcd_security,
        etcd_prefix: get(
            "--etcd-prefix",
            "INFERA_ETCD_PREFIX",
            infera_proto::discovery::DEFAULT_ETCD_PREFIX,
        ),
        advertise_host: get("--advertise-host", "INFERA_ADVERTISE_HOST", "127.0.0.1"),
        drain_timeout: seconds(
            "--drain-timeout",
            &get("--drain-timeout", "INFERA_DRAIN_TIMEOUT", "60"),
        )?,
        lease_ttl: seconds("--lease-ttl", &get("--lease-ttl", "INFERA_LEASE_TTL", "30"))?,
        health_timeout: seconds(
            "--health-timeout",
            &get("--health-timeout", "INFERA_HEALTH_TIMEOUT", "1800"),
        )?,
        enable_kv_events,
        sim_binary: get("--sim-binary", "INFERA_SIM_BINARY", "infera-sim"),
        status_port: status_port.parse().map_err(|_| CliError::BadValue {
            flag: "--status-port",
            message: format!("{status_port:?} is not a port"),
        })?,
        drain_token: std::env::var(crate::status::DRAIN_TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty()),
        revision: std::env::var(infera_proto::sidecar::REVISION_ENV)
            .ok()
            .map(|r| r.trim().to_owned())
            .filter(|r| !r.is_empty()),
        gid_index,
        sysfs_root: get("--sysfs-root", "INFERA_SYSFS_ROOT", "/sys"),
        attach,
        disaggregation_allow_tcp: allow_tcp,
        kubernetes_pod: match get("--discovery-backend", "INFERA_DISCOVERY_BACKEND", "etcd")
            .as_str()
        {
            "etcd" => None,
            "kubernetes" => {
                let namespace = get(
                    "--k8s-namespace",
                    "INFERA_K8S_NAMESPACE",
                    &env_or("POD_NAMESPACE", "default"),
                );
                let name = std::env::var("POD_NAME").map_err(|_| CliError::BadValue {
                    flag: "--discovery-backend",
                    message:
                        "kubernetes needs the Pod's name in POD_NAME (downward API: metadata.name)"
                            .into(),
                })?;
                Some((namespace, name))
            }
            other => {
                return Err(CliError::BadValue {
                    flag: "--discovery-backend",
                    message: format!("{other:?}: expected etcd or kubernetes"),
                });
            }
        },
        relay_nats: match get("--kv-event-transport", "INFERA_KV_EVENT_TRANSPORT", "zmq").as_str() {
            "zmq" => None,
            "nats" => Some(nats_url.clone()),
            other => {
                return Err(CliError::BadValue {
                    flag: "--kv-event-transport",
                    message: format!("{other:?}: expected zmq or nats"),
                });
            }
        },
        request_plane: match get("--request-transport", "INFERA_REQUEST_TRANSPORT", "http").as_str()
        {
            "http" => None,
            "nats" => Some(crate::request_plane::PlaneSettings {
                url: nats_url,
                max_duration: Some(seconds_or_off(
                    "--nats-req-max-duration",
                    &get(
                        "--nats-req-max-duration",
                        "INFERA_NATS_REQ_MAX_DURATION",
                        "0",
                    ),
                )?)
                .filter(|d| !d.is_zero()),
                max_pending: {
                    let v = get("--nats-req-max-pending", "INFERA_NATS_REQ_MAX_PENDING", "0");
                    v.parse().map_err(|_| CliError::BadValue {
                        flag: "--nats-req-max-pending",
                        message: format!("{v:?} is not a count"),
                    })?
                },
            }),
            other => {
                return Err(CliError::BadValue {
                    flag: "--request-transport",
                    message: format!("{other:?}: expected http or nats"),
                });
            }
        },
        kvd_socket: optional("--kvd-socket", "INFERA_KVD_SOCKET").map(Into::into),
        kv_tiers: parse_kv_tiers(
            &get("--kv-tiers", "INFERA_KV_TIERS", ""),
            &get("--kv-tier-cost", "INFERA_KV_TIER_COST", ""),
        )?,
        engine_args,
    };
    if args.kubernetes_pod.is_none() {
        args.etcd_security
            .validate(&args.etcd_endpoints)
            .map_err(|e| CliError::Invalid(e.0))?;
    }
    Ok(args)
}

/// `--kv-tiers host,disk,remote` with `--kv-tier-cost TIER=RTT_MS:GBYTES_PER_S,...`
/// (each tier's measured default otherwise).
fn parse_kv_tiers(tiers: &str, costs: &str) -> Result<DeclaredTiers, CliError> {
    let mut stated = Vec::new();
    for item in costs.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        stated.push(
            TierCost::parse_stated(item).map_err(|e| CliError::BadValue {
                flag: "--kv-tier-cost",
                message: e.to_string(),
            })?,
        );
    }
    let mut costs = Vec::new();
    for name in tiers.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let tier = KvTier::parse_lower(name).map_err(|e| CliError::BadValue {
            flag: "--kv-tiers",
            message: e.to_string(),
        })?;
        let cost = TierCost::stated_or_measured(&stated, tier);
        if let Some(cost) = cost
            && !costs.iter().any(|(t, _)| *t == tier)
        {
            costs.push((tier, cost));
        }
    }
    costs.sort_by_key(|(t, _)| *t);
    Ok(DeclaredTiers {
        costs,
        kv_bytes_per_token: DEFAULT_KV_BYTES_PER_TOKEN,
        prefill_ms_per_token: DEFAULT_PREFILL_MS_PER_TOKEN,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use infera_proto::worker::EngineKind;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn infera_flags_are_exact_and_the_rest_goes_to_the_engine() {
        let a = parse_args(&args(
            "sglang --etcd-endpoint http://e:1,http://e:2 --advertise-host 10.0.0.5 --model-path /m --port 30000 \
             --etcd-prefix-extra x --no-enable-kv-events --drain-timeout=5 \
             --kvd-socket /run/infera-kvd/kvd.sock",
        ))
        .unwrap();
        assert_eq!(
            a.kvd_socket.as_deref(),
            Some(std::path::Path::new("/run/infera-kvd/kvd.sock"))
        );
        assert_eq!(a.engine, Launch::Engine(EngineKind::Sglang));
        assert_eq!(a.etcd_endpoints, vec!["http://e:1", "http://e:2"]);
        assert_eq!(a.advertise_host, "10.0.0.5");
        assert!(!a.enable_kv_events);
        assert_eq!(a.drain_timeout, Duration::from_secs(5));
        // No prefix matching: --etcd-prefix-extra is an engine flag.
        assert_eq!(
            a.engine_args,
            args("--model-path /m --port 30000 --etcd-prefix-extra x")
        );
    }

    #[test]
    fn kv_tiers_are_declared_with_measured_or_stated_costs() {
        let a = parse_args(&args(
            "vllm --kv-tiers remote,host --kv-tier-cost remote=2:1.5 --model m",
        ))
        .unwrap();
        assert_eq!(
            a.kv_tiers.costs,
            vec![
                (KvTier::Host, TierCost::measured(KvTier::Host).unwrap()),
                (
                    KvTier::Remote,
                    TierCost {
                        rtt_ms: 2.0,
                        gbytes_per_s: 1.5
                    }
                ),
            ]
        );
        assert_eq!(a.engine_args, args("--model m"));
        assert!(parse_args(&args("vllm")).unwrap().kv_tiers.costs.is_empty());
        for bad in [
            "vllm --kv-tiers device",
            "vllm --kv-tiers tape",
            "vllm --kv-tiers host --kv-tier-cost host=fast",
            "vllm --kv-tiers host --kv-tier-cost host=0.1:0",
        ] {
            assert!(
                matches!(parse_args(&args(bad)), Err(CliError::BadValue { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn errors_say_what_to_change() {
        assert_eq!(parse_args(&[]), Err(CliError::Usage));
        assert_eq!(
            parse_args(&args("tgi")),
            Err(CliError::UnknownEngine("tgi".into()))
        );
        assert_eq!(
            parse_args(&args("vllm --etcd-prefix")),
            Err(CliError::MissingValue("--etcd-prefix"))
        );
        assert!(matches!(
            parse_args(&args("vllm --lease-ttl 0")),
            Err(CliError::BadValue {
                flag: "--lease-ttl",
                ..
            })
        ));
    }
}
