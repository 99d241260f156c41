//! Infera from a private registry, as a platform team runs it: `scripts/release` pushes
//! this tree's images and chart to Debian's `docker-registry` with htpasswd auth (on
//! this machine, where the node's containerd pulls from; `hosts.toml` says it speaks
//! plain HTTP), then
//!
//! 1. a deployment whose engine image is only in that registry, without a pull secret,
//!    says `ImagePullBackOff` in its `Ready` condition; given `spec.imagePullSecrets`, its
//!    pod pulls the image (the kubelet's `Pulled` Event) and it is Ready;
//! 2. the operator installed from that registry (`image.registry`, `image.pullPolicy:
//!    Always`, the chart's `imagePullSecrets`): its own pods pull with the secret, and a
//!    new deployment's engine and gateway pods pull every Infera image from the registry
//!    with the copy of the secret the operator made in their namespace.
//!
//! Run by `scripts/test` in its cluster stage (after `scripts/cluster create` built the
//! binaries the images take: `--no-cargo`); it leaves the release as it found it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use base64::Engine as _;
use infera_e2e::deploy::{ROLLOUT, condition};
use infera_e2e::{Cluster, RELEASE_NAMESPACE, eventually, repo};
use infera_testkit::binaries::{Binary, locate};
use infera_testkit::process::{ServerProcess, free_port};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

const USER: &str = "infera-ci";
const PASSWORD: &str = "pull-me-not-7";

async fn run(program: &Path, args: &[&str]) -> String {
    let out = tokio::process::Command::new(program)
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{} {args:?}: {}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A registry on 127.0.0.1 that wants a user and a password.
fn start_registry(dir: &Path, port: u16) -> ServerProcess {
    let htpasswd = dir.join("htpasswd");
    let hash = bcrypt::hash(PASSWORD, 5).unwrap();
    std::fs::write(&htpasswd, format!("{USER}:{hash}\n")).unwrap();
    let config = dir.join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nstorage:\n  filesystem: {{rootdirectory: {}}}\n  delete: {{enabled: true}}\nhttp:\n  addr: 127.0.0.1:{port}\nauth:\n  htpasswd: {{realm: infera-ci, path: {}}}\n",
            dir.join("data").display(),
            htpasswd.display()
        ),
    )
    .unwrap();
    let registry = Path::new("/usr/bin/docker-registry");
    assert!(
        registry.exists(),
        "this test needs Debian's docker-registry"
    );
    ServerProcess::start(
        registry,
        &["serve".into(), config.display().to_string()],
        &dir.join("registry.log"),
    )
    .unwrap()
}

/// The containerd of the node pulls from `host` over plain HTTP.
fn trust_registry(host: &str) -> std::path::PathBuf {
    let dir =
        std::env::var("INFERA_CLUSTER_DIR").unwrap_or_else(|_| "/var/lib/infera-cluster".into());
    let folder = Path::new(&dir).join("containerd/certs.d").join(host);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("hosts.toml"),
        format!("server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"),
    )
    .unwrap();
    folder
}

fn dockerconfig(host: &str) -> String {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    json!({"auths": {host: {"auth": auth}}}).to_string()
}

async fn pull_secret(cluster: &Cluster, ns: &str, host: &str) {
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "regcred", "namespace": ns},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(dockerconfig(host))},
    });
    cluster
        .kubectl_with_input(&["apply", "-f", "-"], Some(&secret.to_string()))
        .await
        .unwrap();
}

/// The kubelet's `Pulled` Events in `ns` whose message names an image of `host`.
async fn pulled(cluster: &Cluster, ns: &str, host: &str) -> Vec<String> {
    let events = cluster
        .get_json(&[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            "reason=Pulled",
        ])
        .await
        .unwrap();
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["message"].as_str())
        .filter(|m| m.contains(host))
        .map(str::to_owned)
        .collect()
}

