use super::*;
use crate::reconcile::pod_problems::{PodProblem, PodProblemKind};
use k8s_openapi::jiff::Timestamp;

fn t(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).unwrap())
}

fn role(role: Role, desired: i32, current: i32, ready: i32, per_unit: u32) -> RoleObservation {
    RoleObservation {
        role,
        desired,
        current,
        ready,
        per_unit,
        platform: PlatformVersion::CURRENT,
        progress: RoleProgress {
            desired,
            updated: current,
            ready,
            ..RoleProgress::default()
        },
    }
}

fn obs(roles: Vec<RoleObservation>, gateway: (i32, i32)) -> Observation {
    Observation {
        generation: Some(3),
        roles: Some(roles),
        gateway,
        model: ModelState::NotNeeded,
        problem: None,
        selector: "infera.amd.com/deployment=d,app.kubernetes.io/component=engine".into(),
        endpoint: Some("http://d-gateway.ns:8000".into()),
        pod_problems: Vec::new(),
        tokenizer: None,
        autoscaled: false,
        revision: Some("5f1c2a9e0b7d4c31".into()),
        inference_pool: None,
        missing_crds: Vec::new(),
    }
}

fn cond<'a>(s: &'a InferaDeploymentStatus, type_: &str) -> &'a Condition {
    s.conditions.iter().find(|c| c.type_ == type_).unwrap()
}

#[test]
fn workers_coming_up_are_progressing_then_ready() {
    let starting = obs(
        vec![
            role(Role::Prefill, 4, 4, 1, 2),
            role(Role::Decode, 2, 2, 0, 1),
        ],
        (1, 0),
    );
    let s = compute_status(None, &starting, &t(100));
    assert_eq!(cond(&s, "Ready").status, "False");
    assert_eq!(cond(&s, "Ready").reason, "WorkersNotReady");
    assert_eq!(
        cond(&s, "Ready").message,
        "prefill 1/4 ready, decode 0/2 ready"
    );
    assert_eq!(cond(&s, "Progressing").status, "True");
    assert_eq!(cond(&s, "Degraded").status, "False");
    assert_eq!(
        (s.replicas, s.ready_replicas),
        (2, 0),
        "units: 4/2 prefill and 2/1 decode exist"
    );
    assert_eq!(s.observed_generation, Some(3));
    let ready = obs(
        vec![
            role(Role::Prefill, 4, 4, 4, 2),
            role(Role::Decode, 2, 2, 2, 1),
        ],
        (1, 1),
    );
    let s2 = compute_status(Some(&s), &ready, &t(200));
    assert_eq!(cond(&s2, "Ready").status, "True");
    assert_eq!(cond(&s2, "Ready").last_transition_time, t(200));
    assert_eq!(cond(&s2, "Progressing").reason, "Complete");
    assert_eq!(
        cond(&s2, "Degraded").last_transition_time,
        t(100),
        "unchanged conditions keep their time"
    );
    assert_eq!((s2.replicas, s2.ready_replicas), (2, 2));
    // Nothing changed: the same status, so nothing is written.
    assert_eq!(compute_status(Some(&s2), &ready, &t(300)), s2);
}

#[test]
fn a_build_failure_is_degraded_and_keeps_the_last_counts() {
    let ready = obs(vec![role(Role::Mixed, 2, 2, 2, 1)], (1, 1));
    let s = compute_status(None, &ready, &t(100));
    let mut broken = ready.clone();
    broken.roles = None;
    broken.problem = Some((
        "TopologyNotFound".into(),
        "PDTopology \"x\" does not exist".into(),
    ));
    let s2 = compute_status(Some(&s), &broken, &t(200));
    assert_eq!(cond(&s2, "Degraded").status, "True");
    assert_eq!(cond(&s2, "Degraded").reason, "TopologyNotFound");
    assert_eq!(cond(&s2, "Progressing").status, "False");
    assert_eq!(
        cond(&s2, "Ready").status,
        "True",
        "the running fleet still serves"
    );
    assert_eq!((s2.replicas, s2.ready_replicas), (2, 2));
}

#[test]
fn a_download_holds_workers_and_a_failed_one_is_degraded() {
    let mut o = obs(vec![role(Role::Mixed, 2, 0, 0, 1)], (1, 1));
    o.model = ModelState::Downloading;
    let s = compute_status(None, &o, &t(1));
    assert_eq!(cond(&s, "Ready").reason, "ModelDownloading");
    assert_eq!(cond(&s, "Progressing").reason, "ModelDownloading");
    o.model = ModelState::Failed("BackoffLimitExceeded".into());
    let s = compute_status(Some(&s), &o, &t(2));
    assert_eq!(cond(&s, "Degraded").reason, "ModelDownloadFailed");
}

