//! The Helm chart as users install it: `helm lint --strict`, `helm template` with the
//! defaults and every `ci/*.yaml`, invalid values refused by `values.schema.json`, and
//! `helm install` into the real kube-apiserver from `testenv/` (objects accepted, CRDs
//! present). The chart's RBAC is exercised by the operator tests, which act as its
//! ServiceAccount (`support::operator_kubeconfig`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_json::Value;
use std::path::PathBuf;
use support::{helm, repo};

fn chart() -> String {
    repo().join("charts/infera").to_string_lossy().into_owned()
}

fn ci_values() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("charts/infera/ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn template(extra: &[&str]) -> Vec<Value> {
    let chart = chart();
    let mut args = vec![
        "template",
        "infera",
        chart.as_str(),
        "-n",
        "infera-system",
        "--kube-version",
        "1.33.0",
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm template {extra:?}: {err}");
    serde_saphyr::from_multiple::<Value>(&out)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn the_chart_lints_strictly_and_renders_with_every_values_file() {
    let (ok, out, err) = helm(&["lint", "--strict", &chart()]);
    assert!(ok, "helm lint --strict: {out}{err}");
    for file in ci_values() {
        let f = file.to_string_lossy().into_owned();
        let (ok, out, err) = helm(&["lint", "--strict", &chart(), "-f", &f]);
        assert!(ok, "helm lint --strict -f {f}: {out}{err}");
        let docs = template(&["-f", &f]);
        assert!(
            docs.iter().any(|d| d["kind"] == "Deployment"),
            "{f}: no operator Deployment"
        );
    }
    // Defaults: a hardened operator with leader election, and nothing optional.
    let docs = template(&[]);
    let op = find(&docs, "Deployment", "infera-operator");
    let pod = &op["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(
        c["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );
    assert_eq!(c["image"], "ghcr.io/infera/infera-operator:0.2.0");
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--leader-elect=true"), "{args:?}");
    assert!(
        c["livenessProbe"]["httpGet"]["path"] == "/healthz"
            && c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    );
    assert!(
        docs.iter().all(|d| d["kind"] != "StatefulSet"),
        "etcd and NATS are opt-in"
    );
    // The operator may manage every kind it renders (and prunes).
    let rules = find(&docs, "ClusterRole", "infera-operator")["rules"]
        .as_array()
        .unwrap()
        .clone();
    let rule_allows = |rules: &[Value], ar: &kube::core::ApiResource, verb: &str| {
        rules.iter().any(|r| {
            let has =
                |field: &str, want: &str| r[field].as_array().unwrap().iter().any(|v| v == want);
            has("apiGroups", &ar.group) && has("resources", &ar.plural) && has("verbs", verb)
        })
    };
    let secrets = infera_operator::render::Kind::Secret.api_resource();
    assert!(
        !["get", "list", "create"]
            .iter()
            .any(|verb| rule_allows(&rules, &secrets, verb)),
        "no Secrets without the chart's etcd on TLS"
    );
    // Secrets are only copied (the etcd client certificate): never read nor listed.
    for kind in infera_operator::render::Kind::ALL {
        if kind == infera_operator::render::Kind::Secret {
            continue;
        }
        let ar = kind.api_resource();
        let allowed = |verb: &str| rule_allows(&rules, &ar, verb);
        for verb in ["list", "create", "patch"] {
            assert!(
                allowed(verb),
                "{kind:?}: the operator may not {verb} {}",
                ar.plural
            );
        }
        if kind.pruned() {
            assert!(allowed("delete"), "{kind:?}: pruned but not deletable");
        }
    }
    // Bundled etcd and NATS become the deployments' default endpoints.
    let docs = template(&[
        "-f",
        &repo()
            .join("charts/infera/ci/bundled-etcd-nats.yaml")
            .to_string_lossy(),
    ]);
    let etcd = find(&docs, "StatefulSet", "infera-etcd");
    assert_eq!(etcd["spec"]["replicas"], 3);
    assert!(etcd["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].is_array());
    assert_eq!(
        etcd["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
        "4Gi"
    );
    let args = find(&docs, "Deployment", "infera-operator")["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--default-etcd-endpoints=https://infera-etcd-0.infera-etcd-peers.infera-system.svc:2379,"), "{args}");
    assert!(
        args.contains("--default-etcd-client-secret=infera-system/infera-etcd-client-tls"),
        "{args}"
    );
    // etcd on TLS by default, asking clients and peers for certificates of one CA.
    let etcd_args = etcd["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    for flag in [
        "--client-cert-auth",
        "--peer-client-cert-auth",
        "--listen-client-urls=https://",
    ] {
        assert!(etcd_args.contains(flag), "{flag}: {etcd_args}");
    }
    let server = &find(&docs, "Secret", "infera-etcd-server-tls")["data"];
    let client = &find(&docs, "Secret", "infera-etcd-client-tls")["data"];
    assert_eq!(server["ca.crt"], client["ca.crt"], "one CA");
    assert_ne!(server["tls.crt"], client["tls.crt"]);
    let rules = find(&docs, "ClusterRole", "infera-operator")["rules"]
        .as_array()
        .unwrap()
        .clone();
    assert!(rule_allows(&rules, &secrets, "create") && rule_allows(&rules, &secrets, "patch"));
    assert!(
        !["get", "list", "watch"]
            .iter()
            .any(|verb| rule_allows(&rules, &secrets, verb)),
        "the operator reads no Secret cluster-wide: {rules:?}"
    );
    let election = find(&docs, "Role", "infera-operator-leader-election")["rules"].to_string();
    assert!(
        election.contains("\"resourceNames\":[\"infera-etcd-client-tls\"]"),
        "it reads the one client certificate: {election}"
    );
    assert!(
        args.contains("--default-nats-url=nats://infera-nats.infera-system.svc:4222"),
        "{args}"
    );
    for name in ["infera-etcd", "infera-nats", "infera-gateways"] {
        assert!(
            docs.iter()
                .any(|d| d["kind"] == "NetworkPolicy" && d["metadata"]["name"] == name),
            "NetworkPolicy {name}"
        );
    }
    // One namespace: a Role there, not a ClusterRole.
    let docs = template(&[
        "-f",
        &repo()
            .join("charts/infera/ci/single-namespace.yaml")
            .to_string_lossy(),
    ]);
    assert!(docs.iter().all(|d| d["kind"] != "ClusterRole"));
    assert_eq!(
        find(&docs, "Role", "infera-operator")["metadata"]["namespace"],
        "inference"
    );
    // Monitoring: a ServiceMonitor, a PodMonitor, and the dashboard as valid JSON.
    let docs = template(&[
        "-f",
        &repo()
            .join("charts/infera/ci/monitoring.yaml")
            .to_string_lossy(),
    ]);
    let engines = find(&docs, "PodMonitor", "infera-engines");
    let ports: Vec<&str> = engines["spec"]["podMetricsEndpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["port"].as_str())
        .collect();
    assert_eq!(ports, ["http", "sidecar", "kvd-metrics", "frontend"]);
    let plain = find(&docs, "ServiceMonitor", "infera");
    assert!(
        plain["spec"]["selector"]
            .to_string()
            .contains(r#"{"key":"infera.amd.com/metrics-access","operator":"DoesNotExist"}"#),
        "{plain}"
    );
    // The endpoint pickers' Services (component picker) with the gateways'.
    assert!(
        plain["spec"]["selector"]
            .to_string()
            .contains(r#""values":["operator","gateway","picker"]"#),
        "{plain}"
    );
    let secured = &find(&docs, "ServiceMonitor", "infera-secured-gateways")["spec"];
    assert_eq!(secured["endpoints"][0]["scheme"], "https");
    assert_eq!(
        secured["endpoints"][0]["authorization"]["credentials"]["name"],
        "metrics-key"
    );
    let dashboard = find(&docs, "ConfigMap", "infera-dashboard")["data"]["infera.json"]
        .as_str()
        .unwrap()
        .to_owned();
    let dashboard: Value = serde_json::from_str(&dashboard).unwrap();
    assert!(dashboard["panels"].as_array().unwrap().len() >= 10);
}

/// The chart's alerting rules (`metrics.prometheusRule`) as Prometheus evaluates them:
/// `promtool check rules` on the rendered groups, then `promtool test rules` with
/// `tests/testdata/alerts_test.yaml` (each alert firing with its labels and texts, and
/// not firing where it must not), and every alert of the chart tested there.
#[test]
fn the_alerting_rules_fire_as_their_tests_say() {
    let docs = template(&[
        "-f",
        &repo()
            .join("charts/infera/ci/monitoring.yaml")
            .to_string_lossy(),
    ]);
    let rule = find(&docs, "PrometheusRule", "infera");
    let groups = &rule["spec"]["groups"];
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_json::to_string_pretty(&serde_json::json!({ "groups": groups })).unwrap(),
    )
    .unwrap();
    let tests = repo().join("operator/tests/testdata/alerts_test.yaml");
    std::fs::copy(&tests, dir.path().join("alerts_test.yaml")).unwrap();
    let promtool =
        infera_testkit::binaries::locate(infera_testkit::binaries::Binary::Promtool).unwrap();
    for args in [
        ["check", "rules", "rules.yaml"],
        ["test", "rules", "alerts_test.yaml"],
    ] {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let cases: Value = serde_saphyr::from_str(&std::fs::read_to_string(&tests).unwrap()).unwrap();
    let firing: Vec<&str> = cases["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .filter(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .filter_map(|c| c["alertname"].as_str())
        .collect();
    let alerts: Vec<&str> = groups
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    for alert in alerts {
        assert!(
            firing.contains(&alert),
            "{alert} has no case in {} where it fires",
            tests.display()
        );
    }
}

#[test]
fn bad_values_are_refused_with_the_field_named() {
    let cases: [(&str, &str); 6] = [
        (
            "etcd.enabled=true,etcd.tls.serverSecretName=mine",
            "name both serverSecretName and clientSecretName",
        ),
        ("etcd.replicas=2", "/etcd/replicas"),
        ("operator.logFormat=xml", "/operator/logFormat"),
        ("operator.replicas=0", "/operator/replicas"),
        ("image.registry=", "/image/registry"),
        (
            "nats.jetstream.storageSize=lots",
            "/nats/jetstream/storageSize",
        ),
    ];
    let chart = chart();
    for (set, field) in cases {
        let (ok, _, err) = helm(&[
            "template",
            "infera",
            &chart,
            "--kube-version",
            "1.33.0",
            "--set",
            set,
        ]);
        assert!(!ok, "--set {set} was accepted");
        assert!(err.contains(field), "--set {set}: {err}");
    }
    let (ok, _, err) = helm(&[
        "template",
        "infera",
        &chart,
        "--kube-version",
        "1.33.0",
        "--set",
        "operatr.replicas=1",
    ]);
    assert!(
        !ok && err.contains("operatr"),
        "a misspelt key is refused: {err}"
    );
}

#[tokio::test]
async fn helm_install_is_accepted_by_the_api_server() {
    let client = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    let ns = infera_testkit::unique_name("helm");
    let release = format!("infera-{}", std::process::id());
    let kc = kubeconfig.to_string_lossy().into_owned();
    let chart = chart();
    let (ok, out, err) = helm(&[
        "install",
        &release,
        &chart,
        "--kubeconfig",
        &kc,
        "-n",
        &ns,
        "--create-namespace",
        "--set",
        "etcd.enabled=true",
        "--set",
        "nats.enabled=true",
        "--set",
        "networkPolicy.enabled=true",
    ]);
    assert!(ok, "helm install: {out}{err}");
    assert!(out.contains("Next: serve a model"), "NOTES.txt: {out}");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in [
        "inferadeployments.infera.amd.com",
        "pdtopologies.infera.amd.com",
    ] {
        assert!(crds.get_opt(name).await.unwrap().is_some(), "CRD {name}");
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    assert!(
        deployments
            .get_opt(&format!("{release}-operator"))
            .await
            .unwrap()
            .is_some()
    );
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    assert_eq!(
        sets.get(&format!("{release}-etcd"))
            .await
            .unwrap()
            .spec
            .unwrap()
            .replicas,
        Some(3)
    );
    assert!(
        sets.get_opt(&format!("{release}-nats"))
            .await
            .unwrap()
            .is_some()
    );
    // etcd's generated certificates, kept by the upgrade below.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
    let client_tls = format!("{release}-etcd-client-tls");
    let issued = secrets.get(&client_tls).await.unwrap().data.unwrap();
    assert!(issued.contains_key("tls.key"));
    // The documented upgrade path: CRDs first (Helm never upgrades them), then the release.
    let upgrade = std::process::Command::new(repo().join("scripts/upgrade-crds"))
        .args(["--kubeconfig", &kc])
        .env("KUBECTL", support::kubectl_bin())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&upgrade.stderr);
    assert!(upgrade.status.success(), "scripts/upgrade-crds: {said}");
    assert!(said.contains("CRDs are current"), "{said}");
    let upgrade = |extra: &[&str]| {
        let mut args = vec![
            "upgrade",
            &release,
            &chart,
            "--kubeconfig",
            &kc,
            "-n",
            &ns,
            "--reuse-values",
        ];
        args.extend_from_slice(extra);
        helm(&args)
    };
    let (ok, out, err) = upgrade(&[]);
    assert!(ok, "helm upgrade: {out}{err}");
    let certificate = secrets.get(&client_tls).await.unwrap().data.unwrap();
    assert_eq!(
        certificate, issued,
        "the generated etcd certificates survive an upgrade"
    );
    // A plain etcd's members keep http:// peer URLs: turning TLS on in place is refused
    // with the way out, instead of members that never rejoin.
    for (tls, refused) in [("false", false), ("true", true)] {
        let (ok, out, err) = upgrade(&["--set", &format!("etcd.tls.enabled={tls}")]);
        assert_eq!(ok, !refused, "etcd.tls.enabled={tls}: {out}{err}");
        if refused {
            assert!(err.contains("keep their http:// peer URLs"), "{err}");
        }
    }
    let (ok, out, err) = helm(&["uninstall", &release, "--kubeconfig", &kc, "-n", &ns]);
    assert!(ok, "helm uninstall: {out}{err}");
    assert!(
        crds.get_opt("inferadeployments.infera.amd.com")
            .await
            .unwrap()
            .is_some(),
        "uninstall keeps the CRDs"
    );
    support::drop_namespace(&client, &ns).await;
}
