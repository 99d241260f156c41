//! `podTemplate` overrides merge as the API server merges them: for each patch, the
//! operator's merge of a rendered pod template (a vLLM 2P1D prefill pod, with its
//! init containers, RDMA resources and volumes; and a gateway pod) must equal what the
//! real kube-apiserver makes of the same template stored as a `PodTemplate` and patched
//! with `kubectl patch --type strategic --dry-run=server`. Both results go through the
//! server's defaulting (ours as a dry-run create), so they compare field for field.
//! A patch the server refuses, the operator refuses too.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use infera_operator::plan::{Images, Observed, Platform, PodOverride};
use infera_operator::render::overrides::apply_overrides;
use infera_operator::render::{Kind, render};
use k8s_openapi::api::core::v1::{PodTemplate, PodTemplateSpec};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The pod templates of the prefill workers and the gateway of a rendered example.
fn bases() -> Vec<(&'static str, PodTemplateSpec)> {
    let (deps, topos) = support::example("vllm-2p1d-mooncake");
    let rendered = render(
        &deps[0],
        Observed {
            topology: topos.first(),
            model_ready: true,
            ..Default::default()
        },
        &Platform::with_images(Images::from_registry("r", "t")),
    )
    .unwrap();
    let template = |kind: Kind, suffix: &str| {
        let child = rendered
            .children
            .iter()
            .find(|c| c.kind == kind && c.name.ends_with(suffix))
            .unwrap();
        serde_json::from_value(child.object["spec"]["template"].clone()).unwrap()
    };
    vec![
        ("prefill", template(Kind::StatefulSet, "-prefill")),
        ("gateway", template(Kind::Deployment, "-gateway")),
    ]
}

/// Patches as users write them, and the directives Kubernetes documents. `{C}` is the
/// base's main container.
fn patches() -> Vec<(&'static str, Value)> {
    vec![
        (
            "labels and annotations: add; null on an absent one",
            json!({"metadata": {
                "labels": {"team": "llm", "absent": null},
                "annotations": {"prometheus.io/scrape": "true"}
            }}),
        ),
        (
            "an extra volume and its mount",
            json!({"spec": {
                "volumes": [{"name": "scratch", "hostPath": {"path": "/mnt/scratch", "type": "Directory"}}],
                "containers": [{"name": "{C}", "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]
            }}),
        ),
        (
            "env: change one, add two, one between",
            json!({"spec": {"containers": [{"name": "{C}", "env": [
                {"name": "NCCL_DEBUG", "value": "INFO"},
                {"name": "POD_NAME", "valueFrom": null, "value": "fixed"},
                {"name": "ZZ_LAST", "value": "1"}
            ]}]}}),
        ),
        (
            "a new sidecar container and an image pull secret",
            json!({"spec": {
                "containers": [{"name": "log-shipper", "image": "fluent/fluent-bit:3.2"}],
                "imagePullSecrets": [{"name": "registry"}]
            }}),
        ),
        (
            "placement: node selector, tolerations replaced, affinity",
            json!({"spec": {
                "nodeSelector": {"amd.com/gpu.product": "MI355X"},
                "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["a"]}]}]
                }}},
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"team": "llm"}}}]
            }}),
        ),
        (
            "$patch: delete a volume and a container's mount, null removes fields",
            json!({"spec": {
                "volumes": [{"name": "dshm", "$patch": "delete"}],
                "containers": [{"name": "{C}", "securityContext": null, "volumeMounts": [{"mountPath": "/dev/shm", "$patch": "delete"}]}],
                "terminationGracePeriodSeconds": null
            }}),
        ),
        (
            "$patch: replace a map and a list",
            json!({"spec": {"containers": [{"name": "{C}",
                "resources": {"$patch": "replace", "limits": {"memory": "64Gi"}, "requests": {"memory": "64Gi"}},
                "env": [{"$patch": "replace"}, {"name": "ONLY", "value": "this"}]
            }]}}),
        ),
        (
            "$retainKeys: a volume changes its source",
            json!({"spec": {"volumes": [{"name": "model", "$retainKeys": ["name", "emptyDir"], "emptyDir": {"sizeLimit": "1Gi"}}]}}),
        ),
        (
            "ports: a new one and a renamed one",
            json!({"spec": {"containers": [{"name": "{C}", "ports": [
                {"containerPort": 9999, "name": "debug"},
                {"containerPort": 8000, "name": "api"}
            ]}]}}),
        ),
        (
            "an init container's image",
            json!({"spec": {"initContainers": [{"name": "sidecar", "image": "registry.local/infera:dev"}]}}),
        ),
    ]
}