fn problem(pod: &str, component: &str, kind: PodProblemKind, message: &str) -> PodProblem {
    PodProblem {
        pod: pod.into(),
        component: component.into(),
        kind,
        message: message.into(),
    }
}

#[test]
fn a_pod_problem_is_the_reason_workers_or_gateways_are_not_ready() {
    let mut o = obs(vec![role(Role::Mixed, 2, 2, 1, 1)], (1, 1));
    o.pod_problems = vec![
        problem(
            "d-mixed-1",
            "engine",
            PodProblemKind::Unschedulable,
            "0/1 nodes are available: 1 Insufficient amd.com/gpu.",
        ),
        problem(
            "d-gateway-x",
            "gateway",
            PodProblemKind::ImagePullBackOff,
            "x",
        ),
    ];
    let s = compute_status(None, &o, &t(1));
    let ready = cond(&s, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Unschedulable")
    );
    assert_eq!(
        ready.message,
        "mixed 1/2 ready; pod d-mixed-1: 0/1 nodes are available: 1 Insufficient amd.com/gpu."
    );

    // Workers ready, gateway stuck: the gateway pod's reason.
    let mut o = obs(vec![role(Role::Mixed, 1, 1, 1, 1)], (1, 0));
    o.pod_problems = vec![problem(
        "d-gateway-x",
        "gateway",
        PodProblemKind::ImagePullBackOff,
        "container gateway ImagePullBackOff",
    )];
    let ready = cond(&compute_status(None, &o, &t(1)), "Ready").clone();
    assert_eq!(ready.reason, "ImagePullBackOff");
    assert_eq!(
        ready.message,
        "0 of 1 gateway pods ready; pod d-gateway-x: container gateway ImagePullBackOff"
    );

    // A download pod that cannot start says why instead of "downloading".
    let mut o = obs(vec![role(Role::Mixed, 1, 0, 0, 1)], (1, 1));
    o.model = ModelState::Downloading;
    o.pod_problems = vec![problem(
        "d-model-download-abc",
        "model-download",
        PodProblemKind::ImagePullBackOff,
        "container download ImagePullBackOff",
    )];
    let ready = cond(&compute_status(None, &o, &t(1)), "Ready").clone();
    assert_eq!(ready.reason, "ImagePullBackOff");
    assert!(
        ready
            .message
            .starts_with("the model download Job cannot run; pod d-model-download-abc")
    );

    // Nothing stated by any pod: the counts.
    let o = obs(vec![role(Role::Mixed, 2, 2, 1, 1)], (1, 1));
    assert_eq!(
        cond(&compute_status(None, &o, &t(1)), "Ready").reason,
        "WorkersNotReady"
    );
}

#[test]
fn the_gateways_tokenizer_is_a_condition_of_its_own() {
    let all_ready = vec![role(Role::Mixed, 2, 2, 2, 1)];
    let s = compute_status(None, &obs(all_ready.clone(), (1, 1)), &t(100));
    assert!(
        !s.conditions.iter().any(|c| c.type_ == "TokenizerLoaded"),
        "none without a tokenizer from the workers"
    );
    let mut failing = obs(all_ready.clone(), (1, 1));
    failing.tokenizer = Some(GatewayTokenizer::Failed {
        worker: "10.0.0.5:8000".into(),
        error: "loading the tokenizer: expected value at line 1".into(),
    });
    let s = compute_status(None, &failing, &t(100));
    let c = cond(&s, "TokenizerLoaded");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "TokenizerUnloadable")
    );
    assert!(
        c.message.contains("expected value at line 1"),
        "{}",
        c.message
    );
    assert_eq!(
        cond(&s, "Ready").status,
        "True",
        "the gateways serve, routing by load"
    );
    let mut loaded = obs(all_ready, (1, 1));
    loaded.tokenizer = Some(GatewayTokenizer::Loaded {
        worker: "10.0.0.5:8000".into(),
        digest: "0123456789abcdef".into(),
    });
    let s2 = compute_status(Some(&s), &loaded, &t(200));
    let c = cond(&s2, "TokenizerLoaded");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Loaded"));
    assert_eq!(c.last_transition_time, t(200));
}

