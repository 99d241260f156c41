//! What an engine needs from the node it lands on, found before it starts: the RoCEv2
//! GID index of the RDMA NIC (the earlier launchers' 1 when none is found), the rail's
//! IPv4 address that GID carries (for `VLLM_HOST_IP`/`ATOM_HOST_IP`, only when it is an
//! address of this network namespace), whether a GPU peer-memory module is loaded
//! (Mooncake then registers GPU memory without dma-buf), and Mooncake's peer-HCA
//! affinity default. Every setting is set-if-unset: what the user's env names wins.
//!
//! In a pod, `infera-engine-sidecar node-env` runs as an init container and writes these
//! as a POSIX sh file the engine container sources before it execs the engine
//! ([`render_sh`]); a launched engine gets them in its environment ([`apply`]).

use crate::gid::detect_rocev2_gid;
use infera_engine_prep::prepare::{GID_VARS, is_linkable_model_name};
use infera_proto::worker::EngineKind;
use std::path::Path;

/// The earlier launchers' GID index when none is found: the routable RoCEv2 entry of an
/// AINIC (ionic) port.
pub const FALLBACK_GID_INDEX: u32 = 1;
/// Kernel modules that let an RDMA NIC register GPU memory directly.
pub const PEER_MEMORY_MODULES: [&str; 2] = ["ib_peer_mem", "amdp2p"];
/// Mooncake's two peer-HCA policies (it tests presence only, and uses neither when both
/// are present).
pub const DEST_AFFINITY: &str = "MC_ENABLE_DEST_DEVICE_AFFINITY";
/// See [`DEST_AFFINITY`].
pub const HCA_PEER_AFFINITY: &str = "MC_ENABLE_HCA_PEER_AFFINITY";

/// One setting for the engine's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// `name=value` unless the variable is set and non-empty.
    Default {
        /// Variable.
        name: String,
        /// Value.
        value: String,
        /// Why, for the log and the file.
        why: String,
    },
    /// Mooncake's destination-device affinity on, unless the user chose the other
    /// policy; a `0`/`false` value of either is removed (Mooncake tests presence).
    MooncakeAffinity,
}

/// What was found on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// The RoCEv2 GID index.
    pub gid_index: Option<u32>,
    /// The rail's IPv4 address (from the GID), when this namespace holds it.
    pub rail_ipv4: Option<std::net::Ipv4Addr>,
    /// A GPU peer-memory module is loaded.
    pub peer_memory: bool,
}

/// Reads the node: sysfs under `sysfs_root`, the module list at `proc_modules`; the
/// rail address counts only when `is_local` says this namespace can bind it.
pub fn read_node(
    sysfs_root: &Path,
    proc_modules: &Path,
    is_local: &dyn Fn(std::net::Ipv4Addr) -> bool,
) -> NodeFacts {
    let gid = detect_rocev2_gid(sysfs_root);
    let modules = std::fs::read_to_string(proc_modules).unwrap_or_default();
    NodeFacts {
        gid_index: gid.as_ref().map(|g| g.index),
        rail_ipv4: gid
            .as_ref()
            .and_then(|g| g.ipv4())
            .filter(|ip| is_local(*ip)),
        peer_memory: modules.lines().any(|line| {
            line.split_whitespace()
                .next()
                .is_some_and(|m| PEER_MEMORY_MODULES.contains(&m))
        }),
    }
}

/// Whether this network namespace has `ip` (it can be bound).
pub fn is_local_address(ip: std::net::Ipv4Addr) -> bool {
    std::net::TcpListener::bind((ip, 0)).is_ok()
}

fn default(name: &str, value: impl Into<String>, why: &str) -> Setting {
    Setting::Default {
        name: name.to_owned(),
        value: value.into(),
        why: why.to_owned(),
    }
}

