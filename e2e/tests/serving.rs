//! What a platform team serves on the node, beyond the first example: every
//! prefill/decode layout (1P1D, 2P1D, 1P2D) with each connector the simulator checks
//! (SGLang bootstrap, vLLM Mooncake, vLLM MoRI write and read, ATOM Mooncake), and
//! mixed workers found through the chart's etcd instead of Pod annotations. Requests go
//! through each gateway's Service as a client's would.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::deploy::ROLLOUT;
use infera_e2e::etcd::ChartEtcd;
use infera_e2e::{Cluster, eventually};
use serde_json::{Value, json};

/// Small gateways: four deployments share the node's 2 CPUs.
const SMALL_GATEWAY: &str = "gateway: {resources: {requests: {cpu: 50m, memory: 64Mi}}}";

fn pd_manifest(name: &str, flavor: &str, layout: &str, transport: &str) -> String {
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: PDTopology
metadata: {{name: {name}}}
spec: {{layout: {layout}, transport: {transport}}}
---
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  model: {{name: {name}-model, source: {{hostPath: {{path: /models/none}}}}}}
  engine: {{kind: sim, simFlavor: {flavor}}}
  serving: {{mode: disaggregated, topologyRef: {name}}}
  {SMALL_GATEWAY}
"
    )
}

/// The deployment that also carries pod-template overrides.
const OVERRIDDEN: &str = "pd-mori";

/// Pod-template overrides for every engine pod, decode pods alone, and the gateway,
/// added by a merge patch of the applied deployment (its workers roll to the new
/// template).
const OVERRIDE_PATCH: &str = r#"{"spec": {
  "engine": {
    "podTemplate": {
      "metadata": {"labels": {"team": "llm"}},
      "spec": {
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "64Mi"}}],
        "containers": [{"name": "engine",
          "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
          "env": [{"name": "INFERA_E2E_OVERRIDE", "value": "1"}]}]
      }
    },
    "rolePodTemplates": {"decode": {"metadata": {"annotations": {"infera.e2e/role": "decode"}}}}
  },
  "gateway": {"podTemplate": {"metadata": {"labels": {"team": "llm"}}}}
}}"#;

/// What is wrong with one running engine pod of the overridden deployment, if anything:
/// every engine pod has the label, the scratch volume mounted in its engine and the
/// env; decode pods alone the annotation.
fn override_missing(pod: &Value) -> Option<String> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let engine = pod["spec"]["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == "engine")?;
    let has = |list: &str, key: &str, value: &str, key2: &str, value2: &str| {
        engine[list]
            .as_array()
            .is_some_and(|l| l.iter().any(|m| m[key] == value && m[key2] == value2))
    };
    let decode = pod["metadata"]["labels"]["infera.amd.com/role"] == "decode";
    let checks = [
        ("label team=llm", pod["metadata"]["labels"]["team"] == "llm"),
        ("phase Running", pod["status"]["phase"] == "Running"),
        (
            "not terminating",
            pod["metadata"]["deletionTimestamp"].is_null(),
        ),
        (
            "/scratch mounted",
            has("volumeMounts", "name", "scratch", "mountPath", "/scratch"),
        ),
        (
            "env INFERA_E2E_OVERRIDE",
            has("env", "name", "INFERA_E2E_OVERRIDE", "value", "1"),
        ),
        (
            "the decode annotation on decode pods only",
            pod["metadata"]["annotations"]["infera.e2e/role"].as_str()
                == decode.then_some("decode"),
        ),
    ];
    checks
        .iter()
        .find(|(_, ok)| !ok)
        .map(|(what, _)| format!("{name}: {what}"))
}

