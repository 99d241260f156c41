use super::*;
use crate::api::{InferaDeployment, PDTopology};
use crate::plan::{EtcdClientTls, Images, LiveEngines};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn images() -> Images {
    Images::from_registry("registry.example/infera", "test")
}

/// Every InferaDeployment and PDTopology of an example file, stored as the API server
/// would (a uid and a namespace).
fn load(path: &Path) -> (Vec<InferaDeployment>, Vec<PDTopology>) {
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let (mut deps, mut topos) = (Vec::new(), Vec::new());
    for mut doc in docs {
        doc["metadata"]["namespace"] = json!("infera");
        let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
        doc["metadata"]["uid"] = json!(format!("uid-{name}"));
        match doc["kind"].as_str() {
            Some("InferaDeployment") => deps.push(serde_json::from_value(doc).unwrap()),
            Some("PDTopology") => topos.push(serde_json::from_value(doc).unwrap()),
            other => panic!("{}: unexpected kind {other:?}", path.display()),
        }
    }
    (deps, topos)
}

fn render_example(dep: &InferaDeployment, topos: &[PDTopology], model_ready: bool) -> Rendered {
    let topology = topos
        .iter()
        .find(|t| t.metadata.name.as_deref() == dep.spec.serving.topology_ref.as_deref());
    render(
        dep,
        Observed {
            topology,
            model_ready,
            ..Default::default()
        },
        &Platform::with_images(images()),
    )
    .unwrap()
}

fn find<'a>(r: &'a Rendered, kind: Kind, name: &str) -> &'a Value {
    &r.children
        .iter()
        .find(|c| c.kind == kind && c.name == name)
        .unwrap_or_else(|| panic!("no {kind:?} {name}"))
        .object
}

fn container<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
    pod["spec"][list]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {list} container {name}"))
}