/// The settings for `engine` on a node with `facts`, when it moves KV over RDMA.
pub fn build_settings(engine: EngineKind, rdma: bool, facts: &NodeFacts) -> Vec<Setting> {
    if !rdma {
        return Vec::new();
    }
    let (gid, how) = match facts.gid_index {
        Some(i) => (i, "the NIC's RoCEv2 entry in sysfs"),
        None => (
            FALLBACK_GID_INDEX,
            "no RoCEv2 entry found in sysfs: the earlier launchers' default",
        ),
    };
    let mut out: Vec<Setting> = GID_VARS
        .iter()
        .map(|name| default(name, gid.to_string(), &format!("RoCEv2 GID index, {how}")))
        .collect();
    out.push(Setting::MooncakeAffinity);
    if facts.peer_memory {
        out.push(default(
            "MOONCAKE_DISABLE_HIP_DMABUF",
            "1",
            "a GPU peer-memory module is loaded: register GPU memory without dma-buf",
        ));
    }
    if let (Some(ip), EngineKind::Vllm | EngineKind::Atom) = (facts.rail_ipv4, engine) {
        for name in ["VLLM_HOST_IP", "ATOM_HOST_IP"] {
            out.push(default(name, ip.to_string(), "the RDMA rail's address"));
        }
    }
    out
}

fn off(value: &str) -> bool {
    value == "0" || value.eq_ignore_ascii_case("false")
}

/// Applies `settings` to an environment (`get` reads it): the variables to set and to
/// remove.
pub fn apply(
    settings: &[Setting],
    get: &dyn Fn(&str) -> Option<String>,
) -> (Vec<(String, String)>, Vec<String>) {
    let set = |name: &str| get(name).filter(|v| !v.is_empty());
    let (mut add, mut remove) = (Vec::new(), Vec::new());
    for s in settings {
        match s {
            Setting::Default { name, value, .. } => {
                if set(name).is_none() {
                    add.push((name.clone(), value.clone()));
                }
            }
            Setting::MooncakeAffinity => match (set(DEST_AFFINITY), set(HCA_PEER_AFFINITY)) {
                (Some(v), _) if off(&v) => remove.push(DEST_AFFINITY.to_owned()),
                (Some(_), _) => {}
                (None, Some(v)) if !off(&v) => {}
                (None, hca) => {
                    if hca.is_some() {
                        remove.push(HCA_PEER_AFFINITY.to_owned());
                    }
                    add.push((DEST_AFFINITY.to_owned(), "1".to_owned()));
                }
            },
        }
    }
    (add, remove)
}

/// Single-quoted for sh.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// The settings as a POSIX sh file to source before exec'ing the engine; `workdir`, when
/// given, becomes the engine's working directory.
pub fn render_sh(settings: &[Setting], workdir: Option<&str>) -> String {
    let mut out = String::from(
        "# Written by infera-engine-sidecar node-env; sourced before the engine starts.\n",
    );
    for s in settings {
        match s {
            Setting::Default { name, value, why } => {
                out.push_str(&format!("# {why}\n"));
                out.push_str(&format!(
                    "[ -n \"${{{name}:-}}\" ] || {name}={}\nexport {name}\n",
                    quote(value)
                ));
            }
            Setting::MooncakeAffinity => out.push_str(&format!(
                "# Mooncake: the peer's same-named NIC (a rail's NICs reach only that rail); it tests\n\
                 # presence, so an explicit 0/false is removed, and {HCA_PEER_AFFINITY} keeps its own policy.\n\
                 case \"${{{DEST_AFFINITY}:-}}\" in\n\
                 \x20 0|false|False|FALSE) unset {DEST_AFFINITY} ;;\n\
                 \x20 '') case \"${{{HCA_PEER_AFFINITY}:-}}\" in\n\
                 \x20   0|false|False|FALSE) unset {HCA_PEER_AFFINITY}; export {DEST_AFFINITY}=1 ;;\n\
                 \x20   '') export {DEST_AFFINITY}=1 ;;\n\
                 \x20 esac ;;\n\
                 esac\n"
            )),
        }
    }
    if let Some(dir) = workdir {
        out.push_str(&format!("cd {}\n", quote(dir)));
    }
    out
}

/// Makes `<dir>/<name>` a symlink to `target`, creating the folders `name` implies: an
/// engine that serves its model under the path it loads (ATOM) then loads `name` from
/// `dir` and answers to it.
pub fn link_model(dir: &Path, name: &str, target: &Path) -> std::io::Result<()> {
    if !is_linkable_model_name(name) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("model name {name:?} is not a relative path"),
        ));
    }
    let link = dir.join(name);
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::remove_file(&link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::os::unix::fs::symlink(target, link)
}

