//! The router a run measures: Infera's gateway in the fleet (its runtime's threads) or a
//! peer router started from `--router-cmd`, each optionally pinned to its own core
//! (`--pin-router`) with the driver and the simulators on the others.

use super::cpu::threads_cpu;
use super::envoy::{Envoy, Ready};
use super::external::External;
use super::fleet::{Fleet, MODEL};
use anyhow::{Result, bail};
use std::time::Duration;

/// Policy names of peer routers: `external:<name>`.
pub const EXTERNAL: &str = "external:";

/// Policy names of Infera's endpoint picker behind Envoy: `envoy:<policy>`.
pub const BEHIND_ENVOY: &str = "envoy:";

/// A peer router given with `--router-cmd [NAME=]COMMAND`.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerRouter {
    /// Its name in reports (`external` when none was given).
    pub name: String,
    /// Its command template (see [`super::external::build_argv`]).
    pub command: String,
}

impl PeerRouter {
    /// Whether its command reads the workers' KV events (`{kv_event_sources}`): the
    /// fleet then publishes them.
    pub fn reads_kv_events(&self) -> bool {
        self.command.contains(super::external::KV_EVENT_SOURCES)
    }

    /// Parses `NAME=COMMAND` (a name is letters, digits, `-`, `_` and `.` before the
    /// first `=`, which must come before any space) or a bare command.
    pub fn parse(arg: &str) -> PeerRouter {
        let named = arg.split_once('=').filter(|(name, _)| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        });
        match named {
            Some((name, command)) => PeerRouter {
                name: name.to_owned(),
                command: command.trim().to_owned(),
            },
            None => PeerRouter {
                name: "external".to_owned(),
                command: arg.trim().to_owned(),
            },
        }
    }

    /// Its policy name.
    pub fn policy(&self) -> String {
        format!("{EXTERNAL}{}", self.name)
    }
}

/// Where the router under test runs: `router` is its core, `others` everyone else's.
#[derive(Debug, Clone, PartialEq)]
pub struct Pinning {
    /// The router's core.
    pub router: usize,
    /// The driver's and simulators' cores.
    pub others: Vec<usize>,
}

impl Pinning {
    /// The router on `core` and everything else on the machine's other cores; an error
    /// when `core` does not exist or is the only one.
    pub fn on(core: usize) -> Result<Pinning> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        if core >= cores || cores < 2 {
            bail!(
                "--pin-router {core}: this machine has {cores} cores (0-{}); pinning needs at least two",
                cores.saturating_sub(1)
            );
        }
        Ok(Pinning {
            router: core,
            others: (0..cores).filter(|c| *c != core).collect(),
        })
    }

    /// Pins this process's threads: the gateway runtime's (`infera-gw*`) to the router's
    /// core, every other one to the other cores. Threads started later inherit their
    /// starter's cores.
    pub fn pin_threads(&self) {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        for task in tasks.flatten() {
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<i32>().ok())
            else {
                continue;
            };
            let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            let cores = if name.starts_with("infera-gw") {
                std::slice::from_ref(&self.router)
            } else {
                self.others.as_slice()
            };
            set_affinity(tid, cores);
        }
    }

    /// `command` run under `taskset` on the router's core.
    pub fn wrap(&self, command: &str) -> String {
        format!("taskset -c {} {command}", self.router)
    }
}