fn env_value(c: &Value, name: &str) -> Option<String> {
    c["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_owned))
}

fn args(c: &Value, key: &str) -> Vec<String> {
    c[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The rendered children of every example, one YAML file per example folder, compared
/// with the reviewed snapshot in `operator/snapshots/`. `INFERA_UPDATE_SNAPSHOTS=1`
/// rewrites them (then review the diff like code).
#[test]
fn every_example_renders_its_reviewed_snapshot() {
    let update = std::env::var_os("INFERA_UPDATE_SNAPSHOTS").is_some();
    let mut examples: Vec<PathBuf> = std::fs::read_dir(repo().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path().join("deployment.yaml"))
        .filter(|p| p.exists())
        .collect();
    examples.sort();
    assert!(examples.len() >= 8, "examples: {examples:?}");
    let mut stale = Vec::new();
    for path in &examples {
        let folder = path
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let (deps, topos) = load(path);
        let mut out = format!(
            "# Rendered by the operator from examples/{folder}/deployment.yaml (namespace infera), models in place\n# (after any download); regenerate with INFERA_UPDATE_SNAPSHOTS=1 cargo test -p infera-operator snapshot.\n"
        );
        for dep in &deps {
            for child in render_example(dep, &topos, true).children {
                out.push_str("---\n");
                out.push_str(&serde_saphyr::to_string(&child.object).unwrap());
            }
        }
        let snapshot = repo()
            .join("operator/snapshots")
            .join(format!("{folder}.yaml"));
        if update {
            std::fs::create_dir_all(snapshot.parent().unwrap()).unwrap();
            std::fs::write(&snapshot, &out).unwrap();
        } else if std::fs::read_to_string(&snapshot).ok().as_deref() != Some(out.as_str()) {
            stale.push(snapshot.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "snapshots differ from the rendered objects (review, then INFERA_UPDATE_SNAPSHOTS=1): {stale:?}"
    );
}

#[test]
fn every_child_is_labelled_and_owned_by_its_deployment() {
    for folder in [
        "sim",
        "vllm-2p1d-mooncake",
        "vllm-mixed-fp8-mi355x",
        "multi-node-worker",
    ] {
        let (deps, topos) = load(&repo().join("examples").join(folder).join("deployment.yaml"));
        for dep in &deps {
            let name = dep.metadata.name.clone().unwrap();
            for child in render_example(dep, &topos, true).children {
                let meta = &child.object["metadata"];
                assert_eq!(meta["namespace"], "infera");
                assert_eq!(
                    meta["labels"]["infera.amd.com/deployment"],
                    name.as_str(),
                    "{} {}",
                    folder,
                    child.name
                );
                assert_eq!(
                    meta["labels"]["app.kubernetes.io/managed-by"],
                    "infera-operator"
                );
                let owners = meta["ownerReferences"].as_array();
                if child.kind == Kind::PersistentVolumeClaim {
                    assert!(owners.is_none(), "the model cache outlives the deployment");
                    continue;
                }
                let owner = &owners.unwrap_or_else(|| panic!("{} has no owner", child.name))[0];
                assert_eq!(owner["kind"], "InferaDeployment");
                assert_eq!(owner["uid"], format!("uid-{name}").as_str());
                assert_eq!(owner["controller"], true);
                assert_eq!(owner["blockOwnerDeletion"], true);
            }
        }
    }
}

#[test]
fn an_mi355x_engine_pod_gets_gpus_rdma_roce_env_shm_probes_and_the_drain() {
    let (deps, topos) = load(&repo().join("examples/sglang-1p1d-mori/deployment.yaml"));
    let r = render_example(&deps[0], &topos, true);
    let sts = find(&r, Kind::StatefulSet, "deepseek-r1-prefill");
    let pod = &sts["spec"]["template"];
    let engine = container(pod, "containers", "engine");
    let limits = &engine["resources"]["limits"];
    assert_eq!(limits["amd.com/gpu"], "8");
    assert_eq!(limits["rdma/hca"], "8");
    assert_eq!(
        engine["resources"]["requests"]["rdma/hca"], "8",
        "extended resources: requests equal limits"
    );
    // No gidIndex: the GID variables come from the node, found by the init container
    // and sourced by the engine container before SGLang starts.
    for name in ["MC_GID_INDEX", "NCCL_IB_GID_INDEX", "MORI_IB_GID_INDEX"] {
        assert_eq!(env_value(engine, name), None, "{name}");
    }
    let node_env = container(pod, "initContainers", "node-env");
    assert_eq!(
        args(node_env, "args"),
        [
            "node-env",
            "--engine",
            "sglang",
            "--rdma",
            "--out",
            "/run/infera/engine-env.sh"
        ]
    );
    assert!(
        node_env.get("restartPolicy").is_none(),
        "runs to completion first"
    );
    assert_eq!(
        engine["securityContext"]["capabilities"]["add"],
        json!(["IPC_LOCK"])
    );
    assert_eq!(
        env_value(engine, "NCCL_IB_HCA").as_deref(),
        Some("ionic_0,ionic_1,ionic_2,ionic_3,ionic_4,ionic_5,ionic_6,ionic_7")
    );
    let full = args(engine, "command");
    assert_eq!(
        &full[..4],
        [
            "/bin/sh",
            "-c",
            ". /run/infera/engine-env.sh && exec \"$@\"",
            "infera-engine"
        ]
    );
    let cmd = full[4..].to_vec();
    assert_eq!(&cmd[..3], ["python3", "-m", "sglang.launch_server"]);
    assert_eq!(
        flag(&cmd, "--disaggregation-ib-device").as_deref(),
        Some("ionic_0,ionic_1,ionic_2,ionic_3,ionic_4,ionic_5,ionic_6,ionic_7")
    );
    assert_eq!(
        flag(&cmd, "--model-path").as_deref(),
        Some("/model-store/deepseek-ai/DeepSeek-R1")
    );
    assert_eq!(
        flag(&cmd, "--disaggregation-mode").as_deref(),
        Some("prefill")
    );
    assert_eq!(
        flag(&cmd, "--disaggregation-transfer-backend").as_deref(),
        Some("mori")
    );
    assert_eq!(flag(&cmd, "--tp-size").as_deref(), Some("8"));
    assert_eq!(flag(&cmd, "--kv-cache-dtype").as_deref(), Some("fp8_e4m3"));
    assert!(
        cmd.contains(&"--kv-events-config".to_owned()),
        "kv-aware routing: KV events on"
    );
    let user = cmd.iter().position(|a| a == "--trust-remote-code").unwrap();
    assert!(
        user > cmd
            .iter()
            .position(|a| a == "--disaggregation-mode")
            .unwrap(),
        "the user's args come after the rendered ones"
    );
    // Startup budget 3600 s at one check every 10 s.
    assert_eq!(engine["startupProbe"]["failureThreshold"], 360);
    assert_eq!(engine["startupProbe"]["httpGet"]["path"], "/health");
    assert_eq!(engine["readinessProbe"]["httpGet"]["path"], "/health");
    // The kubelet calls /drain from the node: it presents the token the sidecar holds,
    // which differs between deployments.
    let sidecar = container(pod, "initContainers", "sidecar");
    let token = env_value(sidecar, "INFERA_DRAIN_TOKEN").unwrap();
    assert_eq!(token.len(), 32);
    assert_ne!(token, super::pod::drain_token("another-uid"));
    assert_eq!(
        engine["lifecycle"]["preStop"]["httpGet"],
        json!({"path": "/drain", "port": 8090,
               "httpHeaders": [{"name": "x-infera-drain-token", "value": token}]})
    );
    // The default 60 s drain: max(120, 60 + 65).
    assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 125);
    let shm = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "dshm")
        .unwrap();
    assert_eq!(
        shm["emptyDir"],
        json!({"medium": "Memory", "sizeLimit": "64Gi"})
    );
    let names: Vec<&str> = engine["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        &names[..4],
        ["POD_NAME", "POD_NAMESPACE", "POD_IP", "NODE_NAME"]
    );
    let sidecar = container(pod, "initContainers", "sidecar");
    assert_eq!(sidecar["restartPolicy"], "Always", "a native sidecar");
    let sargs = args(sidecar, "args");
    assert_eq!(&sargs[..2], ["sglang", "--attach"]);
    assert_eq!(
        flag(&sargs, "--advertise-host").as_deref(),
        Some("$(POD_IP)")
    );
    assert_eq!(
        flag(&sargs, "--discovery-backend").as_deref(),
        Some("kubernetes")
    );
    assert_eq!(
        flag(&sargs, "--disaggregation-mode").as_deref(),
        Some("prefill"),
        "the sidecar reads the engine's flags"
    );
    assert!(
        !sargs.contains(&"--disaggregation-allow-tcp".to_owned()),
        "RDMA is on"
    );
    // PDB, headless service, and pods the operator replaces itself (plan::rollout).
    assert_eq!(
        find(&r, Kind::PodDisruptionBudget, "deepseek-r1-prefill")["spec"]["maxUnavailable"],
        1
    );
    assert_eq!(
        find(&r, Kind::Service, "deepseek-r1-prefill")["spec"]["clusterIP"],
        "None"
    );
    assert_eq!(sts["spec"]["updateStrategy"]["type"], "OnDelete");
    assert_eq!(sts["spec"]["replicas"], 2, "replicas 2 of a 1P1D topology");
}

#[test]
fn topology_units_scale_with_replicas_and_keep_the_ratio() {
    let (mut deps, topos) = load(&repo().join("examples/vllm-2p1d-mooncake/deployment.yaml"));
    let r = render_example(&deps[0], &topos, true);
    assert_eq!(
        find(&r, Kind::StatefulSet, "qwen3-235b-prefill")["spec"]["replicas"],
        2
    );
    assert_eq!(
        find(&r, Kind::StatefulSet, "qwen3-235b-decode")["spec"]["replicas"],
        1
    );
    deps[0].spec.replicas = 3;
    let r = render_example(&deps[0], &topos, true);
    assert_eq!(
        find(&r, Kind::StatefulSet, "qwen3-235b-prefill")["spec"]["replicas"],
        6
    );
    assert_eq!(
        find(&r, Kind::StatefulSet, "qwen3-235b-decode")["spec"]["replicas"],
        3
    );
    assert_eq!(r.unit, vec![(Role::Prefill, 2), (Role::Decode, 1)]);
    let pod = &find(&r, Kind::StatefulSet, "qwen3-235b-decode")["spec"]["template"];
    let cmd = args(container(pod, "containers", "engine"), "command");
    let config: Value = serde_json::from_str(&flag(&cmd, "--kv-transfer-config").unwrap()).unwrap();
    assert_eq!(config["kv_connector"], "MooncakeConnector");
    assert_eq!(config["kv_role"], "kv_consumer");
    assert_eq!(config["engine_id"], "$(POD_NAME)");
    assert_eq!(
        flag(&cmd, "--tensor-parallel-size").as_deref(),
        Some("8"),
        "the decode role's parallelism"
    );
    assert!(cmd.contains(&"--enable-expert-parallel".to_owned()));
}

#[test]
fn a_hugging_face_model_is_downloaded_before_workers_start() {
    let (deps, topos) = load(&repo().join("examples/vllm-mixed-fp8-mi355x/deployment.yaml"));
    let waiting = render_example(&deps[0], &topos, false);
    assert_eq!(
        waiting.download_job.as_deref(),
        Some("llama-70b-model-download")
    );
    assert_eq!(
        find(&waiting, Kind::StatefulSet, "llama-70b-mixed")["spec"]["replicas"],
        0
    );
    assert_eq!(waiting.roles[0].desired, 4);
    let job = find(&waiting, Kind::Job, "llama-70b-model-download");
    let c = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        c["image"], "vllm/vllm-openai-rocm:v0.25.1",
        "the vendor image carries huggingface_hub"
    );
    assert_eq!(
        env_value(c, "HF_MODEL_ID").as_deref(),
        Some("amd/Llama-3.1-70B-Instruct-FP8-KV")
    );
    let token = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "HF_TOKEN")
        .unwrap();
    assert_eq!(
        token["valueFrom"]["secretKeyRef"],
        json!({"name": "hf-token", "key": "token", "optional": false})
    );
    let pvc = find(
        &waiting,
        Kind::PersistentVolumeClaim,
        "llama-70b-model-cache",
    );
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "300Gi");
    let ready = render_example(&deps[0], &topos, true);
    assert_eq!(
        find(&ready, Kind::StatefulSet, "llama-70b-mixed")["spec"]["replicas"],
        4
    );
    let gw = find(&ready, Kind::Deployment, "llama-70b-gateway");
    let gargs = args(&gw["spec"]["template"]["spec"]["containers"][0], "args");
    assert_eq!(flag(&gargs, "--router-policy").as_deref(), Some("kv-aware"));
    assert_eq!(flag(&gargs, "--kv-overlap-weight").as_deref(), Some("4"));
    // The tokenizer comes from the workers' sidecars: the gateway mounts no model.
    assert_eq!(
        flag(&gargs, "--router-tokenizer-from-workers").as_deref(),
        Some("8090")
    );
    assert_eq!(flag(&gargs, "--router-tokenizer-path"), None);
    assert!(
        !gw["spec"]["template"].to_string().contains("model-store"),
        "{}",
        gw["spec"]["template"]
    );
    // A tokenizer folder the engine does not load is read from the model volume.
    let mut own = deps[0].clone();
    own.spec.gateway.tokenizer = Some("tokenizer-v2".into());
    let r = render_example(&own, &topos, true);
    let gw = find(&r, Kind::Deployment, "llama-70b-gateway");
    let gargs = args(&gw["spec"]["template"]["spec"]["containers"][0], "args");
    assert_eq!(
        flag(&gargs, "--router-tokenizer-path").as_deref(),
        Some("/model-store/amd/Llama-3.1-70B-Instruct-FP8-KV/tokenizer-v2")
    );
    assert_eq!(flag(&gargs, "--router-tokenizer-from-workers"), None);
    assert!(!r.tokenizer_from_workers);
    assert!(
        gw["spec"]["template"]
            .to_string()
            .contains("\"mountPath\":\"/model-store\"")
    );
    assert_eq!(
        flag(&gargs, "--k8s-label-selector").as_deref(),
        Some("infera.amd.com/deployment=llama-70b,app.kubernetes.io/component=engine")
    );
    assert_eq!(
        find(&ready, Kind::Service, "llama-70b-gateway")["spec"]["type"],
        "LoadBalancer"
    );
    assert_eq!(
        ready.gateway_endpoint,
        "http://llama-70b-gateway.infera:8000"
    );
    // Least privilege: sidecars patch (their own Pod's annotation), gateways read.
    for (account, verbs) in [
        ("llama-70b-infera", json!(["patch"])),
        ("llama-70b-gateway", json!(["get", "list", "watch"])),
    ] {
        assert_eq!(
            find(&ready, Kind::Role, account)["rules"][0]["verbs"],
            verbs
        );
        let binding = find(&ready, Kind::RoleBinding, account);
        assert_eq!(binding["subjects"][0]["name"], account);
        find(&ready, Kind::ServiceAccount, account);
    }
    let gw_pod = &gw["spec"]["template"]["spec"];
    assert_eq!(gw_pod["serviceAccountName"], "llama-70b-gateway");
    assert_eq!(gw_pod["automountServiceAccountToken"], true);
    // In engine pods only the sidecar holds a token; the engine (a vendor image, root)
    // has none.
    let engine_pod = &find(&ready, Kind::StatefulSet, "llama-70b-mixed")["spec"]["template"];
    assert_eq!(engine_pod["spec"]["automountServiceAccountToken"], false);
    let token_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let mounts_token = |c: &Value| {
        c["volumeMounts"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["mountPath"] == token_dir))
    };
    assert!(mounts_token(container(
        engine_pod,
        "initContainers",
        "sidecar"
    )));
    assert!(!mounts_token(container(engine_pod, "containers", "engine")));
    let token_volume = engine_pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "sidecar-token")
        .unwrap();
    assert_eq!(
        token_volume["projected"]["sources"][0]["serviceAccountToken"]["path"],
        "token"
    );
}