async fn helm_upgrade(cluster: &Cluster, set: &[&str]) {
    let kubeconfig = cluster.kubeconfig().display().to_string();
    let chart = repo().join("charts/infera");
    let mut args = vec![
        "--kubeconfig",
        &kubeconfig,
        "upgrade",
        "infera",
        chart.to_str().unwrap(),
        "-n",
        RELEASE_NAMESPACE,
        "--reuse-values",
        "--wait",
        "--timeout",
        "300s",
    ];
    for s in set {
        args.extend(["--set", s]);
    }
    run(&locate(Binary::Helm).unwrap(), &args).await;
}

/// Puts the release back on the chart's own images (no pull secret, its pull policy)
/// when dropped, passed or failed, so the tests after this one find it as it was.
struct RestoreRelease(std::path::PathBuf);

impl Drop for RestoreRelease {
    fn drop(&mut self) {
        let chart = repo().join("charts/infera");
        let out = std::process::Command::new(locate(Binary::Helm).unwrap())
            .arg("--kubeconfig")
            .arg(&self.0)
            .args(["upgrade", "infera"])
            .arg(&chart)
            .args([
                "-n",
                RELEASE_NAMESPACE,
                "--reuse-values",
                "--wait",
                "--timeout",
                "300s",
            ])
            .args([
                "--set",
                "image.registry=ghcr.io/infera",
                "--set",
                "image.pullPolicy=IfNotPresent",
            ])
            .args(["--set-json", "imagePullSecrets=[]"])
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "restoring the release: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("restoring the release: {e}"),
        }
    }
}