#[test]
fn the_autoscaling_condition_follows_what_the_autoscaler_wrote() {
    let roles = vec![role(Role::Mixed, 2, 2, 2, 1)];
    let mut o = obs(roles, (1, 1));
    let s = compute_status(None, &o, &t(100));
    assert!(s.conditions.iter().all(|c| c.type_ != "Autoscaling"));
    o.autoscaled = true;
    let s = compute_status(None, &o, &t(100));
    let c = cond(&s, "Autoscaling");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Pending"));
    let mut written = s.clone();
    written.autoscaling = Some(crate::api::AutoscalingStatus {
        state: "StoodDown".into(),
        message: "HorizontalPodAutoscaler h targets this deployment's /scale".into(),
        ..Default::default()
    });
    let s = compute_status(Some(&written), &o, &t(200));
    let c = cond(&s, "Autoscaling");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "StoodDown")
    );
    assert!(
        c.message.contains("HorizontalPodAutoscaler h"),
        "{}",
        c.message
    );
    // The autoscaler's field is carried, so an unchanged status compares equal.
    assert_eq!(s.autoscaling, written.autoscaling);
    let again = compute_status(Some(&s), &o, &t(300));
    assert_eq!(again, s);
}

fn rolling(
    mut r: RoleObservation,
    old: i32,
    updated: i32,
    blocked: Option<&str>,
) -> RoleObservation {
    r.progress = RoleProgress {
        desired: r.desired,
        updated,
        old,
        ready: r.ready,
        blocked: blocked.map(str::to_owned),
        rolling: old > 0,
    };
    r
}

#[test]
fn a_rollout_with_its_surge_stays_ready_and_says_where_it_stands() {
    // 1P1D mid-rollout: each role runs its old worker and a surge pod, all ready.
    let roles = vec![
        rolling(role(Role::Prefill, 1, 2, 2, 1), 1, 1, None),
        rolling(role(Role::Decode, 1, 2, 2, 1), 1, 1, None),
    ];
    let s = compute_status(None, &obs(roles, (1, 1)), &t(10));
    assert_eq!(cond(&s, "Ready").status, "True", "{:?}", s.conditions);
    assert_eq!(
        (s.replicas, s.ready_replicas),
        (1, 1),
        "surge pods are not units"
    );
    let progressing = cond(&s, "Progressing");
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("True", "RollingOut")
    );
    assert_eq!(
        progressing.message,
        "rolling to revision 5f1c2a9e0b7d4c31: prefill 1 old, 1 new of 1 (2 ready); decode 1 old, 1 new of 1 (2 ready)"
    );
    let rollout = s.rollout.clone().unwrap();
    assert_eq!(rollout.revision, "5f1c2a9e0b7d4c31");
    assert_eq!(rollout.roles[1].old, 1);
    assert_eq!(cond(&s, "RolloutBlocked").status, "False");
    assert_eq!(s.revision.as_deref(), Some("5f1c2a9e0b7d4c31"));

    // A surge pod that cannot be scheduled: blocked, with the scheduler's words.
    let why = "0/1 nodes are available: 1 Insufficient amd.com/gpu.";
    let roles = vec![
        rolling(role(Role::Prefill, 1, 2, 1, 1), 1, 1, Some(why)),
        rolling(role(Role::Decode, 1, 2, 2, 1), 1, 1, None),
    ];
    let s = compute_status(Some(&s), &obs(roles, (1, 1)), &t(20));
    let blocked = cond(&s, "RolloutBlocked");
    assert_eq!(
        (blocked.status.as_str(), blocked.reason.as_str()),
        ("True", "Unschedulable")
    );
    assert_eq!(
        blocked.message,
        format!("a new prefill worker cannot start: {why}")
    );
    assert_eq!(cond(&s, "Ready").status, "True", "the old workers serve");

    // Done: no rollout, the condition says so.
    let roles = vec![
        role(Role::Prefill, 1, 1, 1, 1),
        role(Role::Decode, 1, 1, 1, 1),
    ];
    let s = compute_status(Some(&s), &obs(roles, (1, 1)), &t(30));
    assert!(s.rollout.is_none());
    let blocked = cond(&s, "RolloutBlocked");
    assert_eq!(
        (blocked.status.as_str(), blocked.reason.as_str()),
        ("False", "RolloutComplete")
    );
    assert_eq!(cond(&s, "Progressing").reason, "Complete");
}

#[test]
fn a_deployment_that_never_rolled_has_no_rollout_condition() {
    let s = compute_status(
        None,
        &obs(vec![role(Role::Mixed, 2, 2, 2, 1)], (1, 1)),
        &t(1),
    );
    assert!(s.conditions.iter().all(|c| c.type_ != "RolloutBlocked"));
    assert!(s.rollout.is_none());
}