#[test]
fn a_worker_spanning_nodes_is_a_leader_worker_set() {
    let (deps, topos) = load(&repo().join("examples/multi-node-worker/deployment.yaml"));
    let r = render_example(&deps[0], &topos, true);
    assert!(r.children.iter().all(|c| c.kind != Kind::StatefulSet));
    let lws = find(&r, Kind::LeaderWorkerSet, "r1-two-node-mixed");
    assert_eq!(lws["apiVersion"], "leaderworkerset.x-k8s.io/v1");
    assert_eq!(lws["spec"]["leaderWorkerTemplate"]["size"], 2);
    let leader = &lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"];
    let worker = &lws["spec"]["leaderWorkerTemplate"]["workerTemplate"];
    assert!(
        leader["spec"]["initContainers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "sidecar")
    );
    let worker_init: Vec<&str> = worker["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        worker_init,
        ["node-env"],
        "followers do not register, but read their node"
    );
    let cmd = args(container(leader, "containers", "engine"), "command");
    assert_eq!(flag(&cmd, "--nnodes").as_deref(), Some("2"));
    assert_eq!(
        flag(&cmd, "--dist-init-addr").as_deref(),
        Some("$(LWS_LEADER_ADDRESS):20000")
    );
    // TP 16 over 2 nodes: 8 GPUs per pod.
    assert_eq!(
        container(worker, "containers", "engine")["resources"]["limits"]["amd.com/gpu"],
        "8"
    );
}

#[test]
fn simulated_engines_run_the_simulator_without_gpus() {
    let (deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    let pd = deps
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some("sim-pd"))
        .unwrap();
    let r = render_example(pd, &topos, true);
    let pod = &find(&r, Kind::StatefulSet, "sim-pd-decode")["spec"]["template"];
    let engine = container(pod, "containers", "engine");
    assert_eq!(engine["image"], "registry.example/infera/infera-sim:test");
    let cmd = args(engine, "command");
    assert_eq!(cmd[0], "infera-sim");
    assert_eq!(flag(&cmd, "--engine").as_deref(), Some("vllm"));
    let config: Value = serde_json::from_str(&flag(&cmd, "--kv-transfer-config").unwrap()).unwrap();
    assert_eq!(config["kv_connector"], "MoRIIOConnector");
    assert_eq!(config["kv_connector_extra_config"]["read_mode"], true);
    assert_eq!(
        env_value(engine, "VLLM_MORIIO_CONNECTOR_READ_MODE").as_deref(),
        Some("1")
    );
    assert!(
        engine["resources"].get("limits").is_none(),
        "no GPUs or RDMA devices"
    );
    let sidecar = container(pod, "initContainers", "sidecar");
    assert_eq!(
        sidecar["image"],
        "registry.example/infera/infera-engine-sidecar:test"
    );
    let sargs = args(sidecar, "args");
    assert_eq!(sargs[0], "sim");
    assert!(
        sargs.contains(&"--disaggregation-allow-tcp".to_owned()),
        "no RDMA: TCP is expected"
    );
    assert_eq!(
        env_value(sidecar, "VLLM_MORIIO_CONNECTOR_READ_MODE").as_deref(),
        Some("1"),
        "the sidecar detects read mode from its env"
    );
}

#[test]
fn a_gateway_with_keys_and_tls_mounts_both_secrets_and_probes_https() {
    let (mut deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    let dep = &mut deps[0];
    let name = dep.metadata.name.clone().unwrap();
    dep.spec.gateway.api_keys_secret_ref = Some(crate::api::SecretKeyRef {
        name: "clients".into(),
        key: "keys.txt".into(),
    });
    dep.spec.gateway.metrics_require_auth = true;
    dep.spec.gateway.tls = Some(crate::api::GatewayTls {
        secret_name: "gateway-cert".into(),
    });
    let r = render_example(dep, &topos, true);
    let deployment = find(&r, Kind::Deployment, &format!("{name}-gateway"));
    let pod = &deployment["spec"]["template"];
    let gateway = container(pod, "containers", "gateway");
    let gargs = args(gateway, "args");
    let keys_file = flag(&gargs, "--api-keys-file").unwrap();
    let (cert, key) = (
        flag(&gargs, "--tls-cert-file").unwrap(),
        flag(&gargs, "--tls-key-file").unwrap(),
    );
    assert!(gargs.contains(&"--metrics-require-auth".to_owned()));
    // Each file lies in a whole-Secret mount (no subPath, so updates reach it).
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    for (file, secret, item) in [
        (&keys_file, "clients", Some("keys.txt")),
        (&cert, "gateway-cert", None),
        (&key, "gateway-cert", None),
    ] {
        let mount = gateway["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| file.starts_with(m["mountPath"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{file} is not mounted"));
        assert!(mount.get("subPath").is_none() && mount["readOnly"] == true);
        let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
        assert_eq!(volume["secret"]["secretName"], secret);
        if let Some(item) = item {
            assert_eq!(volume["secret"]["items"][0]["key"], item);
            assert!(file.ends_with(volume["secret"]["items"][0]["path"].as_str().unwrap()));
        }
    }
    assert!(cert.ends_with("/tls.crt") && key.ends_with("/tls.key"));
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(gateway[probe]["httpGet"]["scheme"], "HTTPS", "{probe}");
    }
    let service = find(&r, Kind::Service, &format!("{name}-gateway"));
    assert_eq!(service["spec"]["ports"][0]["appProtocol"], "https");
    // The chart's plain ServiceMonitor skips it; the secured one finds it.
    assert_eq!(
        service["metadata"]["labels"]["infera.amd.com/metrics-access"],
        "tls-auth"
    );
    // Without them: plain HTTP, no auth, nothing mounted for them.
    let (plain, _) = load(&repo().join("examples/sim/deployment.yaml"));
    let r = render_example(&plain[0], &topos, true);
    let pod = &find(&r, Kind::Deployment, &format!("{name}-gateway"))["spec"]["template"];
    let gateway = container(pod, "containers", "gateway");
    let gargs = args(gateway, "args");
    for f in [
        "--api-keys-file",
        "--tls-cert-file",
        "--metrics-require-auth",
    ] {
        assert!(!gargs.iter().any(|a| a == f), "{f}");
    }
    assert!(gateway["readinessProbe"]["httpGet"].get("scheme").is_none());
    let service = find(&r, Kind::Service, &format!("{name}-gateway"));
    assert!(
        service["metadata"]["labels"]
            .get("infera.amd.com/metrics-access")
            .is_none()
    );
}

#[test]
fn etcd_tls_and_auth_reach_the_gateway_and_every_sidecar() {
    let (mut deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    let dep = &mut deps[0];
    let name = dep.metadata.name.clone().unwrap();
    dep.spec.discovery.backend = crate::api::DiscoveryBackend::Etcd;
    dep.spec.discovery.etcd = Some(crate::api::EtcdSpec {
        endpoints: vec!["https://etcd-0:2379".into(), "https://etcd-1:2379".into()],
        prefix: "/infera/workers/".into(),
        tls_secret_name: Some("etcd-client".into()),
        user: Some("infera".into()),
        password_secret_ref: Some(crate::api::SecretKeyRef {
            name: "etcd-password".into(),
            key: "pw".into(),
        }),
    });
    let r = render_example(dep, &topos, true);
    let gateway_pod = &find(&r, Kind::Deployment, &format!("{name}-gateway"))["spec"]["template"];
    let engine_pod = &find(&r, Kind::StatefulSet, &format!("{name}-mixed"))["spec"]["template"];
    for (pod, c, list, key) in [
        (
            gateway_pod,
            container(gateway_pod, "containers", "gateway"),
            "containers",
            "args",
        ),
        (
            engine_pod,
            container(engine_pod, "initContainers", "sidecar"),
            "initContainers",
            "args",
        ),
    ] {
        let a = args(c, key);
        assert_eq!(
            flag(&a, "--etcd-endpoint").as_deref(),
            Some("https://etcd-0:2379,https://etcd-1:2379"),
            "{list}"
        );
        assert_eq!(flag(&a, "--etcd-user").as_deref(), Some("infera"));
        let volumes = pod["spec"]["volumes"].as_array().unwrap();
        for (flag_name, secret, key) in [
            ("--etcd-ca-file", "etcd-client", None),
            ("--etcd-cert-file", "etcd-client", None),
            ("--etcd-key-file", "etcd-client", None),
            ("--etcd-password-file", "etcd-password", Some("pw")),
        ] {
            let file = flag(&a, flag_name).unwrap_or_else(|| panic!("{list}: no {flag_name}"));
            let mount = c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| file.starts_with(m["mountPath"].as_str().unwrap()))
                .unwrap_or_else(|| panic!("{list}: {file} is not mounted"));
            let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
            assert_eq!(volume["secret"]["secretName"], secret);
            if let Some(key) = key {
                assert_eq!(volume["secret"]["items"][0]["key"], key);
            }
        }
    }
    // The engine container itself sees none of it.
    let engine = container(engine_pod, "containers", "engine");
    assert!(
        engine["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| !m["mountPath"].as_str().unwrap().contains("etcd"))
    );
}

#[test]
fn only_the_deployments_own_pods_and_named_peers_reach_its_engines() {
    let (mut deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    let dep = &mut deps[0];
    let name = dep.metadata.name.clone().unwrap();
    let r = render_example(dep, &topos, true);
    let policy = find(&r, Kind::NetworkPolicy, &format!("{name}-engines"));
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        json!({"infera.amd.com/deployment": name, "app.kubernetes.io/component": "engine"})
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        policy["spec"]["ingress"],
        json!([{"from": [{"podSelector": {"matchLabels": {"infera.amd.com/deployment": name}}}]}])
    );
    // Applied before the engines start.
    let position = |kind| r.children.iter().position(|c| c.kind == kind).unwrap();
    assert!(position(Kind::NetworkPolicy) < position(Kind::StatefulSet));
    // A scraper's namespace added; or the policy off.
    let peer: k8s_openapi::api::networking::v1::NetworkPolicyPeer = serde_json::from_value(
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}),
    )
    .unwrap();
    dep.spec.network.network_policy.allow_from = vec![peer];
    let r = render_example(dep, &topos, true);
    let policy = find(&r, Kind::NetworkPolicy, &format!("{name}-engines"));
    assert_eq!(
        policy["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring"
    );
    dep.spec.network.network_policy.enabled = false;
    let r = render_example(dep, &topos, true);
    assert!(r.children.iter().all(|c| c.kind != Kind::NetworkPolicy));
}

