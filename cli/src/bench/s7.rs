//! S7 operator scale: N simulated InferaDeployments are created in a real kube-apiserver
//! (one fresh namespace per N), then `infera-operator` is started on that namespace; the
//! run ends when every deployment's status reports its generation (status is written
//! after every child was applied). Reported: seconds, reconciles/s, objects applied, the
//! operator's peak RSS and CPU, and the API server's CPU over the same window.

use super::Ctx;
use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use infera_operator::api::InferaDeployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Sizes of S7.
#[derive(Debug, Clone, Deserialize)]
pub struct Size {
    deployments: Vec<usize>,
}

/// Where S7 runs.
#[derive(Debug, Clone)]
pub struct Target {
    /// Admin kubeconfig of the API server.
    pub kubeconfig: PathBuf,
    /// The `infera-operator` binary.
    pub operator: PathBuf,
    /// Where the operator's log goes (`s7-operator-<n>.log`).
    pub out: PathBuf,
}

fn deployment(i: usize) -> Value {
    json!({
        "apiVersion": "infera.amd.com/v1alpha1",
        "kind": "InferaDeployment",
        "metadata": {"name": format!("s7-{i:04}")},
        "spec": {
            "model": {"name": format!("sim-{i}"), "source": {"hostPath": {"path": "/models/none"}}},
            "engine": {"kind": "sim"},
        },
    })
}

/// CPU seconds (user + system) of a process.
fn cpu_seconds(pid: u32) -> f64 {
    super::external::process_cpu(pid).as_secs_f64()
}

/// Processes whose command name is `name`.
fn pids_named(name: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .collect()
}

/// An admin client from the kubeconfig at `path`.
pub async fn client(path: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

async fn metric(port: u16, name: &str) -> f64 {
    let url = format!("http://127.0.0.1:{port}/metrics");
    let Ok(resp) = reqwest::get(&url).await else {
        return 0.0;
    };
    let text = resp.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

async fn one_size(target: &Target, client: &kube::Client, n: usize) -> Result<Value> {
    let ns = format!("s7-{n}-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await
        .with_context(|| format!("creating namespace {ns}"))?;
    let api: Api<InferaDeployment> = Api::namespaced(client.clone(), &ns);
    let created = futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let d: InferaDeployment = serde_json::from_value(deployment(i))?;
                api.create(&PostParams::default(), &d)
                    .await
                    .map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    if let Some(Err(e)) = created.into_iter().find(Result::is_err) {
        bail!(
            "creating InferaDeployments (are the CRDs installed? `infera crds` writes them): {e}"
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let apiservers = pids_named("kube-apiserver");
    let api_cpu_before: f64 = apiservers.iter().map(|p| cpu_seconds(*p)).sum();
    let started = Instant::now();
    let log_path = target.out.join(format!("s7-operator-{n}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let mut operator = std::process::Command::new(&target.operator)
        .args([
            "--kubeconfig",
            &target.kubeconfig.to_string_lossy(),
            "--namespace",
            &ns,
        ])
        .args([
            "--leader-elect=false",
            "--metrics-bind-address",
            &format!("127.0.0.1:{port}"),
        ])
        .env("RUST_LOG", "warn")
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", target.operator.display()))?;
    let pid = operator.id();
    let deadline = started + Duration::from_secs(600);
    let done = loop {
        let list = api.list(&ListParams::default()).await?;
        let done = list
            .items
            .iter()
            .filter(|d| {
                d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation
            })
            .count();
        if done == n || Instant::now() > deadline {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    let reconciles = metric(port, "infera_operator_reconciles_total{result=\"success\"}").await;
    let applies = metric(port, "infera_operator_applies_total").await;
    let operator_cpu = cpu_seconds(pid);
    let rss = super::cpu::peak_rss(Some(pid));
    let api_cpu = apiservers.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - api_cpu_before;
    let _ = operator.kill();
    let _ = operator.wait();
    let _ = namespaces.delete(&ns, &Default::default()).await;
    if done < n {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let last = text
            .lines()
            .rev()
            .find(|l| l.contains("WARN") || l.contains("ERROR"));
        return Err(anyhow!(
            "only {done} of {n} deployments reconciled within 600 s; the operator's last complaint ({}): {}",
            log_path.display(),
            last.unwrap_or("none")
        ));
    }
    eprintln!(
        "  {n} deployments: {seconds:.2} s, operator {:.1} MiB",
        rss as f64 / 1048576.0
    );
    Ok(json!({
        "deployments": n,
        "seconds": seconds,
        "reconciles": reconciles,
        "reconciles_per_s": reconciles / seconds,
        "objects_applied": applies,
        "operator_peak_rss_mib": rss as f64 / 1048576.0,
        "operator_cpu_s": operator_cpu,
        "apiserver_cpu_s": if apiservers.is_empty() { Value::Null } else { json!(api_cpu) },
    }))
}

/// Runs S7.
pub async fn run(_ctx: &Ctx, size: &Size, target: &Target) -> Result<Value> {
    let client = client(&target.kubeconfig).await?;
    let mut runs = Vec::new();
    for &n in &size.deployments {
        runs.push(one_size(target, &client, n).await?);
    }
    let largest = runs.last().cloned().unwrap_or(Value::Null);
    let verdicts = json!({
        "largest_size": largest["deployments"],
        "fully_reconciled_under_60s": largest["seconds"].as_f64().is_some_and(|s| s < 60.0),
        "operator_rss_under_100_mib": runs.iter().all(|r| r["operator_peak_rss_mib"].as_f64().is_some_and(|m| m < 100.0)),
        "target": "500 deployments fully reconciled < 60 s; RSS < 100 MiB",
    });
    Ok(json!({"runs": runs, "verdicts": verdicts}))
}