fn set_affinity(tid: i32, cores: &[usize]) {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write only into it and
    // sched_setaffinity reads it. A failure (a thread that just exited) leaves the
    // thread where it was.
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for c in cores {
            libc::CPU_SET(*c, &mut set);
        }
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The router of one run, started on a fleet.
#[derive(Debug)]
pub struct UnderTest {
    external: Option<External>,
    envoy: Option<Envoy>,
    cpu0: Duration,
    /// URLs to send `path` to.
    pub urls: Vec<String>,
}

impl UnderTest {
    /// The router of `policy` on `fleet` (the peer router of an `external:` policy, else
    /// the fleet's gateways), pinned by `pin`, serving `path`.
    pub async fn start(
        policy: &str,
        peers: &[PeerRouter],
        fleet: &Fleet,
        pin: Option<&Pinning>,
        path: &str,
    ) -> Result<UnderTest> {
        if let Some(p) = pin {
            p.pin_threads();
        }
        if policy.starts_with(BEHIND_ENVOY) {
            let Some(epp) = fleet.gateways.first().and_then(|g| g.epp) else {
                bail!("{policy}: the fleet's gateway serves no endpoint picker");
            };
            let sims: Vec<_> = fleet.sims.iter().map(|s| s.addr).collect();
            let envoy = Envoy::start(epp.ext_proc, &sims, Ready::Picked).await?;
            let mut under = UnderTest {
                external: None,
                urls: vec![format!("{}{path}", envoy.picked)],
                envoy: Some(envoy),
                cpu0: Duration::ZERO,
            };
            under.cpu0 = under.cpu_now();
            return Ok(under);
        }
        let Some(name) = policy.strip_prefix(EXTERNAL) else {
            return Ok(UnderTest {
                external: None,
                envoy: None,
                cpu0: threads_cpu("infera-gw"),
                urls: fleet.gateway_urls(path),
            });
        };
        let Some(peer) = peers.iter().find(|p| p.name == name) else {
            bail!("no --router-cmd named {name}");
        };
        let command = match pin {
            Some(p) => p.wrap(&peer.command),
            None => peer.command.clone(),
        };
        let external = External::start(&command, &fleet.sim_urls(""), &fleet.events, MODEL).await?;
        Ok(UnderTest {
            cpu0: external.cpu(),
            urls: vec![format!("{}{path}", external.base)],
            external: Some(external),
            envoy: None,
        })
    }

    /// CPU time of the router so far: a peer's process, or the gateway's threads (and
    /// the Envoy in front of its picker).
    fn cpu_now(&self) -> Duration {
        match (&self.external, &self.envoy) {
            (Some(e), _) => e.cpu(),
            (None, Some(envoy)) => threads_cpu("infera-gw") + envoy.cpu(),
            (None, None) => threads_cpu("infera-gw"),
        }
    }

    /// CPU seconds the router used since [`Self::start`] (or the last call).
    pub fn take_cpu(&mut self) -> f64 {
        let now = self.cpu_now();
        let used = now.saturating_sub(self.cpu0);
        self.cpu0 = now;
        used.as_secs_f64()
    }

    /// Stops a peer router, or the Envoy in front of the picker.
    pub async fn stop(self) {
        if let Some(e) = self.external {
            e.stop().await;
        }
        if let Some(e) = self.envoy {
            e.stop().await;
        }
    }
}

/// The fleet settings of `policy`: gateway flags, gateways, KV events (a peer router
/// gets no gateway and no events).
pub fn fleet_setup(policy: &str) -> Result<(Vec<String>, usize, bool)> {
    if policy.starts_with(EXTERNAL) {
        return Ok((Vec::new(), 0, false));
    }
    if let Some(inner) = policy.strip_prefix(BEHIND_ENVOY) {
        let (mut flags, _, events) = super::policy_flags(inner)?;
        flags.extend(["--epp-port", "0", "--epp-health-port", "0"].map(String::from));
        return Ok((flags, 1, events));
    }
    super::policy_flags(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_commands_take_an_optional_name() {
        let named = PeerRouter::parse("smg=python -m smg --port {port} --policy=cache_aware");
        assert_eq!(named.name, "smg");
        assert_eq!(
            named.command,
            "python -m smg --port {port} --policy=cache_aware"
        );
        assert_eq!(named.policy(), "external:smg");
        let bare = PeerRouter::parse("python -m r --x=1");
        assert_eq!(bare.name, "external");
        assert_eq!(bare.command, "python -m r --x=1");
        let path = PeerRouter::parse("/opt/venv/bin/python -m r");
        assert_eq!(path.name, "external");
    }

    #[test]
    fn policies_name_their_weight_and_event_source() {
        let (flags, gateways, events) = fleet_setup("kv-aware-approximate-w4").unwrap();
        assert_eq!(gateways, 1);
        assert!(!events, "approximate mode ignores KV events");
        let joined = flags.join(" ");
        assert!(joined.contains("--kv-overlap-weight 4") && joined.contains("--kv-approximate"));
        let (flags, _, events) = fleet_setup("kv-aware-w2").unwrap();
        assert!(events && flags.join(" ").contains("--kv-overlap-weight 2"));
        assert!(!flags.iter().any(|f| f == "--kv-approximate"));
        assert_eq!(fleet_setup("external:smg").unwrap(), (Vec::new(), 0, false));
        assert!(fleet_setup("kv-aware-wx").is_err());
        let (flags, _, events) = fleet_setup("kv-aware-w4+flow4000").unwrap();
        let joined = flags.join(" ");
        assert!(events && joined.contains("--flow-control true --flow-ttft-deadline-ms 4000"));
        assert!(joined.contains("--kv-overlap-weight 4"), "{joined}");
        assert!(fleet_setup("kv-aware-w4+flow").is_err());
        let (_, gateways, _) = fleet_setup("kv-aware-w4+flow4000+r3").unwrap();
        assert_eq!(gateways, 3);
        assert!(fleet_setup("kv-aware-w4+turbo").is_err());
    }

    #[test]
    fn pinning_puts_the_router_alone_on_its_core() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        if cores >= 2 {
            let p = Pinning::on(cores - 1).unwrap();
            assert!(!p.others.contains(&p.router));
            assert_eq!(p.others.len(), cores - 1);
            assert_eq!(p.wrap("r --x"), format!("taskset -c {} r --x", cores - 1));
        }
        assert!(Pinning::on(cores).is_err());
    }
}