#[test]
fn kvd_joins_the_pod_with_a_shared_socket_when_on() {
    let (mut deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    let dep = &mut deps[0];
    dep.spec.kv_cache.enabled = true;
    dep.spec.kv_cache.nvme = Some(crate::api::NvmeTier {
        path: "/mnt/nvme/kv".into(),
        size: k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Ti".into()),
    });
    let r = render_example(dep, &topos, true);
    let pod = &find(&r, Kind::StatefulSet, "sim-mixed-mixed")["spec"]["template"];
    let kvd = container(pod, "initContainers", "kvd");
    assert_eq!(kvd["restartPolicy"], "Always");
    let kargs = args(kvd, "args");
    assert_eq!(
        flag(&kargs, "--socket").as_deref(),
        Some("/run/infera-kvd/kvd.sock")
    );
    assert_eq!(
        flag(&kargs, "--max-bytes").as_deref(),
        Some("68719476736"),
        "64Gi"
    );
    assert_eq!(
        flag(&kargs, "--shared-arena-bytes").as_deref(),
        Some("68719476736")
    );
    assert_eq!(
        flag(&kargs, "--long-path").as_deref(),
        Some("/var/lib/infera-kvd")
    );
    assert_eq!(
        flag(&kargs, "--long-bytes").as_deref(),
        Some("1099511627776"),
        "1Ti"
    );
    assert_eq!(
        (
            &kvd["securityContext"]["runAsUser"],
            &kvd["securityContext"]["runAsNonRoot"],
            &kvd["securityContext"]["capabilities"]["drop"][0],
        ),
        (&json!(0), &json!(false), &json!("ALL")),
        "root without capabilities, to own its files in the root-owned hostPath"
    );
    assert!(kvd.get("env").is_none() || kvd["env"].is_null());

    dep.spec.kv_cache.remote_url_secret_ref = Some(crate::api::SecretKeyRef {
        name: "kv-store".into(),
        key: "url".into(),
    });
    let r = render_example(dep, &topos, true);
    let pod = &find(&r, Kind::StatefulSet, "sim-mixed-mixed")["spec"]["template"];
    let kvd = container(pod, "initContainers", "kvd");
    assert_eq!(
        kvd["env"],
        json!([{"name": "INFERA_KVD_REMOTE_URL", "valueFrom": {"secretKeyRef": {"name": "kv-store", "key": "url", "optional": false}}}]),
        "the URL stays in its Secret"
    );
    assert_eq!(flag(&args(kvd, "args"), "--remote-url"), None);
    let engine = container(pod, "containers", "engine");
    assert_eq!(
        env_value(engine, "INFERA_KVD_SOCKET").as_deref(),
        Some("/run/infera-kvd/kvd.sock")
    );
    let mounts_kvd = |c: &Value| {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "kvd-socket")
    };
    assert!(mounts_kvd(engine));
    // Prewarm hints: the gateway forwards them to each sidecar, which reaches its kvd.
    let sidecar = container(pod, "initContainers", "sidecar");
    assert_eq!(
        flag(&args(sidecar, "args"), "--kvd-socket").as_deref(),
        Some("/run/infera-kvd/kvd.sock")
    );
    assert!(mounts_kvd(sidecar));
    let gateway = find(&r, Kind::Deployment, "sim-mixed-gateway");
    let gateway = container(&gateway["spec"]["template"], "containers", "gateway");
    assert_eq!(
        flag(&args(gateway, "args"), "--worker-sidecar-port").as_deref(),
        Some("8090")
    );
    assert_eq!(
        env_value(gateway, "INFERA_DRAIN_TOKEN"),
        env_value(sidecar, "INFERA_DRAIN_TOKEN"),
        "the sidecars take the gateway's hints as they take a preStop's /drain"
    );
}

#[test]
fn the_scaling_api_adds_exactly_one_role_over_the_deployment_itself() {
    let (mut deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    for dep in deps.iter_mut() {
        // With etcd discovery the gateways' account holds nothing else.
        dep.spec.discovery.backend = crate::api::DiscoveryBackend::Etcd;
        dep.spec.discovery.etcd = Some(crate::api::EtcdSpec {
            endpoints: vec!["http://etcd-0:2379".into()],
            prefix: "/infera/workers/".into(),
            tls_secret_name: None,
            user: None,
            password_secret_ref: None,
        });
    }
    let kinds = |r: &Rendered| -> Vec<String> {
        r.children
            .iter()
            .filter(|c| matches!(c.kind, Kind::Role | Kind::RoleBinding))
            .map(|c| c.name.clone())
            .collect()
    };
    let off = render_example(&deps[0], &topos, true);
    assert!(kinds(&off).is_empty(), "etcd discovery: no Role at all");
    let gateway = find(&off, Kind::Deployment, "sim-mixed-gateway");
    assert_eq!(
        gateway["spec"]["template"]["spec"]["automountServiceAccountToken"],
        false
    );
    assert!(
        !args(
            container(&gateway["spec"]["template"], "containers", "gateway"),
            "args"
        )
        .contains(&"--enable-scaling-api".to_owned())
    );

    for dep in deps.iter_mut() {
        dep.spec.gateway.scaling_api = true;
    }
    let mixed = render_example(&deps[0], &topos, true);
    assert_eq!(
        kinds(&mixed),
        ["sim-mixed-gateway-scaling", "sim-mixed-gateway-scaling"]
    );
    let role = find(&mixed, Kind::Role, "sim-mixed-gateway-scaling");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["infera.amd.com"], "resources": ["inferadeployments"],
                "resourceNames": ["sim-mixed"], "verbs": ["get", "patch"]}])
    );
    let binding = find(&mixed, Kind::RoleBinding, "sim-mixed-gateway-scaling");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "sim-mixed-gateway", "namespace": "infera"}])
    );
    let pod = &find(&mixed, Kind::Deployment, "sim-mixed-gateway")["spec"]["template"];
    assert_eq!(pod["spec"]["automountServiceAccountToken"], true);
    let gargs = args(container(pod, "containers", "gateway"), "args");
    assert!(gargs.contains(&"--enable-scaling-api".to_owned()));
    assert_eq!(flag(&gargs, "--deployment").as_deref(), Some("sim-mixed"));

    // Disaggregated: its PDTopology is read too, for the unit of workers.
    let pd = render_example(&deps[1], &topos, true);
    let role = find(&pd, Kind::Role, "sim-pd-gateway-scaling");
    assert_eq!(
        role["rules"][1],
        json!({"apiGroups": ["infera.amd.com"], "resources": ["pdtopologies"],
               "resourceNames": ["sim-1p1d"], "verbs": ["get"]})
    );
}

#[test]
fn what_cannot_work_is_a_reason_not_a_panic() {
    let (deps, topos) = load(&repo().join("examples/sglang-1p1d-mori/deployment.yaml"));
    let none = render(
        &deps[0],
        Observed {
            topology: None,
            model_ready: true,
            ..Default::default()
        },
        &Platform::with_images(images()),
    )
    .unwrap_err();
    assert_eq!(none.reason(), "TopologyNotFound");
    let mut atom = deps[0].clone();
    atom.spec.engine.kind = crate::api::EngineKind::Atom;
    let e = render(
        &atom,
        Observed {
            topology: topos.first(),
            model_ready: true,
            ..Default::default()
        },
        &Platform::with_images(images()),
    )
    .unwrap_err();
    assert_eq!(e.reason(), "UnsupportedTransport");
    assert!(e.to_string().contains("mooncake"), "{e}");
    let mut long = deps[0].clone();
    long.metadata.name = Some("x".repeat(41));
    assert_eq!(
        render(
            &long,
            Observed {
                topology: topos.first(),
                model_ready: true,
                ..Default::default()
            },
            &Platform::with_images(images())
        )
        .unwrap_err()
        .reason(),
        "NameTooLong"
    );
}

