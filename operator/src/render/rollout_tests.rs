//! The rollout as rendered: one revision on every role's pods, and the window a role's
//! StatefulSet runs once its template changes.

use super::*;
use crate::api::{InferaDeployment, PDTopology};
use crate::plan::rollout::{LivePod, LiveWorkers};
use crate::plan::{Images, LiveEngines};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// A 1P1D deployment of simulated vLLM engines.
fn pd() -> (InferaDeployment, PDTopology) {
    let topology: PDTopology = serde_json::from_value(json!({
        "apiVersion": "infera.amd.com/v1alpha1", "kind": "PDTopology",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"layout": "1P1D", "transport": {"backend": "mooncake"}},
    }))
    .unwrap();
    let dep: InferaDeployment = serde_json::from_value(json!({
        "apiVersion": "infera.amd.com/v1alpha1", "kind": "InferaDeployment",
        "metadata": {"name": "d", "namespace": "ns", "uid": "uid-d"},
        "spec": {
            "model": {"name": "m", "source": {"hostPath": {"path": "/models/m"}}},
            "engine": {"kind": "sim", "simFlavor": "vllm"},
            "serving": {"mode": "disaggregated", "topologyRef": "t"},
        },
    }))
    .unwrap();
    (dep, topology)
}

fn build_over(
    dep: &InferaDeployment,
    topology: &PDTopology,
    engines: &BTreeMap<String, LiveEngines>,
) -> Rendered {
    render(
        dep,
        Observed {
            topology: Some(topology),
            model_ready: true,
            engines: Some(engines),
            ..Default::default()
        },
        &Platform::with_images(Images::from_registry("registry.example/infera", "test")),
    )
    .unwrap()
}

fn statefulset<'r>(r: &'r Rendered, name: &str) -> &'r Value {
    &r.children
        .iter()
        .find(|c| c.kind == Kind::StatefulSet && c.name == name)
        .unwrap()
        .object
}

/// The revision a role's pods carry: their label and the sidecar's environment.
fn pod_revision(sts: &Value) -> (String, String) {
    let template = &sts["spec"]["template"];
    let label = template["metadata"]["labels"]["infera.amd.com/engine-revision"]
        .as_str()
        .unwrap()
        .to_owned();
    let sidecar = template["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sidecar")
        .unwrap();
    let env = sidecar["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "INFERA_ENGINE_REVISION")
        .unwrap()["value"]
        .as_str()
        .unwrap()
        .to_owned();
    (label, env)
}

/// What observe reads of the StatefulSets `r` rendered, each with `replicas` ready pods
/// on its current template.
fn live(r: &Rendered) -> BTreeMap<String, LiveEngines> {
    r.children
        .iter()
        .filter(|c| c.kind == Kind::StatefulSet)
        .map(|c| {
            let annotations: BTreeMap<String, String> =
                serde_json::from_value(c.object["metadata"]["annotations"].clone()).unwrap();
            let spec =
                serde_json::from_value(c.object["spec"]["template"]["spec"].clone()).unwrap();
            let mut engines =
                crate::reconcile::observe::build_live_engines(Some(&annotations), Some(&spec));
            let replicas = c.object["spec"]["replicas"].as_i64().unwrap() as i32;
            engines.workers = Some(LiveWorkers {
                start: 0,
                replicas,
                pods: (0..replicas)
                    .map(|ordinal| LivePod {
                        ordinal,
                        revision: annotations.get("infera.amd.com/engine-revision").cloned(),
                        ready: true,
                        ..LivePod::default()
                    })
                    .collect(),
            });
            (c.name.clone(), engines)
        })
        .collect()
}

#[test]
fn every_role_carries_one_revision_that_any_engine_change_moves_and_a_scale_does_not() {
    let (dep, topology) = pd();
    let r = build_over(&dep, &topology, &BTreeMap::new());
    let prefill = pod_revision(statefulset(&r, "d-prefill"));
    let decode = pod_revision(statefulset(&r, "d-decode"));
    assert_eq!(prefill, (r.revision.clone(), r.revision.clone()));
    assert_eq!(decode, prefill, "one revision for the topology");
    assert_eq!(
        statefulset(&r, "d-decode")["metadata"]["annotations"]["infera.amd.com/engine-revision"],
        r.revision.as_str()
    );
    assert_eq!(r.revision.len(), 16);

    // A change to the decode role alone is a new revision of both roles.
    let mut changed = topology.clone();
    changed.spec.decode.args.push("--max-num-seqs=64".into());
    let after = build_over(&dep, &changed, &BTreeMap::new());
    assert_ne!(after.revision, r.revision);
    assert_eq!(
        pod_revision(statefulset(&after, "d-prefill")).0,
        after.revision
    );

    // More workers are the same revision.
    let mut scaled = dep.clone();
    scaled.spec.replicas = 3;
    assert_eq!(
        build_over(&scaled, &topology, &BTreeMap::new()).revision,
        r.revision
    );
}

#[test]
fn a_changed_template_surges_every_role_and_an_unchanged_one_stays_put() {
    let (dep, topology) = pd();
    let first = build_over(&dep, &topology, &BTreeMap::new());
    let engines = live(&first);
    // The same spec again: nothing moves.
    let again = build_over(&dep, &topology, &engines);
    for role in &again.roles {
        assert!(!role.progress.rolling, "{:?}", role.role);
        assert_eq!(role.rendered, 1);
    }
    assert_eq!(again.children, first.children);

    // An engine change: each role opens its window by one (a new pod beside the old
    // one), on an OnDelete StatefulSet that replaces nothing by itself.
    let mut changed = dep.clone();
    changed.spec.engine.args.push("--speedup=2".into());
    let rolled = build_over(&changed, &topology, &engines);
    for name in ["d-prefill", "d-decode"] {
        let sts = statefulset(&rolled, name);
        assert_eq!(sts["spec"]["replicas"], 2, "{name}");
        assert!(
            sts["spec"]["ordinals"].is_null(),
            "{name}: nothing removed yet"
        );
        assert_eq!(sts["spec"]["updateStrategy"], json!({"type": "OnDelete"}));
    }
    for role in &rolled.roles {
        assert!(role.progress.rolling);
        assert_eq!((role.progress.old, role.progress.updated), (1, 0));
    }
}