/// `infera-engine-sidecar node-env`: the init container of an engine pod.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "infera-engine-sidecar node-env",
    about = "Writes what the engine needs from this node (RoCEv2 GID index, the rail's address, \
             peer memory, Mooncake's NIC affinity) as a sh file the engine container sources \
             before it starts; every variable the pod already sets wins."
)]
pub struct NodeEnvArgs {
    /// The engine: vllm, sglang or atom.
    #[arg(long, value_parser = parse_engine)]
    pub engine: EngineKind,
    /// The engine moves KV over RDMA (without it only the model link is written).
    #[arg(long)]
    pub rdma: bool,
    /// The file to write.
    #[arg(long, default_value = "/run/infera/engine-env.sh")]
    pub out: std::path::PathBuf,
    /// Where sysfs is.
    #[arg(long, default_value = "/sys", env = "INFERA_SYSFS_ROOT")]
    pub sysfs_root: std::path::PathBuf,
    /// The kernel's module list.
    #[arg(long, default_value = "/proc/modules")]
    pub proc_modules: std::path::PathBuf,
    /// NAME=PATH: link NAME (a relative path, e.g. the served model name) to PATH under
    /// --model-dir, which becomes the engine's working directory (ATOM serves its model
    /// under the name it loads).
    #[arg(long, value_parser = parse_link)]
    pub model_link: Option<(String, std::path::PathBuf)>,
    /// Where model links are made.
    #[arg(long, default_value = "/run/infera/models")]
    pub model_dir: std::path::PathBuf,
}

fn parse_engine(s: &str) -> Result<EngineKind, String> {
    s.parse()
        .map_err(|_| format!("{s:?}: expected vllm, sglang or atom"))
}

fn parse_link(s: &str) -> Result<(String, std::path::PathBuf), String> {
    let (name, path) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=PATH"))?;
    Ok((name.to_owned(), path.into()))
}