#[tokio::test]
async fn a_release_pushed_to_a_private_registry_is_pulled_with_its_secret() {
    let cluster = Cluster::connect().await.unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let port = free_port().unwrap();
    let host = format!("127.0.0.1:{port}");
    let _registry = start_registry(scratch.path(), port);
    let hosts = trust_registry(&host);
    let version = env!("CARGO_PKG_VERSION");
    let http = infera_e2e::http();
    let deadline = Instant::now() + Duration::from_secs(30);
    while http.get(format!("http://{host}/v2/")).send().await.is_err() {
        assert!(Instant::now() < deadline, "the registry did not start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let anonymous = http
        .get(format!("http://{host}/v2/_catalog"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401, "the registry wants credentials");

    // The release, pushed with the registry's credentials.
    let authfile = scratch.path().join("auth.json");
    std::fs::write(&authfile, dockerconfig(&host)).unwrap();
    let started = Instant::now();
    run(
        &repo().join("scripts/release"),
        &[
            version,
            &format!("{host}/infera"),
            "--prebuilt",
            "--no-cargo",
            "--no-record",
            "--tls-verify=false",
            "--authfile",
            authfile.to_str().unwrap(),
        ],
    )
    .await;
    println!(
        "scripts/release {version} pushed in {:.1?}",
        started.elapsed()
    );
    let catalog: Value = http
        .get(format!("http://{host}/v2/_catalog"))
        .basic_auth(USER, Some(PASSWORD))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for part in [
        "operator",
        "gateway",
        "engine-sidecar",
        "sim",
        "kvd",
        "cli",
        "downloader",
    ] {
        let name = format!("infera/infera-{part}");
        assert!(
            catalog["repositories"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r == name.as_str()),
            "{name}: {catalog}"
        );
        let tags: Value = http
            .get(format!("http://{host}/v2/{name}/tags/list"))
            .basic_auth(USER, Some(PASSWORD))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(tags["tags"], json!([version]), "{name}");
    }
    let chart = run(
        &locate(Binary::Helm).unwrap(),
        &[
            "show",
            "chart",
            &format!("oci://{host}/infera/charts/infera"),
            "--version",
            version,
            "--plain-http",
            "--registry-config",
            authfile.to_str().unwrap(),
        ],
    )
    .await;
    assert!(chart.contains(&format!("appVersion: {version}")), "{chart}");

    // 1. An engine image only the registry has: refused without the secret, pulled with it.
    let ns = cluster.namespace("e2e-private").await.unwrap();
    let ns = ns.name.clone();
    let manifest = |secrets: &str| {
        format!(
            "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: private}}
spec:
  model: {{name: private-model, source: {{hostPath: {{path: /models/none}}}}}}
  engine: {{kind: sim, image: '{host}/infera/infera-sim:{version}'}}
  gateway: {{resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}}}
  {secrets}
"
        )
    };
    cluster.apply(&ns, &manifest("")).await.unwrap();
    let refused = eventually(
        &cluster,
        &ns,
        "Ready False with ImagePullBackOff",
        ROLLOUT,
        || async {
            let d = cluster
                .get_json(&["get", "idep", "private", "-n", &ns])
                .await
                .map_err(|e| e.to_string())?;
            match condition(&d, "Ready") {
                Some(c) if c["reason"] == "ImagePullBackOff" => Ok(c.clone()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    println!("without the secret: {}", refused["message"]);
    pull_secret(&cluster, &ns, &host).await;
    cluster
        .apply(&ns, &manifest("imagePullSecrets: [{name: regcred}]"))
        .await
        .unwrap();
    cluster.wait_ready(&ns, "private").await.unwrap();
    let events = pulled(&cluster, &ns, &host).await;
    assert!(
        events
            .iter()
            .any(|m| m.contains(&format!("{host}/infera/infera-sim:{version}"))),
        "no Pulled Event for the engine image: {events:?}"
    );

    // 2. Infera itself from the registry: every image pulled, always, with the secret.
    pull_secret(&cluster, RELEASE_NAMESPACE, &host).await;
    let restore = RestoreRelease(cluster.kubeconfig().to_owned());
    let registry = format!("image.registry={host}/infera");
    helm_upgrade(
        &cluster,
        &[
            &registry,
            "image.pullPolicy=Always",
            "imagePullSecrets[0].name=regcred",
        ],
    )
    .await;
    let operator_pulls = pulled(&cluster, RELEASE_NAMESPACE, &host).await;
    assert!(
        operator_pulls
            .iter()
            .any(|m| m.contains(&format!("{host}/infera/infera-operator:{version}"))),
        "{operator_pulls:?}"
    );
    let ns2 = cluster.namespace("e2e-charted").await.unwrap();
    let ns2 = ns2.name.clone();
    cluster
        .apply(
            &ns2,
            "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: charted}
spec:
  model: {name: charted-model, source: {hostPath: {path: /models/none}}}
  engine: {kind: sim}
  gateway: {resources: {requests: {cpu: 50m, memory: 64Mi}}}
",
        )
        .await
        .unwrap();
    cluster.wait_ready(&ns2, "charted").await.unwrap();
    let copy = cluster
        .get_json(&["get", "secret", "charted-pull-regcred", "-n", &ns2])
        .await
        .unwrap();
    assert_eq!(copy["type"], "kubernetes.io/dockerconfigjson");
    let events = pulled(&cluster, &ns2, &host).await;
    for part in ["engine-sidecar", "sim", "gateway"] {
        let image = format!("{host}/infera/infera-{part}:{version}");
        assert!(
            events.iter().any(|m| m.contains(&image)),
            "no Pulled Event for {image}: {events:?}"
        );
    }
    let pods = cluster.engine_pods(&ns2, "charted").await.unwrap();
    let spec = &pods[0]["spec"];
    assert_eq!(
        spec["imagePullSecrets"],
        json!([{"name": "charted-pull-regcred"}]),
        "{spec}"
    );
    let sidecar = spec["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sidecar")
        .unwrap();
    assert_eq!(sidecar["imagePullPolicy"], "Always");

    // Back to the release as it was (also when the test fails: the guard).
    drop(restore);
    let _ = std::fs::remove_dir_all(hosts);
}
