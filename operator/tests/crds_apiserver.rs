//! The CRDs against the real kube-apiserver from `testenv/`, driven with kubectl as a
//! user drives them: they install; every example applies (server dry run, then for
//! real); invalid manifests are rejected with the message each must produce;
//! `kubectl scale` goes through the scale subresource; `kubectl explain` prints the
//! field docs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};
use support::{apply_retrying, drop_namespace, install, kubectl, namespace};

#[tokio::test]
async fn every_example_applies_and_scale_and_explain_work() {
    let client = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    install(&client).await;
    let ns = namespace(&client).await;
    let examples = support::example_dirs();
    assert!(examples.len() >= 7, "{examples:?}");
    for dir in &examples {
        let file = dir.join("deployment.yaml");
        let file = file.to_str().unwrap();
        assert!(
            dir.join("README.md").exists(),
            "{} has no README",
            dir.display()
        );
        for extra in [&["--dry-run=server"][..], &[][..]] {
            let mut args = vec!["apply", "-n", &ns, "-f", file];
            args.extend_from_slice(extra);
            let (ok, stdout, stderr) = apply_retrying(&kubeconfig, &args, None);
            assert!(ok, "{file} {extra:?}: {stderr}");
            assert!(
                stdout.contains("inferadeployment.infera.amd.com/"),
                "{stdout}"
            );
        }
    }

    // The printer columns.
    let (ok, table, err) = kubectl(&kubeconfig, &["get", "idep", "-n", &ns, "sim-mixed"], None);
    assert!(ok, "{err}");
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "ENGINE", "MODE", "REPLICAS", "READY", "AGE"]
    );
    assert!(
        table.contains("sim-mixed") && table.contains(" sim ") && table.contains("mixed"),
        "{table}"
    );

    // kubectl scale goes through the scale subresource to spec.replicas.
    let (ok, _, err) = kubectl(
        &kubeconfig,
        &["scale", "-n", &ns, "idep/sim-mixed", "--replicas=5"],
        None,
    );
    assert!(ok, "{err}");
    let (ok, replicas, err) = kubectl(
        &kubeconfig,
        &[
            "get",
            "idep",
            "-n",
            &ns,
            "sim-mixed",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(replicas, "5");
    let (ok, scale, err) = kubectl(
        &kubeconfig,
        &[
            "get",
            "--raw",
            &format!(
                "/apis/infera.amd.com/v1alpha1/namespaces/{ns}/inferadeployments/sim-mixed/scale"
            ),
        ],
        None,
    );
    assert!(ok, "{err}");
    let scale: serde_json::Value = serde_json::from_str(&scale).unwrap();
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 5);

    // kubectl explain prints the field docs (once the OpenAPI is published).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, text, err) = kubectl(
            &kubeconfig,
            &["explain", "inferadeployment.spec.network.rdma"],
            None,
        );
        if ok && text.contains("gidIndex") {
            assert!(text.contains("MC_GID_INDEX"), "{text}");
            assert!(
                text.contains("resourceName") && text.contains("rdma/hca"),
                "{text}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "explain never showed the docs: {text}{err}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Every field of the engine-pod wiring explains itself.
    for (field, says) in [
        ("spec.engine.drainSeconds", "max(120, this + 65)"),
        ("spec.engine.gpuResourceName", "amd.com/gpu"),
        ("spec.network.rdma.rails", "One resource per rail"),
        ("spec.network.rdma", "else found on the node"),
        (
            "spec.network.rdma.gidIndex",
            "found on the node by the engine pod's init container",
        ),
        (
            "spec.network.secondaryNetworks",
            "k8s.v1.cni.cncf.io/networks",
        ),
        ("spec.gateway.scheduling", "PodDisruptionBudget"),
        (
            "spec.engine.podTemplate",
            "strategic-merge rules (as `kubectl patch` would)",
        ),
        ("spec.engine.rolePodTemplates", "merged after `podTemplate`"),
        ("spec.gateway.podTemplate", "the container is `gateway`"),
        (
            "spec.network.rdma.hostDevices",
            "no RDMA resource is requested",
        ),
        ("spec.autoscaling", "the operator stands down"),
        (
            "spec.autoscaling.targets.ttftP90Seconds",
            "under half of it",
        ),
        ("spec.serving.roleReplicas", "written by the autoscaler"),
        ("status.autoscaling.nextScaleInTime", "may leave"),
    ] {
        let path = format!("inferadeployment.{field}");
        let (ok, text, err) = kubectl(&kubeconfig, &["explain", &path], None);
        assert!(ok, "{path}: {err}");
        // kubectl wraps the description: compare with the whitespace folded.
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flat.contains(says), "{path} does not say {says:?}: {text}");
    }
    // The HorizontalPodAutoscaler documented against /scale is valid as written.
    let hpa = support::repo().join("examples/autoscaling/hpa.yaml");
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[
            "apply",
            "-n",
            &ns,
            "--dry-run=server",
            "-f",
            hpa.to_str().unwrap(),
        ],
        None,
    );
    assert!(ok && out.contains("horizontalpodautoscaler"), "{out}{err}");
    drop_namespace(&client, &ns).await;
}

