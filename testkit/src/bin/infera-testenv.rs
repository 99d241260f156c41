//! `infera-testenv`: starts one real etcd, NATS (JetStream) and kube-apiserver for a
//! whole test run, writes their endpoints as shell `export` lines, and keeps them up
//! until it is stopped (SIGINT/SIGTERM) or its parent dies.
//!
//! The README's test command runs it before `cargo test`, so every test binary reuses
//! one set of servers instead of starting its own.

use anyhow::{Context, Result, bail};
use infera_testkit::etcd::EtcdServer;
use infera_testkit::kube_apiserver::KubeApiServer;
use infera_testkit::nats::NatsServer;
use infera_testkit::{ENV_ETCD, ENV_KUBECONFIG, ENV_NATS};
use std::path::PathBuf;
use std::time::Instant;

const USAGE: &str = "usage: infera-testenv up --env-file PATH

Starts a real etcd, a NATS server with JetStream and a kube-apiserver (with its own
etcd) on loopback, then writes `export NAME=VALUE` lines for INFERA_TEST_ETCD_ENDPOINT,
INFERA_TEST_NATS_URL and INFERA_TEST_KUBECONFIG to PATH (atomically, once all are
ready) and runs until interrupted. Binaries come from INFERA_TESTENV_* or
testenv/build.sh.";

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env_file = match args.as_slice() {
        [cmd, flag, path] if cmd == "up" && flag == "--env-file" => PathBuf::from(path),
        [flag] if flag == "--help" || flag == "-h" => {
            println!("{USAGE}");
            return Ok(());
        }
        _ => bail!("{USAGE}"),
    };
    let started = Instant::now();
    let (etcd, nats, kube) = tokio::try_join!(
        EtcdServer::start(),
        NatsServer::start(),
        KubeApiServer::start()
    )?;
    let lines = format!(
        "export {ENV_ETCD}={}\nexport {ENV_NATS}={}\nexport {ENV_KUBECONFIG}={}\n",
        etcd.endpoint(),
        nats.url(),
        kube.kubeconfig().display()
    );
    let tmp = env_file.with_extension("partial");
    std::fs::write(&tmp, &lines).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &env_file).with_context(|| format!("writing {}", env_file.display()))?;
    eprintln!(
        "infera-testenv: etcd {}, nats {}, kube-apiserver {} ready in {:.1}s",
        etcd.endpoint(),
        nats.url(),
        kube.url(),
        started.elapsed().as_secs_f64()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("infera-testenv: stopping");
    drop((etcd, nats, kube));
    Ok(())
}