/// `patch` with `{C}` as the base's main container.
fn for_base(patch: &Value, container: &str) -> Value {
    serde_json::from_str(&patch.to_string().replace("{C}", container)).unwrap()
}

#[tokio::test]
async fn overrides_merge_as_the_api_server_merges_them() {
    let client = infera_testkit::kube_client().await.unwrap();
    let ns = support::namespace(&client).await;
    let api: Api<PodTemplate> = Api::namespaced(client.clone(), &ns);
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let dry_create = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut checked = 0;
    for (base_name, base) in bases() {
        let container = base.spec.as_ref().unwrap().containers[0].name.clone();
        let stored = PodTemplate {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("base-{base_name}")),
                ..Default::default()
            },
            template: Some(base.clone()),
        };
        api.create(&PostParams::default(), &stored).await.unwrap();
        for (what, patch) in patches() {
            let patch = for_base(&patch, &container);
            let label = format!("{base_name}: {what}");
            let server = api
                .patch(
                    &format!("base-{base_name}"),
                    &dry,
                    &Patch::Strategic(json!({"template": patch})),
                )
                .await
                .unwrap_or_else(|e| panic!("{label}: the API server refused: {e}"));
            let ours = apply_overrides(
                base.clone(),
                &[&PodOverride {
                    field: "spec.engine.podTemplate".into(),
                    patch: patch.clone(),
                }],
            )
            .unwrap_or_else(|e| panic!("{label}: {e}"));
            let ours = api
                .create(
                    &dry_create,
                    &PodTemplate {
                        metadata: kube::api::ObjectMeta {
                            name: Some(format!("ours-{base_name}")),
                            ..Default::default()
                        },
                        template: Some(ours),
                    },
                )
                .await
                .unwrap_or_else(|e| panic!("{label}: the API server refused our merge: {e}"));
            let (server, ours) = (
                serde_json::to_value(&server.template).unwrap(),
                serde_json::to_value(&ours.template).unwrap(),
            );
            assert_eq!(
                ours,
                server,
                "{label}: ours\n{}\nthe API server's\n{}",
                serde_json::to_string_pretty(&ours).unwrap(),
                serde_json::to_string_pretty(&server).unwrap()
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * patches().len());

    // What the server refuses, the operator refuses, saying where.
    let refused = [
        (
            json!({"spec": {"containers": [{"image": "x"}]}}),
            "spec.engine.podTemplate.spec.containers[0]: missing the merge key \"name\"",
        ),
        (
            json!({"spec": {"volumes": [{"$patch": "delete"}]}}),
            "spec.engine.podTemplate.spec.volumes[0]: $patch: delete needs the merge key \"name\"",
        ),
        (
            json!({"spec": {"volumes": [{"name": "dshm", "$retainKeys": ["name"], "emptyDir": {}}]}}),
            "spec.engine.podTemplate.spec.volumes[dshm]: $retainKeys must list every key the patch sets; it lacks \"emptyDir\"",
        ),
    ];
    let (_, base) = bases().remove(0);
    for (patch, message) in refused {
        let server = api
            .patch(
                "base-prefill",
                &dry,
                &Patch::Strategic(json!({"template": patch})),
            )
            .await;
        assert!(server.is_err(), "the API server took {patch}");
        let ours = apply_overrides(
            base.clone(),
            &[&PodOverride {
                field: "spec.engine.podTemplate".into(),
                patch,
            }],
        )
        .expect_err("refused");
        assert_eq!(ours.to_string(), message);
    }
    support::drop_namespace(&client, &ns).await;
}