const BASE: &str = r#"apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {name: bad}
spec:
  model: {name: m, source: {hostPath: {path: /m}}}
  engine: {kind: sim}
"#;

const TOPOLOGY: &str = r#"apiVersion: infera.amd.com/v1alpha1
kind: PDTopology
metadata: {name: bad}
spec:
  layout: 1P1D
"#;

/// `base` with `spec` keys replaced or added: each entry is a YAML line under `spec:`.
fn with_spec(base: &str, lines: &[&str]) -> String {
    let mut doc: serde_json::Value = serde_saphyr::from_str(base).unwrap();
    for line in lines {
        let patch: serde_json::Value = serde_saphyr::from_str(line).unwrap();
        for (k, v) in patch.as_object().unwrap() {
            doc["spec"][k] = v.clone();
        }
    }
    serde_json::to_string(&doc).unwrap()
}

#[tokio::test]
async fn invalid_manifests_are_rejected_with_a_message_naming_the_field() {
    let client = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    install(&client).await;
    let ns = namespace(&client).await;
    // (what is wrong, the manifest, text the API server's answer must contain)
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "disaggregated without a topology",
            with_spec(BASE, &["serving: {mode: disaggregated}"]),
            "spec.serving.topologyRef is required when spec.serving.mode is disaggregated",
        ),
        (
            "a topology on a mixed deployment",
            with_spec(BASE, &["serving: {mode: mixed, topologyRef: shape}"]),
            "spec.serving.topologyRef applies to mode: disaggregated only",
        ),
        (
            "the NATS request plane without NATS",
            with_spec(BASE, &["messaging: {requestTransport: nats}"]),
            "spec.messaging.requestTransport nats needs backend: nats",
        ),
        (
            "gidIndex with RDMA off",
            with_spec(BASE, &["network: {rdma: {gidIndex: 3}}"]),
            "spec.network.rdma.gidIndex is set but RDMA is off",
        ),
        (
            "interfaces with RDMA off",
            with_spec(BASE, &["network: {rdma: {interfaces: [ionic_0]}}"]),
            "spec.network.rdma.interfaces are set but RDMA is off",
        ),
        (
            "hostNetwork with RDMA off",
            with_spec(BASE, &["network: {rdma: {hostNetwork: true}}"]),
            "spec.network.rdma.hostNetwork is an RDMA opt-in",
        ),
        (
            "hostDevices with rails",
            with_spec(
                BASE,
                &[
                    "network: {rdma: {enabled: true, hostDevices: true, rails: [{resourceName: amd.com/rdma-rail0}]}}",
                ],
            ),
            "spec.network.rdma.hostDevices mounts the host's devices instead of requesting device-plugin resources: remove rails",
        ),
        (
            "a pod template that is not an object",
            with_spec(BASE, &["gateway: {podTemplate: [1]}"]),
            "spec.gateway.podTemplate: Invalid value",
        ),
        (
            "two model sources",
            with_spec(
                BASE,
                &["model: {name: m, source: {hostPath: {path: /m}, pvc: {claimName: weights}}}"],
            ),
            "spec.model.source: set exactly one of huggingFace, pvc or hostPath",
        ),
        (
            "no model source",
            with_spec(BASE, &["model: {name: m, source: {}}"]),
            "spec.model.source: set exactly one of huggingFace, pvc or hostPath",
        ),
        (
            "a real engine without an image",
            with_spec(BASE, &["engine: {kind: vllm}"]),
            "spec.engine.image is required for vllm, sglang and atom",
        ),
        (
            "an unknown engine",
            with_spec(BASE, &["engine: {kind: tgi, image: x}"]),
            "spec.engine.kind: Unsupported value: \"tgi\"",
        ),
        (
            "simFlavor on a real engine",
            with_spec(BASE, &["engine: {kind: vllm, image: x, simFlavor: sglang}"]),
            "spec.engine.simFlavor applies to kind: sim only",
        ),
        (
            "a multi-node simulator",
            with_spec(
                BASE,
                &["engine: {kind: sim, parallelism: {nodesPerWorker: 2}}"],
            ),
            "spec.engine.parallelism.nodesPerWorker must be 1 for kind: sim",
        ),
        (
            "an autoscaling minimum over its maximum",
            with_spec(
                BASE,
                &["autoscaling: {minReplicas: 4, maxReplicas: 2, targets: {ttftP90Seconds: 0.5}}"],
            ),
            "spec.autoscaling.minReplicas must not exceed maxReplicas",
        ),
        (
            "autoscaling without a target",
            with_spec(BASE, &["autoscaling: {maxReplicas: 2, targets: {}}"]),
            "spec.autoscaling.targets: give at least one of ttftP90Seconds",
        ),
        (
            "a KV-usage target over 1",
            with_spec(
                BASE,
                &["autoscaling: {maxReplicas: 2, targets: {kvUsage: 1.5}}"],
            ),
            "spec.autoscaling.targets.kvUsage in body should be less than or equal to 1",
        ),
        (
            "a rollout that could never replace a worker",
            with_spec(BASE, &["rollout: {maxSurge: 0, maxUnavailable: 0}"]),
            "spec.rollout: maxSurge and maxUnavailable are both 0, so no worker could ever be replaced",
        ),
        (
            "negative replicas",
            with_spec(BASE, &["replicas: -1"]),
            "spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
        ),
        (
            "tensor parallel 0",
            with_spec(
                BASE,
                &["engine: {kind: sim, parallelism: {tensorParallelSize: 0}}"],
            ),
            "spec.engine.parallelism.tensorParallelSize in body should be greater than or equal to 1",
        ),
        (
            "a startup budget under a minute",
            with_spec(
                BASE,
                &["model: {name: m, source: {hostPath: {path: /m}}, startupBudgetSeconds: 5}"],
            ),
            "spec.model.startupBudgetSeconds in body should be greater than or equal to 60",
        ),
        (
            "a relative hostPath",
            with_spec(
                BASE,
                &["model: {name: m, source: {hostPath: {path: models/m}}}"],
            ),
            "spec.model.source.hostPath.path in body should match '^/'",
        ),
        (
            "a Hugging Face id that is not org/name",
            with_spec(
                BASE,
                &["model: {name: m, source: {huggingFace: {id: 'meta llama/3'}}}"],
            ),
            "spec.model.source.huggingFace.id in body should match",
        ),
        (
            "https etcd endpoints without the TLS Secret",
            with_spec(
                BASE,
                &["discovery: {backend: etcd, etcd: {endpoints: ['https://etcd:2379']}}"],
            ),
            "https:// endpoints go with tlsSecretName",
        ),
        (
            "an etcd TLS Secret for http endpoints",
            with_spec(
                BASE,
                &[
                    "discovery: {backend: etcd, etcd: {endpoints: ['http://etcd:2379'], tlsSecretName: etcd-client}}",
                ],
            ),
            "https:// endpoints go with tlsSecretName",
        ),
        (
            "an etcd user without a password",
            with_spec(
                BASE,
                &[
                    "discovery: {backend: etcd, etcd: {endpoints: ['http://etcd:2379'], user: infera}}",
                ],
            ),
            "spec.discovery.etcd: user and passwordSecretRef go together",
        ),
        (
            "metricsRequireAuth without keys",
            with_spec(BASE, &["gateway: {metricsRequireAuth: true}"]),
            "spec.gateway.metricsRequireAuth needs spec.gateway.apiKeysSecretRef",
        ),
        (
            "etcd settings with no endpoint",
            with_spec(BASE, &["discovery: {backend: etcd, etcd: {endpoints: []}}"]),
            "spec.discovery.etcd.endpoints: Invalid value",
        ),
        (
            "an etcd endpoint that is not a URL",
            with_spec(
                BASE,
                &["discovery: {backend: etcd, etcd: {endpoints: ['etcd:2379']}}"],
            ),
            "spec.discovery.etcd.endpoints[0] in body should match",
        ),
        (
            "a NATS URL that is not nats://",
            with_spec(
                BASE,
                &["messaging: {backend: nats, natsUrl: 'http://nats:4222'}"],
            ),
            "spec.messaging.natsUrl in body should match",
        ),
        (
            "kvd tiers with kvd off",
            with_spec(BASE, &["kvCache: {nvme: {path: /nvme, size: 1Ti}}"]),
            "spec.kvCache tiers (nvme, remoteUrl, remoteUrlSecretRef) are set but kvd is off",
        ),
        (
            "an NVMe path climbing out of its directory",
            with_spec(
                BASE,
                &["kvCache: {enabled: true, nvme: {path: /mnt/../etc, size: 1Ti}}"],
            ),
            "spec.kvCache.nvme.path: no . or .. segments",
        ),
        (
            "the distributed tier's URL given twice",
            with_spec(
                BASE,
                &[
                    "kvCache: {enabled: true, remoteUrl: 'redis://kv:6379', remoteUrlSecretRef: {name: kv, key: url}}",
                ],
            ),
            "give the distributed tier's URL once, as remoteUrl or remoteUrlSecretRef",
        ),
        (
            "an unknown routing policy",
            with_spec(BASE, &["gateway: {policy: least-loaded}"]),
            "spec.gateway.policy: Unsupported value: \"least-loaded\"",
        ),
        (
            "a gateway port out of range",
            with_spec(BASE, &["gateway: {service: {port: 70000}}"]),
            "spec.gateway.service.port in body should be less than or equal to 65535",
        ),
        (
            "nixl transport",
            with_spec(TOPOLOGY, &["transport: {backend: nixl}"]),
            "spec.transport.backend nixl is not supported",
        ),
        (
            "custom layout without role counts",
            with_spec(TOPOLOGY, &["layout: custom", "prefill: {replicas: 2}"]),
            "spec.layout custom needs spec.prefill.replicas and spec.decode.replicas",
        ),
        (
            "role counts on a named layout",
            with_spec(TOPOLOGY, &["prefill: {replicas: 2}"]),
            "apply to layout: custom only",
        ),
        (
            "read mode on mooncake",
            with_spec(
                TOPOLOGY,
                &["transport: {backend: mooncake, readMode: true}"],
            ),
            "spec.transport.readMode (decode pulls the KV) applies to backend: mori only",
        ),
        (
            "an unknown layout",
            with_spec(TOPOLOGY, &["layout: 3P3D"]),
            "spec.layout: Unsupported value: \"3P3D\"",
        ),
    ];
    assert!(cases.len() >= 15);
    let mut failures = Vec::new();
    for (what, manifest, want) in &cases {
        let (ok, _, stderr) = apply_retrying(
            &kubeconfig,
            &["apply", "-n", &ns, "--dry-run=server", "-f", "-"],
            Some(manifest),
        );
        if ok || !stderr.contains(want) {
            failures.push(format!("{what}: accepted={ok}, answer: {stderr}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The base manifests themselves are valid: the rejections come from the changes;
    // and so are the opt-ins next to the rules that refuse their misuse.
    let opt_ins = [
        with_spec(
            BASE,
            &["network: {rdma: {enabled: true, hostDevices: true}}"],
        ),
        with_spec(
            BASE,
            &[
                "gateway: {podTemplate: {metadata: {labels: {team: a}}, spec: {nodeSelector: {x: y}}}}",
            ],
        ),
    ];
    for manifest in [BASE, TOPOLOGY]
        .into_iter()
        .chain(opt_ins.iter().map(String::as_str))
    {
        let (ok, _, stderr) = apply_retrying(
            &kubeconfig,
            &["apply", "-n", &ns, "--dry-run=server", "-f", "-"],
            Some(manifest),
        );
        assert!(ok, "{manifest}: {stderr}");
    }
    drop_namespace(&client, &ns).await;
}