/// The overrides reached the running pods once the workers rolled: both engine pods
/// (see [`override_missing`]) and the gateway pods' label.
async fn assert_overrides_on_running_pods(cluster: &Cluster, ns: &str) {
    let gateway_pods =
        format!("infera.amd.com/deployment={OVERRIDDEN},app.kubernetes.io/component=gateway");
    eventually(
        cluster,
        ns,
        "the overrides on the running pods",
        ROLLOUT,
        || {
            let gateway_pods = gateway_pods.clone();
            async move {
                let pods = cluster
                    .engine_pods(ns, OVERRIDDEN)
                    .await
                    .map_err(|e| e.to_string())?;
                if pods.len() != 2 {
                    return Err(format!("{} engine pods", pods.len()));
                }
                if let Some(missing) = pods.iter().find_map(override_missing) {
                    return Err(missing);
                }
                let gateways = cluster
                    .pods(ns, &gateway_pods)
                    .await
                    .map_err(|e| e.to_string())?;
                match gateways
                    .iter()
                    .find(|p| p["metadata"]["labels"]["team"] != "llm")
                {
                    Some(p) => Err(format!(
                        "gateway {} without the label",
                        p["metadata"]["name"]
                    )),
                    None if gateways.is_empty() => Err("no gateway pod".into()),
                    None => Ok(()),
                }
            }
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn every_pd_layout_serves_prefill_then_decode_through_its_gateway_service() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-pd").await.unwrap();
    let ns = ns.name.clone();
    // (deployment, flavor, layout, transport, protocol, prefill workers, decode workers)
    let cases = [
        (
            "pd-sglang",
            "sglang",
            "1P1D",
            "{backend: mooncake}",
            "sglang-bootstrap",
            1,
            1,
        ),
        (
            "pd-vllm",
            "vllm",
            "2P1D",
            "{backend: mooncake}",
            "vllm-mooncake",
            2,
            1,
        ),
        (
            "pd-atom",
            "atom",
            "1P2D",
            "{backend: mooncake}",
            "atom-mooncake",
            1,
            2,
        ),
        (
            "pd-mori",
            "vllm",
            "1P1D",
            "{backend: mori}",
            "vllm-mori-write",
            1,
            1,
        ),
        (
            "pd-mori-read",
            "vllm",
            "1P1D",
            "{backend: mori, readMode: true}",
            "vllm-mori-read",
            1,
            1,
        ),
    ];
    for (name, flavor, layout, transport, ..) in cases {
        cluster
            .apply(&ns, &pd_manifest(name, flavor, layout, transport))
            .await
            .unwrap();
    }
    for (name, _, _, _, protocol, prefill, decode) in cases {
        let idep = cluster.wait_ready(&ns, name).await.unwrap();
        let roles: Vec<(String, i64)> = idep["status"]["roles"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["role"].as_str().unwrap().to_owned(),
                    r["readyReplicas"].as_i64().unwrap(),
                )
            })
            .collect();
        assert!(
            roles.contains(&("prefill".into(), prefill)),
            "{name}: {roles:?}"
        );
        assert!(
            roles.contains(&("decode".into(), decode)),
            "{name}: {roles:?}"
        );

        if name == OVERRIDDEN {
            // Patched once it serves: its workers and gateway roll to the new templates.
            cluster
                .kubectl(&[
                    "patch",
                    "idep",
                    "-n",
                    &ns,
                    name,
                    "--type",
                    "merge",
                    "-p",
                    OVERRIDE_PATCH,
                ])
                .await
                .unwrap();
            assert_overrides_on_running_pods(&cluster, &ns).await;
        }
        let gateway = cluster
            .gateway_on_node_port(&ns, name, (prefill + decode) as usize)
            .await
            .unwrap();
        let model = format!("{name}-model");
        // ATOM's Mooncake connector serves completions only.
        let (path, body) = if flavor_is_atom(name) {
            (
                "/v1/completions",
                json!({"model": model, "max_tokens": 6, "prompt": "Disaggregated, on a real node"}),
            )
        } else {
            (
                "/v1/chat/completions",
                json!({"model": model, "max_tokens": 6,
                       "messages": [{"role": "user", "content": "Disaggregated, on a real node"}]}),
            )
        };
        let answer = gateway.post(path, &body).await.unwrap();
        assert_eq!(answer.status, 200, "{name}: {}", answer.body);
        let roles_picked: Vec<&str> = answer
            .picked
            .iter()
            .map(|p| p.split('/').next().unwrap())
            .collect();
        assert!(
            roles_picked.contains(&"prefill") && roles_picked.contains(&"decode"),
            "{name}: picked {:?}",
            answer.picked
        );
        let ok = gateway
            .metric(&format!(
                "infera_pd_requests_total{{protocol=\"{protocol}\",outcome=\"ok\"}}"
            ))
            .await
            .unwrap();
        assert!(ok >= 1.0, "{name}: no {protocol} request counted as ok");
        if flavor_is_atom(name) {
            let chat = gateway
                .post(
                    "/v1/chat/completions",
                    &json!({"model": model, "max_tokens": 4,
                            "messages": [{"role": "user", "content": "chat?"}]}),
                )
                .await
                .unwrap();
            assert_eq!(chat.status, 400, "{name}: {}", chat.body);
            assert!(
                chat.body["error"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("completions"),
                "{name}: {}",
                chat.body
            );
        }
    }
    let foreign = cluster.foreign_status_writers(&ns).await.unwrap();
    assert!(foreign.is_empty(), "{foreign:?}");
}

fn flavor_is_atom(name: &str) -> bool {
    name == "pd-atom"
}

#[tokio::test]
async fn mixed_workers_registered_in_the_charts_etcd_serve() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-etcd").await.unwrap();
    let ns = ns.name.clone();
    let manifest = format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: sim-etcd}}