/// Runs `node-env`: reads the node, links the model, writes the file; returns what was
/// written.
pub fn run_node_env(args: &NodeEnvArgs) -> std::io::Result<String> {
    let facts = if args.rdma {
        read_node(&args.sysfs_root, &args.proc_modules, &is_local_address)
    } else {
        NodeFacts::default()
    };
    let settings = build_settings(args.engine, args.rdma, &facts);
    let workdir = match &args.model_link {
        Some((name, target)) => {
            link_model(&args.model_dir, name, target)?;
            Some(args.model_dir.display().to_string())
        }
        None => None,
    };
    let text = render_sh(&settings, workdir.as_deref());
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, &text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn facts() -> NodeFacts {
        NodeFacts {
            gid_index: Some(3),
            rail_ipv4: Some(std::net::Ipv4Addr::new(10, 1, 0, 7)),
            peer_memory: true,
        }
    }

    fn names(settings: &[Setting]) -> Vec<String> {
        settings
            .iter()
            .map(|s| match s {
                Setting::Default { name, value, .. } => format!("{name}={value}"),
                Setting::MooncakeAffinity => "affinity".into(),
            })
            .collect()
    }

    #[test]
    fn rdma_engines_get_the_node_facts_and_the_fallback_gid() {
        assert_eq!(
            names(&build_settings(EngineKind::Vllm, true, &facts())),
            [
                "MC_GID_INDEX=3",
                "NCCL_IB_GID_INDEX=3",
                "MORI_IB_GID_INDEX=3",
                "affinity",
                "MOONCAKE_DISABLE_HIP_DMABUF=1",
                "VLLM_HOST_IP=10.1.0.7",
                "ATOM_HOST_IP=10.1.0.7"
            ]
        );
        let sglang = build_settings(EngineKind::Sglang, true, &NodeFacts::default());
        assert_eq!(
            names(&sglang),
            [
                "MC_GID_INDEX=1",
                "NCCL_IB_GID_INDEX=1",
                "MORI_IB_GID_INDEX=1",
                "affinity"
            ]
        );
        assert!(build_settings(EngineKind::Vllm, false, &facts()).is_empty());
    }

    #[test]
    fn the_node_is_read_from_sysfs_and_the_module_list() {
        let dir = tempfile::tempdir().unwrap();
        let port = dir.path().join("class/infiniband/ionic_0/ports/1");
        std::fs::create_dir_all(port.join("gid_attrs/types")).unwrap();
        std::fs::create_dir_all(port.join("gids")).unwrap();
        std::fs::write(port.join("gid_attrs/types/1"), "RoCE v2\n").unwrap();
        std::fs::write(
            port.join("gids/1"),
            "0000:0000:0000:0000:0000:ffff:7f00:0001\n",
        )
        .unwrap();
        let modules = dir.path().join("modules");
        std::fs::write(
            &modules,
            "ionic 1 0 - Live 0x0\namdp2p 16384 0 - Live 0x0\n",
        )
        .unwrap();
        let found = read_node(dir.path(), &modules, &is_local_address);
        assert_eq!(
            found,
            NodeFacts {
                gid_index: Some(1),
                rail_ipv4: Some(std::net::Ipv4Addr::LOCALHOST),
                peer_memory: true
            }
        );
        std::fs::write(&modules, "ionic 1 0 - Live 0x0\n").unwrap();
        let elsewhere = read_node(dir.path(), &modules, &|_| false);
        assert_eq!((elsewhere.rail_ipv4, elsewhere.peer_memory), (None, false));
    }

    /// Sources the rendered file in a real `sh` with `env` and returns what it exports.
    fn run_sh(settings: &[Setting], env: &[(&str, &str)]) -> BTreeMap<String, String> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("engine-env.sh");
        std::fs::write(&file, render_sh(settings, Some("/"))).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(". {} && pwd && env", file.display()))
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("/"), "the working directory");
        lines
            .filter_map(|l| l.split_once('='))
            .filter(|(k, _)| !matches!(*k, "PWD" | "SHLVL" | "_" | "OLDPWD"))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn the_sh_file_and_apply_agree_and_the_users_env_wins() {
        let settings = build_settings(EngineKind::Atom, true, &facts());
        let cases: [&[(&str, &str)]; 5] = [
            &[],
            &[("MC_GID_INDEX", "5"), ("ATOM_HOST_IP", "192.168.0.9")],
            &[(DEST_AFFINITY, "0")],
            &[(HCA_PEER_AFFINITY, "1")],
            &[(HCA_PEER_AFFINITY, "false"), ("MC_GID_INDEX", "")],
        ];
        for env in cases {
            let from_sh = run_sh(&settings, env);
            let given: BTreeMap<String, String> = env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let (add, remove) = apply(&settings, &|n| given.get(n).cloned());
            let mut expected = given.clone();
            for name in remove {
                expected.remove(&name);
            }
            for (name, value) in add {
                expected.insert(name, value);
            }
            assert_eq!(from_sh, expected, "env {env:?}");
        }
        let plain = run_sh(&settings, &[]);
        assert_eq!(plain["MC_GID_INDEX"], "3");
        assert_eq!(plain[DEST_AFFINITY], "1");
        let user = run_sh(
            &settings,
            &[("MC_GID_INDEX", "5"), (DEST_AFFINITY, "false")],
        );
        assert_eq!(user["MC_GID_INDEX"], "5");
        assert!(!user.contains_key(DEST_AFFINITY), "0/false is removed");
        let quoted = render_sh(&[default("X", "a'b $(c)", "q")], None);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.sh");
        std::fs::write(&file, quoted).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(". {} && printf %s \"$X\"", file.display()))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a'b $(c)");
    }

    #[test]
    fn a_model_link_points_a_relative_name_at_the_weights() {
        let dir = tempfile::tempdir().unwrap();
        link_model(dir.path(), "Qwen/Qwen3-8B", Path::new("/model-store/q")).unwrap();
        // Again (a restarted init container): replaced, not refused.
        link_model(dir.path(), "Qwen/Qwen3-8B", Path::new("/model-store/q")).unwrap();
        assert_eq!(
            std::fs::read_link(dir.path().join("Qwen/Qwen3-8B")).unwrap(),
            Path::new("/model-store/q")
        );
        for bad in ["/abs", "../up", "a/../../b", ""] {
            assert!(
                link_model(dir.path(), bad, Path::new("/m")).is_err(),
                "{bad}"
            );
        }
    }
}