#[test]
fn etcd_and_nats_without_endpoints_use_the_cluster_ones_or_say_what_is_missing() {
    let (mut deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    let dep = &mut deps[0];
    dep.spec.discovery.backend = crate::api::DiscoveryBackend::Etcd;
    dep.spec.messaging.backend = crate::api::MessagingBackend::Nats;
    let bare = Platform::with_images(images());
    let e = render(
        dep,
        Observed {
            topology: None,
            model_ready: true,
            ..Default::default()
        },
        &bare,
    )
    .unwrap_err();
    assert_eq!(e.reason(), "EtcdEndpointsMissing");
    assert!(e.to_string().contains("etcd.enabled=true"), "{e}");
    let platform = Platform {
        etcd_endpoints: vec![
            "http://infera-etcd-0.infera-etcd-peers.infera-system.svc:2379".into(),
        ],
        ..bare.clone()
    };
    let e = render(
        dep,
        Observed {
            topology: None,
            model_ready: true,
            ..Default::default()
        },
        &platform,
    )
    .unwrap_err();
    assert_eq!(e.reason(), "NatsUrlMissing");
    let platform = Platform {
        nats_url: Some("nats://infera-nats.infera-system.svc:4222".into()),
        ..platform
    };
    let r = render(
        dep,
        Observed {
            topology: topos.first(),
            model_ready: true,
            ..Default::default()
        },
        &platform,
    )
    .unwrap();
    let gw = find(&r, Kind::Deployment, "sim-mixed-gateway");
    let gargs = args(&gw["spec"]["template"]["spec"]["containers"][0], "args");
    assert_eq!(
        flag(&gargs, "--etcd-endpoint").as_deref(),
        Some("http://infera-etcd-0.infera-etcd-peers.infera-system.svc:2379")
    );
    assert_eq!(
        flag(&gargs, "--nats-server").as_deref(),
        Some("nats://infera-nats.infera-system.svc:4222")
    );
    let pod = &find(&r, Kind::StatefulSet, "sim-mixed-mixed")["spec"]["template"];
    let sargs = args(container(pod, "initContainers", "sidecar"), "args");
    assert_eq!(
        flag(&sargs, "--kv-event-transport").as_deref(),
        Some("nats")
    );
    assert!(
        r.children.iter().all(|c| c.kind != Kind::Role),
        "no Pod RBAC without Kubernetes discovery"
    );
}

#[test]
fn the_nats_request_plane_and_migration_reach_gateways_and_sidecars() {
    let (mut deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    let dep = &mut deps[0];
    dep.spec.discovery.backend = crate::api::DiscoveryBackend::Etcd;
    dep.spec.messaging = crate::api::MessagingSpec {
        backend: crate::api::MessagingBackend::Nats,
        nats_url: Some("nats://bus:4222".into()),
        request_transport: Some(crate::api::RequestTransport::Nats),
        request_idle_timeout_seconds: Some(120.0),
        request_max_duration_seconds: None,
        request_max_pending: Some(8),
    };
    dep.spec.gateway.migration_limit = 2;
    let platform = Platform {
        etcd_endpoints: vec!["http://etcd:2379".into()],
        ..Platform::with_images(images())
    };
    let observed = Observed {
        topology: topos.first(),
        model_ready: true,
        ..Default::default()
    };
    let r = render(dep, observed, &platform).unwrap();
    let gw = find(&r, Kind::Deployment, "sim-mixed-gateway");
    let gargs = args(&gw["spec"]["template"]["spec"]["containers"][0], "args");
    let pod = &find(&r, Kind::StatefulSet, "sim-mixed-mixed")["spec"]["template"];
    let sargs = args(container(pod, "initContainers", "sidecar"), "args");
    for a in [&gargs, &sargs] {
        assert_eq!(flag(a, "--request-transport").as_deref(), Some("nats"));
        assert_eq!(flag(a, "--nats-req-idle-timeout").as_deref(), Some("120"));
        assert_eq!(flag(a, "--nats-req-max-pending").as_deref(), Some("8"));
        assert_eq!(flag(a, "--nats-req-max-duration"), None);
        assert_eq!(flag(a, "--nats-server").as_deref(), Some("nats://bus:4222"));
    }
    assert_eq!(flag(&gargs, "--migration-limit").as_deref(), Some("2"));
    // Over HTTP (the default) nothing of it is rendered.
    dep.spec.messaging.request_transport = None;
    dep.spec.gateway.migration_limit = 0;
    let r = render(dep, observed, &platform).unwrap();
    let gw = find(&r, Kind::Deployment, "sim-mixed-gateway");
    let gargs = args(&gw["spec"]["template"]["spec"]["containers"][0], "args");
    assert_eq!(flag(&gargs, "--request-transport"), None);
    assert_eq!(flag(&gargs, "--migration-limit"), None);
}

#[test]
fn a_cluster_etcd_with_tls_is_reached_with_a_copy_of_its_client_certificate() {
    let (mut deps, _) = load(&repo().join("examples/sim/deployment.yaml"));
    let dep = &mut deps[0];
    dep.spec.discovery.backend = crate::api::DiscoveryBackend::Etcd;
    let platform = Platform {
        etcd_endpoints: vec!["https://infera-etcd.infera-system.svc:2379".into()],
        etcd_client_secret: Some(("infera-system".into(), "infera-etcd-client-tls".into())),
        ..Platform::with_images(images())
    };
    let observed = Observed {
        model_ready: true,
        ..Default::default()
    };
    let e = render(dep, observed, &platform).unwrap_err();
    assert_eq!(e.reason(), "EtcdClientCertificateMissing");
    assert!(
        e.to_string()
            .contains("infera-system/infera-etcd-client-tls"),
        "{e}"
    );

    let data: EtcdClientTls = ["ca.crt", "tls.crt", "tls.key", "ca.key"]
        .into_iter()
        .map(|k| (k.to_owned(), k8s_openapi::ByteString(k.as_bytes().to_vec())))
        .collect();
    let r = render(
        dep,
        Observed {
            etcd_client_tls: Some(&data),
            ..observed
        },
        &platform,
    )
    .unwrap();
    let copy = find(&r, Kind::Secret, "sim-mixed-etcd-client");
    assert_eq!(
        copy["metadata"]["namespace"],
        dep.metadata.namespace.clone().unwrap()
    );
    assert_eq!(copy["metadata"]["ownerReferences"][0]["name"], "sim-mixed");
    let keys: Vec<&str> = copy["data"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        ["ca.crt", "tls.crt", "tls.key"],
        "the CA's key is not copied"
    );
    assert_eq!(
        r.children[0].kind,
        Kind::Secret,
        "applied before the pods mount it"
    );
    // Gateways and sidecars mount the copy and use it.
    let gw = &find(&r, Kind::Deployment, "sim-mixed-gateway")["spec"]["template"];
    let pod = &find(&r, Kind::StatefulSet, "sim-mixed-mixed")["spec"]["template"];
    for (template, container) in [
        (gw, &gw["spec"]["containers"][0]),
        (pod, container(pod, "initContainers", "sidecar")),
    ] {
        let a = args(container, "args");
        assert_eq!(
            flag(&a, "--etcd-ca-file").as_deref(),
            Some("/etc/infera/etcd-tls/ca.crt")
        );
        assert!(
            template["spec"]["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["secret"]["secretName"] == "sim-mixed-etcd-client"),
            "{}",
            template["spec"]["volumes"]
        );
    }
    // A deployment naming its own etcd gets no copy.
    dep.spec.discovery.etcd = Some(crate::api::EtcdSpec {
        endpoints: vec!["http://etcd.example:2379".into()],
        prefix: "/infera/workers/".into(),
        tls_secret_name: None,
        user: None,
        password_secret_ref: None,
    });
    let r = render(dep, observed, &platform).unwrap();
    assert!(r.children.iter().all(|c| c.kind != Kind::Secret));
}

#[test]
fn an_nvme_tier_outside_the_allowed_directories_is_a_reason() {
    let (mut deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    let dep = &mut deps[0];
    dep.spec.kv_cache.enabled = true;
    let platform = Platform {
        nvme_host_paths: vec!["/mnt".into(), "/data".into()],
        ..Platform::with_images(images())
    };
    let observed = Observed {
        topology: topos.first(),
        model_ready: true,
        ..Default::default()
    };
    for (path, ok) in [
        ("/mnt/nvme0/kvd", true),
        ("/data/kvd/", true),
        ("/mnt", false),
        ("/mntx/kvd", false),
        ("/etc", false),
        ("/var/lib/kubelet/pods", false),
        ("/mnt/../etc", false),
        ("/", false),
    ] {
        dep.spec.kv_cache.nvme = Some(crate::api::NvmeTier {
            path: path.into(),
            size: k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Ti".into()),
        });
        match render(dep, observed, &platform) {
            Ok(_) => assert!(ok, "{path} was allowed"),
            Err(e) => {
                assert!(!ok, "{path}: {e}");
                assert_eq!(e.reason(), "NvmePathNotAllowed");
                assert!(e.to_string().contains("/mnt, /data"), "{e}");
            }
        }
    }
}

#[test]
fn a_kv_cache_size_that_is_not_bytes_is_a_reason() {
    let (mut deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    let dep = &mut deps[0];
    dep.spec.kv_cache.enabled = true;
    dep.spec.kv_cache.ram = k8s_openapi::apimachinery::pkg::api::resource::Quantity("500m".into());
    let e = render(
        dep,
        Observed {
            topology: topos.first(),
            model_ready: true,
            ..Default::default()
        },
        &Platform::with_images(images()),
    )
    .unwrap_err();
    assert_eq!(e.reason(), "InvalidQuantity");
    assert!(
        e.to_string().starts_with("spec.kvCache.ram \"500m\""),
        "{e}"
    );
}

#[test]
fn a_variable_the_user_sets_replaces_the_operators_once() {
    let (mut deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    let pd = deps
        .iter_mut()
        .find(|d| d.metadata.name.as_deref() == Some("sim-pd"))
        .unwrap();
    for (name, value) in [
        ("POD_IP", "10.9.9.9"),
        ("VLLM_MORIIO_CONNECTOR_READ_MODE", "0"),
    ] {
        pd.spec.engine.env.push(k8s_openapi::api::core::v1::EnvVar {
            name: name.into(),
            value: Some(value.into()),
            ..Default::default()
        });
    }
    let r = render_example(pd, &topos, true);
    let pod = &find(&r, Kind::StatefulSet, "sim-pd-prefill")["spec"]["template"];
    let engine = container(pod, "containers", "engine");
    let names: Vec<&str> = engine["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "no duplicate names: {names:?}");
    assert_eq!(names[2], "POD_IP", "identity first, for $(VAR) references");
    assert_eq!(
        env_value(engine, "POD_IP").as_deref(),
        Some("10.9.9.9"),
        "the user wins"
    );
    assert_eq!(
        env_value(engine, "VLLM_MORIIO_CONNECTOR_READ_MODE").as_deref(),
        Some("0")
    );
}

fn engine_pod(r: &Rendered, set: &str) -> Value {
    find(r, Kind::StatefulSet, set)["spec"]["template"].clone()
}

/// The engine's command after the node-env wrapper.
fn engine_argv(pod: &Value) -> Vec<String> {
    let full = args(container(pod, "containers", "engine"), "command");
    match full.first().map(String::as_str) {
        Some("/bin/sh") => full[4..].to_vec(),
        _ => full,
    }
}

#[test]
fn atom_listens_on_its_server_port_and_answers_to_the_linked_served_name() {
    let (deps, topos) = load(&repo().join("examples/atom-1p2d/deployment.yaml"));
    let r = render_example(&deps[0], &topos, true);
    let pod = engine_pod(&r, "atom-r1-prefill");
    let cmd = engine_argv(&pod);
    assert_eq!(flag(&cmd, "--server-port").as_deref(), Some("8000"));
    assert_eq!(
        flag(&cmd, "--port"),
        None,
        "ATOM's --port is its torch master port"
    );
    assert_eq!(
        flag(&cmd, "--model").as_deref(),
        Some("deepseek-ai/DeepSeek-R1-0528")
    );
    assert!(!cmd.contains(&"--served-model-name".to_owned()));
    assert!(!cmd.contains(&"--kv-events-config".to_owned()));
    let config: Value = serde_json::from_str(&flag(&cmd, "--kv-transfer-config").unwrap()).unwrap();
    assert_eq!(
        config,
        json!({"kv_connector": "mooncake", "kv_role": "kv_producer", "handshake_port": 6301,
               "http_port": 8000, "proxy_ip": "$(POD_IP)",
               "ib_device": "ionic_0,ionic_1,ionic_2,ionic_3,ionic_4,ionic_5,ionic_6,ionic_7"})
    );
    let engine = container(&pod, "containers", "engine");
    assert_eq!(
        env_value(engine, "INFERA_ATOM_KV_EVENTS_ENDPOINT").as_deref(),
        Some("tcp://*:5557")
    );
    let node_env = args(container(&pod, "initContainers", "node-env"), "args");
    assert_eq!(
        flag(&node_env, "--model-link").as_deref(),
        Some("deepseek-ai/DeepSeek-R1-0528=/model-store")
    );
    // The sidecar reads the same flags.
    let sidecar = args(container(&pod, "initContainers", "sidecar"), "args");
    assert_eq!(flag(&sidecar, "--server-port").as_deref(), Some("8000"));
}

#[test]
fn what_atom_cannot_express_is_refused_with_the_field() {
    let (deps, topos) = load(&repo().join("examples/atom-1p2d/deployment.yaml"));
    let platform = Platform::with_images(images());
    let observed = |t| Observed {
        topology: Some(t),
        model_ready: true,
        ..Default::default()
    };
    let mut absolute = deps[0].clone();
    absolute.spec.model.name = "/data/models/r1".into();
    let e = render(&absolute, observed(&topos[0]), &platform).unwrap_err();
    assert_eq!(e.reason(), "UnsupportedByEngine");
    assert!(e.to_string().starts_with("spec.model.name"), "{e}");
    let mut spanning = topos[0].clone();
    spanning.spec.decode.parallelism.nodes_per_worker = 2;
    let e = render(&deps[0], observed(&spanning), &platform).unwrap_err();
    assert!(
        e.to_string().contains("atom has no multi-node flags"),
        "{e}"
    );
}

#[test]
fn vllm_publishes_kv_events_and_gets_the_rocm_defaults() {
    let (deps, topos) = load(&repo().join("examples/vllm-mixed-fp8-mi355x/deployment.yaml"));
    let r = render_example(&deps[0], &topos, true);
    let pod = engine_pod(&r, "llama-70b-mixed");
    let cmd = engine_argv(&pod);
    let events: Value = serde_json::from_str(&flag(&cmd, "--kv-events-config").unwrap()).unwrap();
    assert_eq!(
        events["enable_kv_cache_events"], true,
        "vLLM publishes only with it"
    );
    let engine = container(&pod, "containers", "engine");
    assert_eq!(
        env_value(engine, "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES").as_deref(),
        Some("1")
    );
    assert_eq!(
        env_value(engine, "VLLM_ROCM_USE_AITER").as_deref(),
        Some("1")
    );
    // Without RDMA nothing is read from the node: the image starts as it is, no shell.
    assert_eq!(args(engine, "command")[..2], ["vllm", "serve"]);
    assert!(
        pod["spec"]["initContainers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "node-env")
    );
}

#[test]
fn kvd_is_wired_to_vllm_through_its_connector() {
    let (deps, topos) = load(&repo().join("examples/vllm-1p1d-kvd/deployment.yaml"));
    let r = render_example(&deps[0], &topos, true);
    let prefill = engine_pod(&r, "qwen3-kvd-prefill");
    let config: Value =
        serde_json::from_str(&flag(&engine_argv(&prefill), "--kv-transfer-config").unwrap())
            .unwrap();
    assert_eq!(config["kv_connector"], "MultiConnector");
    assert_eq!(config["kv_role"], "kv_producer");
    assert_eq!(config["engine_id"], "$(POD_NAME)");
    let inner = config["kv_connector_extra_config"]["connectors"]
        .as_array()
        .unwrap();
    assert_eq!(
        inner[0],
        json!({"kv_connector": "InferaKvdConnector", "kv_role": "kv_both",
               "kv_connector_module_path": "infera.engine.vllm.kvd_connector"})
    );
    assert_eq!(inner[1]["kv_connector"], "MooncakeConnector");
    assert!(
        inner[1].get("engine_id").is_none(),
        "vLLM passes the outer one"
    );
    let decode = engine_pod(&r, "qwen3-kvd-decode");
    let config: Value =
        serde_json::from_str(&flag(&engine_argv(&decode), "--kv-transfer-config").unwrap())
            .unwrap();
    assert_eq!(config["kv_connector"], "MooncakeConnector");
    for pod in [&prefill, &decode] {
        let engine = container(pod, "containers", "engine");
        assert_eq!(env_value(engine, "PYTHONHASHSEED").as_deref(), Some("0"));
        assert_eq!(
            env_value(engine, "INFERA_KVD_SOCKET").as_deref(),
            Some("/run/infera-kvd/kvd.sock")
        );
    }
    // A mixed vLLM worker: the connector alone.
    let (mut mixed, topos) = load(&repo().join("examples/mxfp4/deployment.yaml"));
    mixed[0].spec.kv_cache.enabled = true;
    let r = render_example(&mixed[0], &topos, true);
    let cmd = engine_argv(&engine_pod(&r, "gpt-oss-mixed"));
    let config: Value = serde_json::from_str(&flag(&cmd, "--kv-transfer-config").unwrap()).unwrap();
    assert_eq!(config["kv_connector"], "InferaKvdConnector");
}

#[test]
fn the_drain_budget_sizes_the_grace_period_as_the_earlier_launchers_did() {
    let (deps, topos) = load(&repo().join("examples/vllm-1p1d-kvd/deployment.yaml"));
    let r = render_example(&deps[0], &topos, true);
    let pod = engine_pod(&r, "qwen3-kvd-prefill");
    assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 365);
    let sidecar = args(container(&pod, "initContainers", "sidecar"), "args");
    assert_eq!(flag(&sidecar, "--drain-timeout").as_deref(), Some("300"));
    for (drain, grace) in [(0, 120), (55, 120), (56, 121), (3600, 3665)] {
        assert_eq!(super::pod::grace_period_seconds(drain), grace, "{drain}");
    }
}

#[test]
fn rails_secondary_networks_and_the_gpu_resource_name_reach_the_pod() {
    let (mut deps, topos) = load(&repo().join("examples/vllm-mixed-fp8-mi355x/deployment.yaml"));
    let spec = &mut deps[0].spec;
    spec.engine.gpu_resource_name = "amd.com/gpu-partition".into();
    spec.network.rdma.enabled = true;
    spec.network.rdma.rails = (0..2)
        .map(|i| crate::api::RdmaRail {
            resource_name: format!("amd.com/rdma-rail{i}"),
            count: 1,
        })
        .collect();
    spec.network.secondary_networks = vec!["rail0@net1".into(), "infera/rail1@net2".into()];
    let r = render_example(&deps[0], &topos, true);
    let pod = engine_pod(&r, "llama-70b-mixed");
    let limits = &container(&pod, "containers", "engine")["resources"]["limits"];
    assert_eq!(limits["amd.com/gpu-partition"], "8");
    assert!(limits.get("amd.com/gpu").is_none());
    assert_eq!(limits["amd.com/rdma-rail0"], "1");
    assert_eq!(limits["amd.com/rdma-rail1"], "1");
    assert!(
        limits.get("rdma/hca").is_none(),
        "rails replace resourceName"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"],
        "rail0@net1,infera/rail1@net2"
    );
}

#[test]
fn gateways_are_placed_apart_from_the_engines_and_kept_through_drains() {
    let (mut deps, topos) = load(&repo().join("examples/vllm-mixed-fp8-mi355x/deployment.yaml"));
    deps[0].spec.gateway.scheduling.node_selector =
        std::collections::BTreeMap::from([("node-role/frontend".to_owned(), "true".to_owned())]);
    let r = render_example(&deps[0], &topos, true);
    let gw = find(&r, Kind::Deployment, "llama-70b-gateway");
    let spec = &gw["spec"]["template"]["spec"];
    assert_eq!(spec["nodeSelector"], json!({"node-role/frontend": "true"}));
    assert!(
        spec.get("tolerations").is_none(),
        "the engines' GPU tolerations stay theirs"
    );
    let pdb = find(&r, Kind::PodDisruptionBudget, "llama-70b-gateway");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        gw["spec"]["selector"]["matchLabels"]
    );
    deps[0].spec.gateway.replicas = 1;
    let one = render_example(&deps[0], &topos, true);
    assert!(
        !one.children
            .iter()
            .any(|c| c.kind == Kind::PodDisruptionBudget && c.name == "llama-70b-gateway"),
        "a single gateway has nothing to keep up"
    );
}

#[test]
fn pod_template_overrides_merge_per_role_and_for_the_gateway() {
    let (mut deps, topos) = load(&repo().join("examples/vllm-2p1d-mooncake/deployment.yaml"));
    let engine = &mut deps[0].spec.engine;
    engine.pod_template = Some(json!({
        "metadata": {"labels": {"team": "llm"}},
        "spec": {"containers": [{"name": "engine", "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}]}
    }));
    engine.role_pod_templates.decode = Some(json!({
        "metadata": {"labels": {"team": "decode"}},
        "spec": {"priorityClassName": "decode-first"}
    }));
    deps[0].spec.gateway.pod_template =
        Some(json!({"spec": {"imagePullSecrets": [{"name": "registry"}]}}));
    let r = render_example(&deps[0], &topos, true);
    let prefill = engine_pod(&r, "qwen3-235b-prefill");
    let decode = engine_pod(&r, "qwen3-235b-decode");
    assert_eq!(prefill["metadata"]["labels"]["team"], "llm");
    assert_eq!(
        decode["metadata"]["labels"]["team"], "decode",
        "the role's own wins"
    );
    assert!(prefill["spec"].get("priorityClassName").is_none());
    assert_eq!(decode["spec"]["priorityClassName"], "decode-first");
    for pod in [&prefill, &decode] {
        let engine = container(pod, "containers", "engine");
        assert_eq!(env_value(engine, "NCCL_DEBUG").as_deref(), Some("WARN"));
        assert!(engine["image"].is_string(), "merged, not replaced");
    }
    let gw = find(&r, Kind::Deployment, "qwen3-235b-gateway");
    assert_eq!(
        gw["spec"]["template"]["spec"]["imagePullSecrets"],
        json!([{"name": "registry"}])
    );

    let platform = Platform::with_images(images());
    let observed = Observed {
        topology: topos.first(),
        model_ready: true,
        ..Default::default()
    };
    let mut typo = deps[0].clone();
    typo.spec.engine.role_pod_templates.decode =
        Some(json!({"spec": {"nodeSelectr": {"rack": "a"}}}));
    let e = render(&typo, observed, &platform).unwrap_err();
    assert_eq!(e.reason(), "InvalidPodTemplate");
    assert!(
        e.to_string()
            .starts_with("spec.engine.rolePodTemplates.decode.spec.nodeSelectr: no such field"),
        "{e}"
    );
    let (mut mixed, topos) = load(&repo().join("examples/vllm-mixed-fp8-mi355x/deployment.yaml"));
    mixed[0].spec.engine.role_pod_templates.prefill = Some(json!({}));
    let e = render(&mixed[0], Observed::default(), &platform).unwrap_err();
    assert!(
        e.to_string().starts_with("spec.engine.rolePodTemplates: prefill and decode templates apply to serving.mode: disaggregated"),
        "{e}"
    );
    assert!(topos.is_empty());
}

#[test]
fn host_rdma_devices_only_as_an_opt_in() {
    let (mut deps, topos) = load(&repo().join("examples/vllm-mixed-fp8-mi355x/deployment.yaml"));
    deps[0].spec.network.rdma.enabled = true;
    let plugin = engine_pod(&render_example(&deps[0], &topos, true), "llama-70b-mixed");
    let engine = container(&plugin, "containers", "engine");
    assert_eq!(engine["resources"]["limits"]["rdma/hca"], "1");
    assert_eq!(
        engine["securityContext"]["capabilities"]["add"],
        json!(["IPC_LOCK"])
    );
    assert!(engine["securityContext"].get("privileged").is_none());
    assert!(
        !plugin.to_string().contains("/dev/infiniband"),
        "devices come from the device plugin"
    );

    deps[0].spec.network.rdma.host_devices = true;
    let host = engine_pod(&render_example(&deps[0], &topos, true), "llama-70b-mixed");
    let engine = container(&host, "containers", "engine");
    assert!(engine["resources"]["limits"].get("rdma/hca").is_none());
    assert_eq!(engine["resources"]["limits"]["amd.com/gpu"], "8");
    assert_eq!(engine["securityContext"], json!({"privileged": true}));
    assert!(
        engine["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "rdma-devices", "mountPath": "/dev/infiniband"}))
    );
    assert!(host["spec"]["volumes"].as_array().unwrap().contains(&json!(
        {"name": "rdma-devices", "hostPath": {"path": "/dev/infiniband", "type": "Directory"}}
    )));
}

#[test]
fn an_autoscaled_deployment_admits_the_operator_to_its_engines_metrics() {
    let (deps, topos) = load(&repo().join("examples/autoscaling/deployment.yaml"));
    let dep = &deps[0];
    let platform = Platform {
        operator_namespace: Some("infera-system".into()),
        ..Platform::with_images(images())
    };
    let observed = Observed {
        topology: None,
        model_ready: true,
        ..Default::default()
    };
    let r = render(dep, observed, &platform).unwrap();
    let policy = find(&r, Kind::NetworkPolicy, "chat-autoscaled-engines");
    assert_eq!(
        policy["spec"]["ingress"][1],
        json!({
            "from": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "infera-system"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "infera-operator"}},
            }],
            "ports": [{"port": 8000, "protocol": "TCP"}],
        })
    );
    // Not autoscaled: only its own pods.
    let mut fixed = dep.clone();
    fixed.spec.autoscaling = None;
    let r = render(&fixed, observed, &platform).unwrap();
    let policy = find(&r, Kind::NetworkPolicy, "chat-autoscaled-engines");
    assert_eq!(policy["spec"]["ingress"].as_array().unwrap().len(), 1);
    // Disaggregated: the topology's shape until the autoscaler writes per-role counts,
    // which count only while spec.autoscaling is set.
    let replicas = |r: &Rendered, role: &str| {
        find(r, Kind::StatefulSet, &format!("chat-pd-autoscaled-{role}"))["spec"]["replicas"]
            .clone()
    };
    let mut pd = deps[1].clone();
    let r = render_example(&pd, &topos, true);
    assert_eq!(
        (replicas(&r, "prefill"), replicas(&r, "decode")),
        (json!(1), json!(1))
    );
    pd.spec.serving.role_replicas = Some(crate::api::RoleReplicas {
        prefill: 3,
        decode: 1,
    });
    let r = render_example(&pd, &topos, true);
    assert_eq!(
        (replicas(&r, "prefill"), replicas(&r, "decode")),
        (json!(3), json!(1))
    );
    pd.spec.autoscaling = None;
    let r = render_example(&pd, &topos, true);
    assert_eq!(
        (replicas(&r, "prefill"), replicas(&r, "decode")),
        (json!(1), json!(1))
    );
}

/// Every example folder with its deployments and topologies.
fn examples() -> Vec<(String, Vec<InferaDeployment>, Vec<PDTopology>)> {
    let mut out: Vec<_> = std::fs::read_dir(repo().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("deployment.yaml").exists())
        .map(|p| {
            let (deps, topos) = load(&p.join("deployment.yaml"));
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                deps,
                topos,
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The engine workloads release 0.1.0 made of an example: (name, pod templates).
fn frozen_0_1_0(folder: &str) -> Vec<(String, Vec<Value>)> {
    let path = repo().join(format!("operator/snapshots/platform-0.1.0/{folder}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (a new example has no 0.1.0 templates: if it uses a field 0.1.0 lacked, add it to `newer`)",
            path.display()
        )
    });
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_owned(),
                d["templates"].as_array().unwrap().clone(),
            )
        })
        .collect()
}

/// An engine workload child's templates and annotations.
fn engine_workload(child: &Child) -> (Vec<Value>, Value) {
    let o = &child.object;
    let templates = match child.kind {
        Kind::StatefulSet => vec![o["spec"]["template"].clone()],
        _ => vec![
            o["spec"]["leaderWorkerTemplate"]["leaderTemplate"].clone(),
            o["spec"]["leaderWorkerTemplate"]["workerTemplate"].clone(),
        ],
    };
    (templates, o["metadata"]["annotations"].clone())
}

fn render_over(
    dep: &InferaDeployment,
    topos: &[PDTopology],
    engines: &BTreeMap<String, LiveEngines>,
    platform: &Platform,
) -> Rendered {
    let topology = topos
        .iter()
        .find(|t| t.metadata.name.as_deref() == dep.spec.serving.topology_ref.as_deref());
    let secrets = pull_secret_found();
    render(
        dep,
        Observed {
            topology,
            model_ready: true,
            engines: Some(engines),
            pull_secrets: Some(&secrets),
            ..Default::default()
        },
        platform,
    )
    .unwrap()
}

/// What observe reads of the workloads release 0.1.0 made (no release recorded).
fn live_0_1_0(frozen: &[(String, Vec<Value>)]) -> BTreeMap<String, LiveEngines> {
    frozen
        .iter()
        .map(|(name, templates)| {
            let spec: k8s_openapi::api::core::v1::PodSpec =
                serde_json::from_value(templates[0]["spec"].clone()).unwrap();
            (
                name.clone(),
                crate::reconcile::observe::build_live_engines(None, Some(&spec)),
            )
        })
        .collect()
}

/// The operator of this release, with images of its own tag and the chart's pull
/// settings: nothing of it may reach engines kept on 0.1.0.
fn upgraded_platform() -> Platform {
    Platform {
        pull_policy: Some(crate::api::PullPolicy::Always),
        pull_secrets: vec!["infera-registry".into()],
        ..Platform::with_images(Images::from_registry(
            "registry.example/infera",
            "0.2.0-new",
        ))
    }
}

fn pull_secret_found() -> BTreeMap<String, crate::plan::PullSecretData> {
    BTreeMap::from([(
        "infera-registry".to_owned(),
        ("kubernetes.io/dockerconfigjson".to_owned(), BTreeMap::new()),
    )])
}

/// An operator upgrade restarts no engine: the engine workloads release 0.1.0 made of
/// every example (its templates, frozen in `operator/snapshots/platform-0.1.0/`, no
/// release recorded on them) are rendered by this operator, whose own images have
/// another tag and whose chart sets pull settings, into the very same templates, now
/// recorded as 0.1.0 with their digest.
#[test]
fn engines_made_by_0_1_0_keep_their_templates_byte_for_byte() {
    let platform = upgraded_platform();
    let secrets = pull_secret_found();
    let mut checked = 0;
    // Examples of fields release 0.1.0 did not have: no 0.1.0 engine ran them.
    let newer = ["gateway-api"];
    for (folder, deps, topos) in examples() {
        if newer.contains(&folder.as_str()) {
            continue;
        }
        let frozen = frozen_0_1_0(&folder);
        let engines = live_0_1_0(&frozen);
        for dep in &deps {
            let topology = topos
                .iter()
                .find(|t| t.metadata.name.as_deref() == dep.spec.serving.topology_ref.as_deref());
            let rendered = render(
                dep,
                Observed {
                    topology,
                    model_ready: true,
                    engines: Some(&engines),
                    pull_secrets: Some(&secrets),
                    ..Default::default()
                },
                &platform,
            )
            .unwrap();
            for child in rendered
                .children
                .iter()
                .filter(|c| matches!(c.kind, Kind::StatefulSet | Kind::LeaderWorkerSet))
            {
                let (want_name, want) = frozen
                    .iter()
                    .find(|(n, _)| *n == child.name)
                    .unwrap_or_else(|| {
                        panic!("{folder}: {} is not in the 0.1.0 templates", child.name)
                    });
                let (templates, annotations) = engine_workload(child);
                assert!(
                    &templates == want,
                    "{folder}/{want_name}: the 0.1.0 template changed (gate the change on a new release):\nnow  {}\n0.1.0 {}",
                    serde_json::to_string(&templates).unwrap(),
                    serde_json::to_string(want).unwrap()
                );
                assert_eq!(annotations["infera.amd.com/platform-version"], "0.1.0");
                assert_eq!(
                    annotations["infera.amd.com/engine-template-digest"],
                    workers::build_template_digest(
                        &serde_json::from_value::<Vec<k8s_openapi::api::core::v1::PodTemplateSpec>>(
                            Value::Array(want.clone())
                        )
                        .unwrap()
                    )
                );
                checked += 1;
            }
            assert!(
                rendered
                    .roles
                    .iter()
                    .all(|r| r.platform == crate::api::PlatformVersion::V0_1_0),
                "{folder}"
            );
        }
    }
    assert!(checked >= 15, "{checked} workloads");
}

/// After the upgrade, the kept release holds while the engine spec does not change;
/// an engine spec change (the pods roll anyway) moves them to this release, with its
/// pull settings; `spec.platform.version` moves them without one.
#[test]
fn engines_move_to_this_release_on_their_own_change_or_when_asked() {
    let platform = upgraded_platform();
    let secrets = pull_secret_found();
    let (deps, topos) = load(&repo().join("examples/sim/deployment.yaml"));
    let dep = &deps[0];
    let frozen = frozen_0_1_0("sim");
    // The first reconcile after the upgrade records 0.1.0 and the digest.
    let first = render_over(dep, &topos, &live_0_1_0(&frozen), &platform);
    let workload = first
        .children
        .iter()
        .find(|c| c.kind == Kind::StatefulSet)
        .unwrap();
    let (templates, annotations) = engine_workload(workload);
    let spec: k8s_openapi::api::core::v1::PodSpec =
        serde_json::from_value(templates[0]["spec"].clone()).unwrap();
    let recorded: BTreeMap<String, String> = serde_json::from_value(annotations).unwrap();
    let live = BTreeMap::from([(
        workload.name.clone(),
        crate::reconcile::observe::build_live_engines(Some(&recorded), Some(&spec)),
    )]);
    let observed = |dep: &InferaDeployment| {
        let topology = topos
            .iter()
            .find(|t| t.metadata.name.as_deref() == dep.spec.serving.topology_ref.as_deref());
        render(
            dep,
            Observed {
                topology,
                model_ready: true,
                engines: Some(&live),
                pull_secrets: Some(&secrets),
                ..Default::default()
            },
            &platform,
        )
        .unwrap()
    };
    let release = |r: &Rendered| r.roles[0].platform;
    let template = |r: &Rendered| {
        engine_workload(
            r.children
                .iter()
                .find(|c| c.kind == Kind::StatefulSet)
                .unwrap(),
        )
        .0
    };
    // Unchanged: kept.
    let again = observed(dep);
    assert_eq!(release(&again), crate::api::PlatformVersion::V0_1_0);
    assert_eq!(template(&again), templates);
    // A change of the gateway alone does not touch the engines.
    let mut gw = dep.clone();
    gw.spec.gateway.replicas += 1;
    assert_eq!(template(&observed(&gw)), templates);
    // An engine arg: the pods roll, onto this release (its images, its pull settings).
    let mut changed = dep.clone();
    changed.spec.engine.args.push("--jitter".into());
    changed.spec.engine.args.push("0.1".into());
    let moved = observed(&changed);
    assert_eq!(release(&moved), crate::api::PlatformVersion::CURRENT);
    let pod = &template(&moved)[0];
    assert_eq!(
        container(pod, "initContainers", "sidecar")["image"],
        "registry.example/infera/infera-engine-sidecar:0.2.0-new"
    );
    assert_eq!(
        container(pod, "initContainers", "sidecar")["imagePullPolicy"],
        "Always"
    );
    assert_eq!(
        pod["spec"]["imagePullSecrets"],
        json!([{"name": "sim-mixed-pull-infera-registry"}])
    );
    // Asked for: moved with the spec as it is.
    let mut pinned = dep.clone();
    pinned.spec.platform = Some(crate::api::PlatformSpec {
        version: crate::api::PlatformVersion::V0_2_0,
    });
    assert_eq!(
        release(&observed(&pinned)),
        crate::api::PlatformVersion::V0_2_0
    );
    assert_ne!(template(&observed(&pinned)), templates);
}

#[test]
fn an_inference_pool_renders_its_picker_pool_route_and_decode_frontends() {
    let (deps, topos) = load(&repo().join("examples/gateway-api/deployment.yaml"));
    let mixed = render_example(&deps[0], &topos, true);
    let pool = find(&mixed, Kind::InferencePool, "pool-mixed-pool");
    assert_eq!(pool["apiVersion"], "inference.networking.k8s.io/v1");
    assert_eq!(
        pool["spec"]["selector"]["matchLabels"],
        json!({"infera.amd.com/deployment": "pool-mixed", "infera.amd.com/role": "mixed"})
    );
    assert_eq!(pool["spec"]["targetPorts"], json!([{"number": 8000}]));
    assert_eq!(
        pool["spec"]["endpointPickerRef"],
        json!({"group": "", "kind": "Service", "name": "pool-mixed-epp", "port": {"number": 9002}, "failureMode": "FailClose"})
    );
    assert_eq!(
        pool["metadata"]["ownerReferences"][0]["uid"],
        "uid-pool-mixed"
    );
    let route = find(&mixed, Kind::HttpRoute, "pool-mixed-route");
    assert_eq!(
        route["spec"]["parentRefs"],
        json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway", "namespace": "infera"}])
    );
    assert_eq!(
        route["spec"]["rules"][0]["backendRefs"],
        json!([{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "pool-mixed-pool"}])
    );
    // The picker: GAIE's ports, gRPC health probes, two replicas and a budget.
    let picker = find(&mixed, Kind::Deployment, "pool-mixed-epp");
    assert_eq!(picker["spec"]["replicas"], 2);
    let pod = &picker["spec"]["template"];
    let c = container(pod, "containers", "picker");
    let a = args(c, "args");
    assert_eq!(flag(&a, "--epp-port").as_deref(), Some("9002"));
    assert_eq!(flag(&a, "--epp-health-port").as_deref(), Some("9003"));
    assert_eq!(flag(&a, "--epp-fallbacks").as_deref(), Some("2"));
    assert_eq!(flag(&a, "--router-policy").as_deref(), Some("kv-aware"));
    assert_eq!(flag(&a, "--port").as_deref(), Some("9090"));
    assert_eq!(flag(&a, "--epp-destination-port"), None);
    assert_eq!(
        c["readinessProbe"]["grpc"],
        json!({"port": 9003, "service": "readiness"})
    );
    assert_eq!(pod["spec"]["serviceAccountName"], "pool-mixed-epp");
    find(&mixed, Kind::PodDisruptionBudget, "pool-mixed-epp");
    find(&mixed, Kind::Service, "pool-mixed-epp");
    let role = find(&mixed, Kind::Role, "pool-mixed-epp");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}])
    );
    // Mixed workers carry no frontend, and their account still only patches.
    let workers = find(&mixed, Kind::StatefulSet, "pool-mixed-mixed");
    assert!(
        workers["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "frontend")
    );
    let identity = find(&mixed, Kind::Role, "pool-mixed-infera");
    assert_eq!(identity["rules"][0]["verbs"], json!(["patch"]));

    // Prefill/decode: the pool is the decode pods' frontends.
    let pd = render_example(&deps[1], &topos, true);
    let pool = find(&pd, Kind::InferencePool, "pool-pd-pool");
    assert_eq!(
        pool["spec"]["selector"]["matchLabels"]["infera.amd.com/role"],
        "decode"
    );
    assert_eq!(pool["spec"]["targetPorts"], json!([{"number": 8200}]));
    let picker = find(&pd, Kind::Deployment, "pool-pd-epp");
    let a = args(
        container(&picker["spec"]["template"], "containers", "picker"),
        "args",
    );
    assert_eq!(flag(&a, "--epp-destination-port").as_deref(), Some("8200"));
    let decode = find(&pd, Kind::StatefulSet, "pool-pd-decode");
    let frontend = container(&decode["spec"]["template"], "containers", "frontend");
    let a = args(frontend, "args");
    assert_eq!(&a[..2], ["--router-mode", "direct"]);
    // Nothing of the gateway's routing: tuning it restarts no engine.
    for routing in [
        "--router-policy",
        "--kv-overlap-weight",
        "--migration-limit",
    ] {
        assert_eq!(flag(&a, routing), None, "{routing} in {a:?}");
    }
    assert_eq!(flag(&a, "--port").as_deref(), Some("8200"));
    assert_eq!(
        flag(&a, "--k8s-label-selector").as_deref(),
        Some("infera.amd.com/deployment=pool-pd,app.kubernetes.io/component=engine")
    );
    assert_eq!(
        frontend["image"],
        "registry.example/infera/infera-gateway:test"
    );
    assert!(
        frontend["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"),
        "the frontend reads Pods with the engine pods' token: {frontend}"
    );
    let prefill = find(&pd, Kind::StatefulSet, "pool-pd-prefill");
    assert!(
        prefill["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "frontend")
    );
    let identity = find(&pd, Kind::Role, "pool-pd-infera");
    assert_eq!(
        identity["rules"][0]["verbs"],
        json!(["get", "list", "watch", "patch"])
    );
}

#[test]
fn a_pool_over_workers_spanning_nodes_selects_their_leaders() {
    let (mut deps, topos) = load(&repo().join("examples/multi-node-worker/deployment.yaml"));
    deps[0].spec.gateway.inference_pool = Some(crate::api::InferencePoolSpec::default());
    let r = render_example(&deps[0], &topos, true);
    let name = deps[0].metadata.name.clone().unwrap();
    let pool = find(&r, Kind::InferencePool, &format!("{name}-pool"));
    assert_eq!(
        pool["spec"]["selector"]["matchLabels"]["leaderworkerset.sigs.k8s.io/worker-index"], "0",
        "{pool}"
    );
}