spec:
  replicas: 2
  model: {{name: sim-etcd-model, source: {{hostPath: {{path: /models/none}}}}}}
  engine: {{kind: sim}}
  discovery: {{backend: etcd}}
  {SMALL_GATEWAY}
"
    );
    cluster.apply(&ns, &manifest).await.unwrap();
    cluster.wait_ready(&ns, "sim-etcd").await.unwrap();
    // The chart's etcd asks for a client certificate: the operator copied the chart's
    // into this namespace, owned by the deployment, for its gateways and sidecars.
    let copy = cluster
        .get_json(&["get", "secret", "sim-etcd-etcd-client", "-n", &ns])
        .await
        .unwrap();
    assert_eq!(copy["metadata"]["ownerReferences"][0]["name"], "sim-etcd");
    let etcd = ChartEtcd::connect(&cluster).await.unwrap();
    // Each sidecar registered its pod's worker under a lease, at the pod's address.
    let pods = cluster.engine_pods(&ns, "sim-etcd").await.unwrap();
    let keys = eventually(
        &cluster,
        &ns,
        "two worker records in etcd",
        ROLLOUT,
        || async {
            let keys = etcd.keys("/infera/workers/").await?;
            let ours: Vec<String> = pods
                .iter()
                .filter_map(|p| p["status"]["podIP"].as_str())
                .map(|ip| format!("/infera/workers/{ip}:8000"))
                .filter(|k| keys.contains(k))
                .collect();
            if ours.len() == 2 {
                Ok(ours)
            } else {
                Err(format!("keys {keys:?}"))
            }
        },
    )
    .await
    .unwrap();
    println!("records: {keys:?}");
    let gateway = cluster
        .gateway_on_node_port(&ns, "sim-etcd", 2)
        .await
        .unwrap();
    for i in 0..4 {
        let answer = gateway
            .post(
                "/v1/chat/completions",
                &json!({"model": "sim-etcd-model", "max_tokens": 4,
                        "messages": [{"role": "user", "content": format!("etcd {i}")}]}),
            )
            .await
            .unwrap();
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    // Deleting the deployment deregisters its workers (leases revoked on drain).
    cluster.delete_deployment(&ns, "sim-etcd").await.unwrap();
    // Well within the 30 s lease: the draining sidecars revoke theirs, the records do not
    // merely expire.
    eventually(
        &cluster,
        &ns,
        "the records gone from etcd",
        std::time::Duration::from_secs(20),
        || async {
            let left: Vec<String> = etcd
                .keys("/infera/workers/")
                .await?
                .into_iter()
                .filter(|k| keys.contains(k))
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("left {left:?}"))
            }
        },
    )
    .await
    .unwrap();
}

