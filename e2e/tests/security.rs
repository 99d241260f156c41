//! A deployment locked down as a security-minded platform team runs it: a namespace that
//! enforces Pod Security "restricted", clients' API keys and the gateway's certificate
//! from Secrets (rotated while serving), and each ServiceAccount allowed only what its
//! pods do. Observed on the real node: the API server's own admission and RBAC decide.
//!
//! Run by `scripts/test` in its cluster stage, one test at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::deploy::ROLLOUT;
use infera_e2e::gateway::Gateway;
use infera_e2e::{Cluster, eventually};
use serde_json::json;
use std::time::Duration;

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}-weights}}
spec:
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 1Mi}}}}
---
apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  model: {{name: {name}-model, source: {{pvc: {{claimName: {name}-weights}}}}}}
  engine: {{kind: sim, simFlavor: vllm}}
  gateway:
    resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}
    service: {{type: NodePort}}
    apiKeysSecretRef: {{name: {name}-clients, key: keys}}
    metricsRequireAuth: true
    tls: {{secretName: {name}-cert}}
"
    )
}

/// A client trusting `cert`, sending `key` as a bearer token when given.
fn client(cert_pem: &[u8], key: Option<&str>) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = key {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {key}").parse().unwrap(),
        );
    }
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cert_pem).unwrap())
        .tls_built_in_root_certs(false)
        .default_headers(headers)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_restricted_namespace_serves_https_with_rotated_keys_and_least_privilege() {
    let cluster = Cluster::connect().await.unwrap();
    let ns_guard = cluster.namespace("e2e-secure").await.unwrap();
    let ns = ns_guard.name.clone();
    let name = "secure";
    cluster
        .kubectl(&[
            "label",
            "namespace",
            &ns,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        ])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // For the gateway as a client on this machine reaches it: 127.0.0.1, the NodePort.
    let (cert, key) = infera_testkit::certs::self_signed(dir.path(), "gateway").unwrap();
    let (cert, key) = (
        cert.to_string_lossy().into_owned(),
        key.to_string_lossy().into_owned(),
    );
    let cert_pem = std::fs::read(&cert).unwrap();
    let secret = format!("{name}-cert");
    let cert_arg = format!("--cert={cert}");
    let key_arg = format!("--key={key}");
    cluster
        .kubectl(&[
            "create", "secret", "tls", &secret, &cert_arg, &key_arg, "-n", &ns,
        ])
        .await
        .unwrap();
    let clients = format!("{name}-clients");
    cluster
        .kubectl(&[
            "create",
            "secret",
            "generic",
            &clients,
            "--from-literal=keys=# team a\nkey-before-rotation\n",
            "-n",
            &ns,
        ])
        .await
        .unwrap();
    cluster.apply(&ns, &manifest(name)).await.unwrap();
    // Ready means the pods were admitted under "restricted" and their probes passed
    // over HTTPS.
    let idep = cluster.wait_ready(&ns, name).await.unwrap();
    assert!(
        idep["status"]["gatewayEndpoint"]
            .as_str()
            .unwrap()
            .starts_with("https://"),
        "{}",
        idep["status"]
    );
    let svc = cluster
        .get_json(&["get", "service", &format!("{name}-gateway"), "-n", &ns])
        .await
        .unwrap();
    let port = svc["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
    let base = format!("https://127.0.0.1:{port}");
    let keyed = Gateway::with_client(base.clone(), client(&cert_pem, Some("key-before-rotation")));
    cluster.wait_active_workers(&ns, &keyed, 1).await.unwrap();

    let chat = json!({"model": format!("{name}-model"), "max_tokens": 4,
                      "messages": [{"role": "user", "content": "over TLS"}]});
    let anonymous = Gateway::with_client(base.clone(), client(&cert_pem, None));
    let (status, body) = anonymous.send("/v1/chat/completions", &chat).await.unwrap();
    assert_eq!(status, 401, "{body}");
    let (status, _) = anonymous.get("/metrics").await.unwrap();
    assert_eq!(status, 401, "/metrics requires a key (metricsRequireAuth)");
    let (status, body) = keyed.send("/v1/chat/completions", &chat).await.unwrap();
    assert_eq!(status, 200, "{body}");
    // Plain HTTP on the same port is not served.
    let plain = infera_e2e::http()
        .get(format!("http://127.0.0.1:{port}/health"))
        .send()
        .await;
    assert!(
        plain.as_ref().map_or(true, |r| r.status() != 200),
        "plain HTTP answered: {plain:?}"
    );

    // Rotation: the Secret changes, the gateways are not restarted, the new key works
    // and the old one stops working once the kubelet has synced the volume.
    let gateway_pods = |cluster: &Cluster| {
        let ns = ns.clone();
        let cluster = cluster.clone();
        async move {
            cluster
                .pods(
                    &ns,
                    &format!(
                        "infera.amd.com/deployment={name},app.kubernetes.io/component=gateway"
                    ),
                )
                .await
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p["metadata"]["name"].as_str().unwrap().to_owned(),
                        p["status"]["containerStatuses"][0]["restartCount"]
                            .as_i64()
                            .unwrap_or(-1),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    let before = gateway_pods(&cluster).await;
    let rotated = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {clients}}}\nstringData: {{keys: \"key-after-rotation\\n\"}}\n"
    );
    cluster.apply(&ns, &rotated).await.unwrap();
    let started = std::time::Instant::now();
    let renewed = Gateway::with_client(base.clone(), client(&cert_pem, Some("key-after-rotation")));
    eventually(
        &cluster,
        &ns,
        "the rotated key accepted, the old refused",
        ROLLOUT,
        || async {
            let (new, _) = renewed
                .send("/v1/chat/completions", &chat)
                .await
                .map_err(|e| e.to_string())?;
            let (old, _) = keyed
                .send("/v1/chat/completions", &chat)
                .await
                .map_err(|e| e.to_string())?;
            if (new, old) == (200, 401) {
                Ok(())
            } else {
                Err(format!("new key {new}, old key {old}"))
            }
        },
    )
    .await
    .unwrap();
    println!(
        "keys rotated in the Secret: served {:.0?} later",
        started.elapsed()
    );
    assert_eq!(
        gateway_pods(&cluster).await,
        before,
        "no gateway restarted or replaced"
    );

    // Least privilege, as the API server decides it.
    let can = |account: String, verb: &'static str| {
        let cluster = cluster.clone();
        let ns = ns.clone();
        async move {
            let review = json!({
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": format!("system:serviceaccount:{ns}:{account}"),
                    "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}")],
                    "resourceAttributes": {"namespace": ns, "verb": verb, "resource": "pods"},
                },
            });
            let out = cluster
                .kubectl_with_input(
                    &["create", "-f", "-", "-o", "json"],
                    Some(&review.to_string()),
                )
                .await
                .unwrap();
            let decided: serde_json::Value = serde_json::from_str(&out).unwrap();
            decided["status"]["allowed"] == true
        }
    };
    let (engine_sa, gateway_sa) = (format!("{name}-infera"), format!("{name}-gateway"));
    assert!(
        !can(gateway_sa.clone(), "patch").await,
        "gateways only read pods"
    );
    assert!(can(gateway_sa.clone(), "watch").await);
    assert!(
        can(engine_sa.clone(), "patch").await,
        "sidecars patch their annotation"
    );
    assert!(!can(engine_sa.clone(), "list").await);
    assert!(!can(engine_sa, "delete").await);

    // The engines' NetworkPolicy, as the API server stores it, selects exactly the
    // engine pods and admits the gateway's. (This node's bridge network does not
    // enforce NetworkPolicies; Calico or Cilium do.)
    let policy = cluster
        .get_json(&[
            "get",
            "networkpolicy",
            &format!("{name}-engines"),
            "-n",
            &ns,
        ])
        .await
        .unwrap();
    let selector = |labels: &serde_json::Value| {
        labels
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
            .collect::<Vec<_>>()
            .join(",")
    };
    let pod_names = |pods: Vec<serde_json::Value>| {
        let mut names: Vec<String> = pods
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    };
    let guarded = pod_names(
        cluster
            .pods(
                &ns,
                &selector(&policy["spec"]["podSelector"]["matchLabels"]),
            )
            .await
            .unwrap(),
    );
    let engines = pod_names(
        cluster
            .pods(
                &ns,
                &format!("infera.amd.com/deployment={name},app.kubernetes.io/component=engine"),
            )
            .await
            .unwrap(),
    );
    assert_eq!(guarded, engines);
    assert_eq!(engines.len(), 1);
    let admitted = pod_names(
        cluster
            .pods(
                &ns,
                &selector(&policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]),
            )
            .await
            .unwrap(),
    );
    for pod in before.iter().map(|(p, _)| p) {
        assert!(
            admitted.contains(pod),
            "gateway {pod} not admitted: {admitted:?}"
        );
    }
    let foreign = cluster.foreign_status_writers(&ns).await.unwrap();
    assert!(foreign.is_empty(), "{foreign:?}");
}
