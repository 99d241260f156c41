//! The operator against the real kube-apiserver from `testenv/` (no kubelet: readiness is
//! simulated by patching workload status, as TESTENV.md describes). Each test runs the
//! `infera-operator` binary on its own namespace and drives it as a user would, with
//! kubectl.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use infera_operator::api::{InferaDeployment, PDTopology};
use infera_operator::plan::{Images, Observed, Platform};
use infera_operator::render::{Kind, render};
use infera_testkit::process::{ServerProcess, free_port};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::{
    apply_retrying, eventually, install, install_crd_dir, kubectl, namespace, repo,
    third_party_crds,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(60);

fn images() -> Images {
    Images::from_registry("registry.example/infera", "test")
}

/// A running `infera-operator` scoped to one namespace.
struct Operator {
    process: ServerProcess,
    metrics_port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Operator {
    /// Starts the operator on `namespace`, acting as the chart's ServiceAccount (so the
    /// chart's RBAC is what it gets), its Lease in the operator namespace.
    async fn start(kubeconfig: &Path, namespace: &str, extra: &[&str]) -> Self {
        Self::start_with_env(kubeconfig, namespace, extra, &[]).await
    }

    /// As [`Operator::start`], with more environment variables.
    async fn start_with_env(
        kubeconfig: &Path,
        namespace: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let client = infera_testkit::kube_client().await.unwrap();
        let kubeconfig = support::operator_kubeconfig(&client, kubeconfig).await;
        let dir = tempfile::tempdir().unwrap();
        // INFERA_TEST_LOG_DIR keeps the operators' logs for a failed run.
        let log = match std::env::var_os("INFERA_TEST_LOG_DIR") {
            Some(d) => {
                PathBuf::from(d).join(format!("operator-{namespace}-{}.log", std::process::id()))
            }
            None => dir.path().join("operator.log"),
        };
        let metrics_port = free_port().unwrap();
        let mut args: Vec<String> = vec![
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--namespace".into(),
            namespace.into(),
            "--leader-election-namespace".into(),
            support::OPERATOR_NAMESPACE.into(),
            "--leader-election-id".into(),
            format!("op-{namespace}"),
            "--metrics-bind-address".into(),
            format!("127.0.0.1:{metrics_port}"),
            "--image-registry".into(),
            "registry.example/infera".into(),
            "--image-tag".into(),
            "test".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut vars = vec![("RUST_LOG", "info,infera_operator=debug")];
        vars.extend_from_slice(env);
        let process = ServerProcess::start_with_env(
            Path::new(env!("CARGO_BIN_EXE_infera-operator")),
            &args,
            &vars,
            &log,
        )
        .unwrap();
        Self {
            process,
            metrics_port,
            log,
            _dir: dir,
        }
    }

    async fn metrics(&self) -> Result<String, String> {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port))
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut body = String::new();
        s.read_to_string(&mut body)
            .await
            .map_err(|e| e.to_string())?;
        Ok(body)
    }

    async fn metric(&self, line_prefix: &str) -> u64 {
        let text = self.metrics().await.unwrap_or_default();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(line_prefix)
                    .map(|v| v.trim().parse::<f64>().unwrap_or(0.0) as u64)
            })
            .unwrap_or(0)
    }

    async fn reconciles(&self) -> u64 {
        self.metric("infera_operator_reconciles_total{result=\"success\"}")
            .await
    }

    /// Fails the test if the API server refused the operator anything: the chart's RBAC
    /// must cover every call it makes.
    fn assert_never_forbidden(&self) {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let refused: Vec<&str> = log
            .lines()
            // Not a bare "403": log timestamps carry microseconds.
            .filter(|l| {
                l.contains("code: 403") || l.contains("forbidden") || l.contains("Forbidden")
            })
            .collect();
        assert!(
            refused.is_empty(),
            "the API server refused the operator (chart RBAC too narrow):\n{}",
            refused.join("\n")
        );
    }

    fn log_tail(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn dyn_api(client: &kube::Client, ns: &str, kind: Kind) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &kind.api_resource())
}

/// Whether every field of `want` is in `got` with the same value (lists element-wise).
fn contains(got: &Value, want: &Value) -> Result<(), String> {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                let gv = g.get(k).ok_or_else(|| format!("missing {k}"))?;
                contains(gv, wv).map_err(|e| format!("{k}.{e}"))?;
            }
            Ok(())
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                contains(gv, wv).map_err(|e| format!("[{i}].{e}"))?;
            }
            Ok(())
        }
        _ if got == want => Ok(()),
        _ => Err(format!(": got {got}, want {want}")),
    }
}

async fn get_idep(client: &kube::Client, ns: &str, name: &str) -> InferaDeployment {
    Api::<InferaDeployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
}