/// A kv-aware gateway whose workers read a real tokenizer from a hostPath model folder
/// mounts no model volume: it fetches the workers' tokenizer from their sidecars, the
/// deployment says so in `TokenizerLoaded`, and prompts sharing a prefix meet the
/// worker holding it (the gateway tokenizes as the engines do).
#[tokio::test]
async fn a_gateway_without_the_model_volume_routes_by_the_workers_tokenizer() {
    use infera_testkit::model_files::{FixtureModel, model_dir};
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-tok").await.unwrap();
    let ns = ns.name.clone();
    // The model folder on the node: a tokenizer (Qwen3's) and no weights (simulated);
    // removed when the test ends, passed or not.
    let parent = std::path::Path::new("/var/lib/infera-e2e/models");
    std::fs::create_dir_all(parent).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("tok-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .tempdir_in(parent)
        .unwrap();
    let folder = dir.path().to_owned();
    std::fs::create_dir_all(folder.join("tok")).unwrap();
    let source = model_dir(FixtureModel::Qwen3).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(source.join(file), folder.join("tok").join(file)).unwrap();
    }
    let manifest = format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: tok}}
spec:
  replicas: 2
  model: {{name: tok-model, tokenizer: tok, source: {{hostPath: {{path: {}}}}}}}
  engine: {{kind: sim, simFlavor: vllm}}
  {SMALL_GATEWAY}
",
        folder.display()
    );
    cluster.apply(&ns, &manifest).await.unwrap();
    cluster.wait_ready(&ns, "tok").await.unwrap();
    let deployment = cluster
        .get_json(&["get", "deployment", "tok-gateway", "-n", &ns])
        .await
        .unwrap();
    let template = &deployment["spec"]["template"]["spec"];
    assert!(
        !template.to_string().contains("/model-store"),
        "the gateway mounts no model: {template}"
    );
    assert!(
        template["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--router-tokenizer-from-workers"),
        "{template}"
    );
    let condition = eventually(&cluster, &ns, "TokenizerLoaded True", ROLLOUT, || async {
        let idep = cluster
            .get_json(&["get", "idep", "tok", "-n", &ns])
            .await
            .map_err(|e| e.to_string())?;
        match infera_e2e::deploy::condition(&idep, "TokenizerLoaded") {
            Some(c) if c["status"] == "True" => Ok(c.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    // The digest the gateway loaded is the one the workers' records state.
    let pods = cluster.engine_pods(&ns, "tok").await.unwrap();
    let record: Value = serde_json::from_str(
        pods[0]["metadata"]["annotations"][infera_proto::discovery::WORKER_INFO_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let digest = record["kv"]["tokenizer_digest"].as_str().unwrap();
    assert!(
        condition["message"].as_str().unwrap().contains(digest),
        "{condition} vs {digest}"
    );
    let gateway = cluster.gateway_on_node_port(&ns, "tok", 2).await.unwrap();
    let (status, state) = gateway.get("/infera/tokenizer").await.unwrap();
    assert_eq!(status, 200);
    let state: Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["state"], "loaded");
    assert_eq!(state["digest"], digest);

    // Requests sharing a long prefix land on the worker that cached it.
    let questions = ["And the atlases?", "Who keeps the index?"];
    let (first, answers) = cluster
        .shared_prefix_exchange(
            &ns,
            &gateway,
            "tok-model",
            "Where are the maps?",
            &questions,
        )
        .await
        .unwrap();
    assert_eq!(first.status, 200, "{}", first.body);
    for (question, answer) in questions.iter().zip(&answers) {
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.picked, first.picked, "{question}");
        assert!(
            answer.cached_tokens() > 0,
            "{question}: {}",
            answer.body["usage"]
        );
    }
}