fn condition(d: &InferaDeployment, type_: &str) -> Option<(String, String, String)> {
    d.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until the deployment's condition `type_` has `status` (and `reason`, if given).
async fn wait_condition(
    client: &kube::Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> InferaDeployment {
    eventually(
        &format!("{name} {type_}={status} {reason:?}"),
        WAIT,
        || async {
            let d = get_idep(client, ns, name).await;
            match condition(&d, type_) {
                Some((s, r, _))
                    if s == status
                        && reason.is_none_or(|want| want == r)
                        && d.status.as_ref().and_then(|s| s.observed_generation)
                            == d.metadata.generation =>
                {
                    Ok(d)
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

/// The children the operator should have made for `name`, rendered locally from the
/// stored objects, checked field by field against what the API server holds.
async fn expect_children(
    client: &kube::Client,
    ns: &str,
    name: &str,
    model_ready: bool,
) -> Vec<(Kind, String)> {
    let d = get_idep(client, ns, name).await;
    let topology = match &d.spec.serving.topology_ref {
        Some(t) => Api::<PDTopology>::namespaced(client.clone(), ns)
            .get_opt(t)
            .await
            .unwrap(),
        None => None,
    };
    let rendered = render(
        &d,
        Observed {
            topology: topology.as_ref(),
            model_ready,
            ..Default::default()
        },
        &Platform::with_images(images()),
    )
    .unwrap();
    let mut names = Vec::new();
    for child in rendered.children {
        let api = dyn_api(client, ns, child.kind);
        let what = format!("{name}: {:?} {} as rendered", child.kind, child.name);
        eventually(&what, WAIT, || async {
            let got = api
                .get_opt(&child.name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("absent")?;
            contains(&serde_json::to_value(&got).unwrap(), &child.object)
        })
        .await;
        names.push((child.kind, child.name));
    }
    names
}

async fn patch_status<K>(api: &Api<K>, name: &str, status: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await
    .unwrap_or_else(|e| panic!("patching the status of {name}: {e}"));
}

/// What a kubelet and the workload controllers would report once every pod is ready.
async fn make_ready(client: &kube::Client, ns: &str) {
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    for s in sts.list(&ListParams::default()).await.unwrap() {
        let n = s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let g = s.metadata.generation.unwrap_or(0);
        patch_status(&sts, &s.metadata.name.unwrap(), json!({"observedGeneration": g, "replicas": n, "readyReplicas": n, "currentReplicas": n, "updatedReplicas": n, "availableReplicas": n})).await;
    }
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for d in deps.list(&ListParams::default()).await.unwrap() {
        let n = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let g = d.metadata.generation.unwrap_or(0);
        patch_status(&deps, &d.metadata.name.unwrap(), json!({"observedGeneration": g, "replicas": n, "readyReplicas": n, "updatedReplicas": n, "availableReplicas": n})).await;
    }
}

async fn sts_replicas(client: &kube::Client, ns: &str, name: &str) -> Option<i32> {
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|s| s.spec?.replicas)
}

async fn wait_sts_replicas(client: &kube::Client, ns: &str, name: &str, want: Option<i32>) {
    eventually(
        &format!("StatefulSet {name} replicas {want:?}"),
        WAIT,
        || async {
            let got = sts_replicas(client, ns, name).await;
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await;
}

async fn resource_versions(client: &kube::Client, ns: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for kind in Kind::ALL.iter().filter(|k| **k != Kind::LeaderWorkerSet) {
        let list = dyn_api(client, ns, *kind)
            .list_metadata(
                &ListParams::default().labels("app.kubernetes.io/managed-by=infera-operator"),
            )
            .await
            .unwrap();
        for item in list.items {
            out.insert(
                format!("{kind:?}/{}", item.metadata.name.unwrap()),
                item.metadata.resource_version.unwrap(),
            );
        }
    }
    out
}

async fn events_for(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String)> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

fn apply_file(kubeconfig: &Path, ns: &str, path: &Path) {
    let p = path.to_string_lossy().into_owned();
    let (ok, out, err) = apply_retrying(kubeconfig, &["apply", "-n", ns, "-f", &p], None);
    assert!(ok, "kubectl apply {p}: {out}{err}");
}

fn apply_yaml(kubeconfig: &Path, ns: &str, yaml: &str) {
    let (ok, out, err) = apply_retrying(kubeconfig, &["apply", "-n", ns, "-f", "-"], Some(yaml));
    assert!(ok, "kubectl apply: {out}{err}\n{yaml}");
}

#[tokio::test]
async fn every_example_is_rendered_becomes_ready_scales_and_reconciles_idempotently() {
    let client = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    install(&client).await;
    let ns = namespace(&client).await;
    // examples/gateway-api renders an InferencePool and an HTTPRoute.
    support::install_gateway_crds(&client, &kubeconfig).await;
    let examples: Vec<PathBuf> = support::example_dirs()
        .into_iter()
        .filter(|p| !p.ends_with("multi-node-worker"))
        .collect();
    let mut names = Vec::new();
    for dir in &examples {
        apply_file(&kubeconfig, &ns, &dir.join("deployment.yaml"));
        let text = std::fs::read_to_string(dir.join("deployment.yaml")).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        let out: Vec<String> = docs
            .iter()
            .filter(|d| d["kind"] == "InferaDeployment")
            .map(|d| d["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        names.extend(out);
    }
    assert!(names.len() >= 8, "{names:?}");
    let op = Operator::start(&kubeconfig, &ns, &[]).await;
    let hugging_face = ["llama-70b", "gpt-oss", "qwen3-235b"];
    for name in &names {
        let downloading = hugging_face.contains(&name.as_str());
        expect_children(&client, &ns, name, !downloading).await;
        if downloading {
            let d = wait_condition(
                &client,
                &ns,
                name,
                "Progressing",
                "True",
                Some("ModelDownloading"),
            )
            .await;
            assert_eq!(condition(&d, "Ready").unwrap().1, "ModelDownloading");
        } else {
            wait_condition(
                &client,
                &ns,
                name,
                "Ready",
                "False",
                Some("WorkersNotReady"),
            )
            .await;
        }
    }
    // The download Jobs finish: workers are scaled to their desired size.
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    for name in hugging_face {
        let job = format!("{name}-model-download");
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        patch_status(&jobs, &job, json!({"startTime": now, "completionTime": now, "succeeded": 1, "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "lastProbeTime": now, "lastTransitionTime": now},
            {"type": "Complete", "status": "True", "lastProbeTime": now, "lastTransitionTime": now}]})).await;
        expect_children(&client, &ns, name, true).await;
    }
    wait_sts_replicas(&client, &ns, "llama-70b-mixed", Some(4)).await;
    // The finished download is recorded on the cache PVC, so losing the Job (deleted,
    // or replaced after an image change) never takes the workers down.
    let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &ns);
    let pvc = pvcs.get("llama-70b-model-cache").await.unwrap();
    let recorded = pvc
        .metadata
        .annotations
        .unwrap_or_default()
        .get("infera.amd.com/downloaded")
        .cloned();
    assert_eq!(
        recorded.as_deref(),
        Some("amd/Llama-3.1-70B-Instruct-FP8-KV@main")
    );
    eventually("the finished download Job pruned", WAIT, || async {
        match jobs.get_opt("llama-70b-model-download").await.unwrap() {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await;
    make_ready(&client, &ns).await;
    for name in &names {
        let d = wait_condition(&client, &ns, name, "Ready", "True", Some("AllReady")).await;
        let s = d.status.unwrap();
        assert_eq!(s.replicas, d.spec.replicas, "{name}");
        assert_eq!(s.ready_replicas, d.spec.replicas, "{name}");
        assert_eq!(
            s.selector.as_deref(),
            Some(
                format!("infera.amd.com/deployment={name},app.kubernetes.io/component=engine")
                    .as_str()
            )
        );
        assert_eq!(
            s.gateway_endpoint,
            Some(format!(
                "http://{name}-gateway.{ns}:{}",
                d.spec.gateway.service.port
            ))
        );
        assert_eq!(
            condition_of(&client, &ns, name, "Degraded").await.1,
            "AsExpected"
        );
    }
    // The Ready event follows the status write.
    eventually("a Ready event", WAIT, || async {
        let events = events_for(&client, &ns, "sim-mixed").await;
        if events.iter().any(|(r, _)| r == "Ready") {
            Ok(())
        } else {
            Err(format!("{events:?}"))
        }
    })
    .await;

    // A second reconcile of unchanged deployments changes no child.
    let before = resource_versions(&client, &ns).await;
    let count = op.reconciles().await;
    let (ok, _, err) = kubectl(
        &kubeconfig,
        &[
            "annotate",
            "-n",
            &ns,
            "inferadeployments",
            "--all",
            "infera.test/nudge=1",
        ],
        None,
    );
    assert!(ok, "{err}");
    let want = count + names.len() as u64;
    eventually("a reconcile of every deployment", WAIT, || async {
        let n = op.reconciles().await;
        if n >= want {
            Ok(())
        } else {
            Err(format!("{n} of {want}"))
        }
    })
    .await;
    assert_eq!(
        resource_versions(&client, &ns).await,
        before,
        "re-applying unchanged children must not write them\n{}",
        op.log_tail()
    );

    // kubectl scale goes through /scale and keeps the topology's 2P1D ratio.
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[
            "scale",
            "-n",
            &ns,
            "inferadeployment/qwen3-235b",
            "--replicas=2",
        ],
        None,
    );
    assert!(ok, "{out}{err}");
    wait_sts_replicas(&client, &ns, "qwen3-235b-prefill", Some(4)).await;
    wait_sts_replicas(&client, &ns, "qwen3-235b-decode", Some(2)).await;
    let d = wait_condition(
        &client,
        &ns,
        "qwen3-235b",
        "Ready",
        "False",
        Some("WorkersNotReady"),
    )
    .await;
    let roles: Vec<(String, i32)> = d
        .status
        .unwrap()
        .roles
        .into_iter()
        .map(|r| (r.role, r.replicas))
        .collect();
    assert_eq!(
        roles,
        vec![("prefill".to_owned(), 4), ("decode".to_owned(), 2)]
    );
    op.assert_never_forbidden();
    support::drop_namespace(&client, &ns).await;
}

async fn condition_of(
    client: &kube::Client,
    ns: &str,
    name: &str,
    type_: &str,
) -> (String, String, String) {
    condition(&get_idep(client, ns, name).await, type_).unwrap_or_default()
}

const SHAPE: &str = r#"
apiVersion: infera.amd.com/v1alpha1
kind: PDTopology
metadata: {name: shape}
spec:
  layout: 1P1D
  transport: {backend: mooncake}
"#;

const PD_SIM: &str = r#"
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: pd}
spec:
  model:
    name: sim-8b
    source: {hostPath: {path: /models/none}}
  engine: {kind: sim, simFlavor: FLAVOR}
  serving: {mode: disaggregated, topologyRef: shape}
"#;

#[tokio::test]
async fn topologies_are_followed_problems_are_degraded_and_leftovers_pruned() {
    let client = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    install(&client).await;
    let ns = namespace(&client).await;
    let op = Operator::start(&kubeconfig, &ns, &[]).await;
    // The topology does not exist yet: Degraded with the reason, and an Event.
    apply_yaml(&kubeconfig, &ns, &PD_SIM.replace("FLAVOR", "vllm"));
    let d = wait_condition(
        &client,
        &ns,
        "pd",
        "Degraded",
        "True",
        Some("TopologyNotFound"),
    )
    .await;
    assert!(condition(&d, "Degraded").unwrap().2.contains("\"shape\""));
    let events = eventually("a TopologyNotFound event", WAIT, || async {
        let e = events_for(&client, &ns, "pd").await;
        if e.iter().any(|(r, _)| r == "TopologyNotFound") {
            Ok(e)
        } else {
            Err(format!("{e:?}"))
        }
    })
    .await;
    assert!(
        events
            .iter()
            .any(|(_, note)| note.contains("does not exist")),
        "{events:?}"
    );
    assert_eq!(sts_replicas(&client, &ns, "pd-prefill").await, None);
    // Creating it renders the deployment (the operator watches topologies).
    apply_yaml(&kubeconfig, &ns, SHAPE);
    wait_sts_replicas(&client, &ns, "pd-prefill", Some(1)).await;
    wait_sts_replicas(&client, &ns, "pd-decode", Some(1)).await;
    wait_condition(&client, &ns, "pd", "Degraded", "False", Some("AsExpected")).await;
    // Editing the topology re-renders the deployments using it.
    apply_yaml(
        &kubeconfig,
        &ns,
        &SHAPE.replace(
            "layout: 1P1D",
            "layout: custom\n  prefill: {replicas: 2}\n  decode: {replicas: 3}",
        ),
    );
    wait_sts_replicas(&client, &ns, "pd-prefill", Some(2)).await;
    wait_sts_replicas(&client, &ns, "pd-decode", Some(3)).await;
    // An engine the transport cannot carry: Degraded, and the running workers stay.
    apply_yaml(
        &kubeconfig,
        &ns,
        &SHAPE.replace("backend: mooncake", "backend: mori").replace(
            "layout: 1P1D",
            "layout: custom\n  prefill: {replicas: 2}\n  decode: {replicas: 3}",
        ),
    );
    apply_yaml(&kubeconfig, &ns, &PD_SIM.replace("FLAVOR", "atom"));
    let d = wait_condition(
        &client,
        &ns,
        "pd",
        "Degraded",
        "True",
        Some("UnsupportedTransport"),
    )
    .await;
    assert!(
        condition(&d, "Degraded").unwrap().2.contains("mooncake"),
        "{d:?}"
    );
    assert_eq!(
        sts_replicas(&client, &ns, "pd-prefill").await,
        Some(2),
        "a bad edit loses nothing"
    );
    let topologies: Api<PDTopology> = Api::namespaced(client.clone(), &ns);
    let t = eventually("the topology's status naming its user", WAIT, || async {
        let t = topologies.get("shape").await.map_err(|e| e.to_string())?;
        let s = t.status.clone().unwrap_or_default();
        match s.conditions.first() {
            Some(c) if s.used_by == ["pd"] && c.status == "False" => Ok(c.clone()),
            other => Err(format!("{:?} {other:?}", s.used_by)),
        }
    })
    .await;
    assert_eq!(t.reason, "UnsupportedTransport");
    assert!(t.message.starts_with("pd (engine sim)"), "{}", t.message);
    // Mixed mode with etcd discovery: the prefill/decode sets and the discovery Role go.
    apply_yaml(
        &kubeconfig,
        &ns,
        r#"
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: pd}
spec:
  replicas: 2
  model:
    name: sim-8b
    source: {hostPath: {path: /models/none}}
  engine: {kind: sim}
  discovery: {backend: etcd, etcd: {endpoints: ["http://etcd.infera-system:2379"]}}
"#,
    );
    wait_sts_replicas(&client, &ns, "pd-mixed", Some(2)).await;
    wait_sts_replicas(&client, &ns, "pd-prefill", None).await;
    wait_sts_replicas(&client, &ns, "pd-decode", None).await;
    let roles: Api<DynamicObject> = dyn_api(&client, &ns, Kind::Role);
    eventually("the discovery Role pruned", WAIT, || async {
        match roles.get_opt("pd-infera").await.unwrap() {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await;
    // The Event follows the deletions it reports.
    eventually("a Pruned event naming the prefill set", WAIT, || async {
        let events = events_for(&client, &ns, "pd").await;
        if events
            .iter()
            .any(|(r, n)| r == "Pruned" && n.contains("pd-prefill"))
        {
            Ok(())
        } else {
            Err(format!("{events:?}"))
        }
    })
    .await;
    wait_condition(&client, &ns, "pd", "Degraded", "False", None).await;
    // The topology follows its users: pd no longer references it (usedBy used to keep
    // naming it), a new user appears, and goes again when deleted.
    wait_used_by(&topologies, "shape", &[], "Unused").await;
    apply_yaml(
        &kubeconfig,
        &ns,
        &PD_SIM
            .replace("FLAVOR", "vllm")
            .replace("name: pd}", "name: pd2}"),
    );
    wait_used_by(&topologies, "shape", &["pd2"], "TransportSupported").await;
    kube::Api::<InferaDeployment>::namespaced(client.clone(), &ns)
        .delete("pd2", &Default::default())
        .await
        .unwrap();
    wait_used_by(&topologies, "shape", &[], "Unused").await;
    // A topology nothing ever referenced gets its status too.
    apply_yaml(
        &kubeconfig,
        &ns,
        &SHAPE.replace("name: shape", "name: spare"),
    );
    wait_used_by(&topologies, "spare", &[], "Unused").await;
    op.assert_never_forbidden();
    support::drop_namespace(&client, &ns).await;
}

/// Waits until topology `name` lists exactly `users` with `Valid` for `reason`.
async fn wait_used_by(topologies: &Api<PDTopology>, name: &str, users: &[&str], reason: &str) {
    eventually(
        &format!("{name}: usedBy {users:?}, {reason}"),
        WAIT,
        || async {
            let t = topologies.get(name).await.map_err(|e| e.to_string())?;
            let s = t.status.clone().unwrap_or_default();
            match s.conditions.first() {
                Some(c) if s.used_by == users && c.reason == reason => Ok(()),
                other => Err(format!("{:?} {other:?}", s.used_by)),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_worker_spanning_nodes_needs_the_leader_worker_set_crd() {
    let Some(lws_crds) = third_party_crds("LWS") else {
        panic!(
            "testenv/crds.sh could not fetch the LeaderWorkerSet CRD (sigs.k8s.io/lws); see its output"
        );
    };
    let client = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    install(&client).await;
    // Start from a cluster without LWS (the shared server may have it from a run before).
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let lws_crd = "leaderworkersets.leaderworkerset.x-k8s.io";
    let _ = crds.delete(lws_crd, &DeleteParams::default()).await;
    eventually("the LWS CRD gone", WAIT, || async {
        if crds.get_opt(lws_crd).await.unwrap().is_none()
            && !infera_operator::reconcile::observe::lws_installed(&client).await
        {
            Ok(())
        } else {
            Err("still served".to_owned())
        }
    })
    .await;
    let ns = namespace(&client).await;
    let op = Operator::start(&kubeconfig, &ns, &[]).await;
    apply_file(
        &kubeconfig,
        &ns,
        &repo().join("examples/multi-node-worker/deployment.yaml"),
    );
    let d = wait_condition(
        &client,
        &ns,
        "r1-two-node",
        "Degraded",
        "True",
        Some("LeaderWorkerSetMissing"),
    )
    .await;
    assert!(
        condition(&d, "Degraded")
            .unwrap()
            .2
            .contains("LeaderWorkerSet")
    );
    let gw: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    assert!(
        gw.get_opt("r1-two-node-gateway").await.unwrap().is_some(),
        "the rest of the deployment is applied"
    );
    // Installing LWS (its CRD from the LWS Go module's source) lets the workers render.
    install_crd_dir(&client, &kubeconfig, &lws_crds).await;
    nudge(&kubeconfig, &ns, "r1-two-node", 1);
    let names = expect_children(&client, &ns, "r1-two-node", true).await;
    assert!(names.contains(&(Kind::LeaderWorkerSet, "r1-two-node-mixed".into())));
    wait_condition(
        &client,
        &ns,
        "r1-two-node",
        "Degraded",
        "False",
        Some("AsExpected"),
    )
    .await;
    let lws = dyn_api(&client, &ns, Kind::LeaderWorkerSet);
    lws.patch_status(
        "r1-two-node-mixed",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"replicas": 1, "readyReplicas": 1}})),
    )
    .await
    .unwrap();
    make_ready(&client, &ns).await;
    nudge(&kubeconfig, &ns, "r1-two-node", 2);
    wait_condition(
        &client,
        &ns,
        "r1-two-node",
        "Ready",
        "True",
        Some("AllReady"),
    )
    .await;
    op.assert_never_forbidden();
    support::drop_namespace(&client, &ns).await;
}

/// Nudges the operator to reconcile `name` now (an annotation: a watched change).
fn nudge(kubeconfig: &Path, ns: &str, name: &str, n: u32) {
    let (ok, _, err) = kubectl(
        kubeconfig,
        &[
            "annotate",
            "--overwrite",
            "-n",
            ns,
            &format!("inferadeployment/{name}"),
            &format!("infera.test/nudge={n}"),
        ],
        None,
    );
    assert!(ok, "{err}");
}

#[tokio::test]
async fn an_inference_pool_reports_its_pickers_and_what_the_gateways_controller_wrote() {
    // No Gateway controller runs on a bare API server: the test writes the HTTPRoute's
    // status.parents as one would (on the node no status is ever written).
    let client = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    install(&client).await;
    support::install_gateway_crds(&client, &kubeconfig).await;
    let ns = namespace(&client).await;
    let op = Operator::start(&kubeconfig, &ns, &[]).await;
    apply_file(
        &kubeconfig,
        &ns,
        &repo().join("examples/gateway-api/deployment.yaml"),
    );
    let names = expect_children(&client, &ns, "pool-mixed", true).await;
    for want in [
        (Kind::InferencePool, "pool-mixed-pool"),
        (Kind::HttpRoute, "pool-mixed-route"),
        (Kind::Deployment, "pool-mixed-epp"),
    ] {
        assert!(names.contains(&(want.0, want.1.to_owned())), "{names:?}");
    }
    expect_children(&client, &ns, "pool-pd", true).await;
    let d = wait_condition(
        &client,
        &ns,
        "pool-mixed",
        "InferencePoolReady",
        "False",
        Some("PickerNotReady"),
    )
    .await;
    assert!(
        condition(&d, "InferencePoolReady")
            .unwrap()
            .2
            .contains("0 of 2 endpoint picker pods ready"),
        "{:?}",
        condition(&d, "InferencePoolReady")
    );
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    patch_status(
        &deps,
        "pool-mixed-epp",
        json!({"replicas": 2, "readyReplicas": 2}),
    )
    .await;
    nudge(&kubeconfig, &ns, "pool-mixed", 1);
    let d = wait_condition(
        &client,
        &ns,
        "pool-mixed",
        "InferencePoolReady",
        "False",
        Some("GatewayNotFound"),
    )
    .await;
    let status = d.status.unwrap().inference_pool.unwrap();
    assert_eq!(
        (status.picker_replicas, status.picker_ready_replicas),
        (2, 2)
    );
    let route = status.route.unwrap();
    assert_eq!(route.gateway, format!("{ns}/inference-gateway"));
    assert_eq!(route.gateway_found, Some(false));
    // The user's Gateway appears; its controller has not looked at the route yet.
    let gateways = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &ns,
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"),
            "gateways",
        ),
    );
    let gateway: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "inference-gateway"},
        "spec": {"gatewayClassName": "test", "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]},
    }))
    .unwrap();
    gateways
        .create(&Default::default(), &gateway)
        .await
        .unwrap();
    nudge(&kubeconfig, &ns, "pool-mixed", 2);
    wait_condition(
        &client,
        &ns,
        "pool-mixed",
        "InferencePoolReady",
        "False",
        Some("RoutePending"),
    )
    .await;
    // Its controller refuses the route, then accepts it.
    let routes = dyn_api(&client, &ns, Kind::HttpRoute);
    let parent = |status: &str, reason: &str, message: &str| {
        json!({"parents": [{
            "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway", "namespace": ns},
            "controllerName": "example.com/gateway-controller",
            "conditions": [{"type": "Accepted", "status": status, "reason": reason, "message": message,
                            "lastTransitionTime": "2026-12-04T00:00:00Z", "observedGeneration": 1}],
        }]})
    };
    patch_status(
        &routes,
        "pool-mixed-route",
        parent(
            "False",
            "NotAllowedByListeners",
            "no listener allows routes from this namespace",
        ),
    )
    .await;
    nudge(&kubeconfig, &ns, "pool-mixed", 3);
    let d = wait_condition(
        &client,
        &ns,
        "pool-mixed",
        "InferencePoolReady",
        "False",
        Some("RouteNotAccepted"),
    )
    .await;
    let message = condition(&d, "InferencePoolReady").unwrap().2;
    assert!(
        message.contains("NotAllowedByListeners: no listener allows routes"),
        "{message}"
    );
    patch_status(
        &routes,
        "pool-mixed-route",
        parent("True", "Accepted", "accepted"),
    )
    .await;
    nudge(&kubeconfig, &ns, "pool-mixed", 4);
    let d = wait_condition(
        &client,
        &ns,
        "pool-mixed",
        "InferencePoolReady",
        "True",
        Some("Ready"),
    )
    .await;
    let route = d.status.unwrap().inference_pool.unwrap().route.unwrap();
    assert_eq!(
        (route.accepted, route.reason.as_deref()),
        (Some(true), Some("Accepted"))
    );
    // The pool's own acceptance, as the controller writes it in its status.parents.
    let pools = dyn_api(&client, &ns, Kind::InferencePool);
    patch_status(
        &pools,
        "pool-mixed-pool",
        parent("False", "Unsupported", "no InferencePool support"),
    )
    .await;
    nudge(&kubeconfig, &ns, "pool-mixed", 5);
    wait_condition(
        &client,
        &ns,
        "pool-mixed",
        "InferencePoolReady",
        "False",
        Some("PoolNotAccepted"),
    )
    .await;
    patch_status(
        &pools,
        "pool-mixed-pool",
        parent("True", "Accepted", "accepted"),
    )
    .await;
    nudge(&kubeconfig, &ns, "pool-mixed", 6);
    let d = wait_condition(
        &client,
        &ns,
        "pool-mixed",
        "InferencePoolReady",
        "True",
        Some("Ready"),
    )
    .await;
    assert_eq!(
        d.status.unwrap().inference_pool.unwrap().pool_accepted,
        Some(true)
    );
    // Taking the field out prunes the pool, the route and the picker.
    let (ok, _, err) = kubectl(
        &kubeconfig,
        &[
            "patch",
            "-n",
            &ns,
            "inferadeployment/pool-mixed",
            "--type=json",
            "-p",
            r#"[{"op": "remove", "path": "/spec/gateway/inferencePool"}]"#,
        ],
        None,
    );
    assert!(ok, "{err}");
    for (kind, name) in [
        (Kind::InferencePool, "pool-mixed-pool"),
        (Kind::HttpRoute, "pool-mixed-route"),
        (Kind::Deployment, "pool-mixed-epp"),
        (Kind::Service, "pool-mixed-epp"),
        (Kind::ServiceAccount, "pool-mixed-epp"),
        (Kind::Role, "pool-mixed-epp"),
        (Kind::RoleBinding, "pool-mixed-epp"),
        (Kind::PodDisruptionBudget, "pool-mixed-epp"),
    ] {
        let api = dyn_api(&client, &ns, kind);
        eventually(&format!("{kind:?} {name} pruned"), WAIT, || async {
            match api.get_opt(name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err("still there".to_owned()),
            }
        })
        .await;
    }
    let d = get_idep(&client, &ns, "pool-mixed").await;
    assert!(condition(&d, "InferencePoolReady").is_none());
    op.assert_never_forbidden();
    support::drop_namespace(&client, &ns).await;
}

#[tokio::test]
async fn a_killed_operator_is_replaced_and_the_new_leader_converges() {
    let client = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    install(&client).await;
    let ns = namespace(&client).await;
    let lease = ["--lease-duration-seconds", "3"];
    let mut first = Operator::start(&kubeconfig, &ns, &lease).await;
    eventually("the first operator leading", WAIT, || async {
        if first.metric("infera_operator_leader").await == 1 {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await;
    apply_file(
        &kubeconfig,
        &ns,
        &repo().join("examples/sim/deployment.yaml"),
    );
    // Kill it as soon as it has started writing children: mid-reconcile.
    let sa = dyn_api(&client, &ns, Kind::ServiceAccount);
    eventually("the first child", WAIT, || async {
        let l = sa
            .list_metadata(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        if l.items.iter().any(|i| {
            i.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.ends_with("-infera"))
        }) {
            Ok(())
        } else {
            Err("none".to_owned())
        }
    })
    .await;
    first.process.kill();
    let second = Operator::start(&kubeconfig, &ns, &lease).await;
    let standby = Operator::start(&kubeconfig, &ns, &lease).await;
    for name in ["sim-mixed", "sim-pd"] {
        expect_children(&client, &ns, name, true).await;
    }
    make_ready(&client, &ns).await;
    for name in ["sim-mixed", "sim-pd"] {
        wait_condition(&client, &ns, name, "Ready", "True", Some("AllReady")).await;
    }
    let leaders = second.metric("infera_operator_leader").await
        + standby.metric("infera_operator_leader").await;
    assert_eq!(leaders, 1, "exactly one replica leads");
    let holder = Api::<Lease>::namespaced(client.clone(), support::OPERATOR_NAMESPACE)
        .get(&format!("op-{ns}"))
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    let leader = if second.metric("infera_operator_leader").await == 1 {
        &second
    } else {
        &standby
    };
    assert!(
        holder.ends_with(&format!("_{}", leader.process.pid())),
        "{holder}"
    );
    assert_eq!(
        (if std::ptr::eq(leader, &second) {
            &standby
        } else {
            &second
        })
        .reconciles()
        .await,
        0,
        "the standby does not reconcile"
    );
    for op in [&second, &standby] {
        op.assert_never_forbidden();
    }
    support::drop_namespace(&client, &ns).await;
}

/// The chart's pull secret (`imagePullSecrets` in the operator's namespace) is copied
/// into the deployment's namespace and named by every pod the operator renders there,
/// with the chart's pull policy on Infera's images; the operator needs no more than the
/// chart's RBAC for it; new engines run this release (`status.platform`).
#[tokio::test]
async fn the_operators_pull_secret_is_copied_and_named_by_every_pod() {
    let client = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    install(&client).await;
    let ns = namespace(&client).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), support::OPERATOR_NAMESPACE);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "fixture-pull"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": r#"{"auths":{"registry.example":{"auth":"Zml4dHVyZTpwdWxs"}}}"#},
    }))
    .unwrap();
    secrets
        .patch(
            "fixture-pull",
            &PatchParams::apply("fixture").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
    apply_yaml(
        &kubeconfig,
        &ns,
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: pulled}
spec:
  model: {name: pulled-model, source: {hostPath: {path: /models/none}}}
  engine: {kind: sim}
",
    );
    let op = Operator::start_with_env(
        &kubeconfig,
        &ns,
        &[
            "--image-pull-secret",
            "fixture-pull",
            "--image-pull-policy",
            "Always",
        ],
        &[("POD_NAMESPACE", support::OPERATOR_NAMESPACE)],
    )
    .await;
    let copies: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let copy = support::eventually(
        "the pull secret's copy",
        Duration::from_secs(60),
        || async {
            copies
                .get_opt("pulled-pull-fixture-pull")
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "not yet".to_owned())
        },
    )
    .await;
    assert_eq!(
        copy.type_.as_deref(),
        Some("kubernetes.io/dockerconfigjson")
    );
    assert_eq!(copy.data, secrets.get("fixture-pull").await.unwrap().data);
    let sets = dyn_api(&client, &ns, Kind::StatefulSet);
    let sts = support::eventually(
        "the engine StatefulSet",
        Duration::from_secs(60),
        || async {
            sets.get_opt("pulled-mixed")
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "not yet".to_owned())
        },
    )
    .await;
    let pod = &sts.data["spec"]["template"]["spec"];
    assert_eq!(
        pod["imagePullSecrets"],
        json!([{"name": "pulled-pull-fixture-pull"}]),
        "{pod}"
    );
    let sidecar = pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sidecar")
        .unwrap();
    assert_eq!(sidecar["imagePullPolicy"], "Always");
    assert_eq!(
        sts.metadata.annotations.as_ref().unwrap()["infera.amd.com/platform-version"],
        env!("CARGO_PKG_VERSION")
    );
    let gateways = dyn_api(&client, &ns, Kind::Deployment);
    let gw = support::eventually(
        "the gateway Deployment",
        Duration::from_secs(60),
        || async {
            gateways
                .get_opt("pulled-gateway")
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "not yet".to_owned())
        },
    )
    .await;
    assert_eq!(
        gw.data["spec"]["template"]["spec"]["imagePullSecrets"],
        json!([{"name": "pulled-pull-fixture-pull"}])
    );
    let d = support::eventually("status.platform", Duration::from_secs(60), || async {
        get_idep(&client, &ns, "pulled")
            .await
            .status
            .and_then(|s| s.platform)
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    assert_eq!(d.engines, env!("CARGO_PKG_VERSION"));
    assert_eq!(d.available, None);
    op.assert_never_forbidden();
    support::drop_namespace(&client, &ns).await;
}
