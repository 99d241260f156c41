//! Deployments behind a Gateway API inference gateway on the node: the operator renders
//! the InferencePool and its endpoint picker (`spec.gateway.inferencePool`), and an Envoy
//! pod configured as GAIE's Envoy-based gateways configure it (`testenv/envoy/node.yaml`,
//! from the pool's own fields) carries the traffic. No Gateway controller runs here, so
//! nothing writes the HTTPRoute's status: the route's Gateway is reported not found, and
//! the accepted path is tested on the bare API server (operator/tests).
//!
//! Run by `scripts/test` in its cluster stage, one test at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::deploy::{ROLLOUT, condition};
use infera_e2e::envoy::{EnvoyGateway, EnvoyOptions};
use infera_e2e::gateway::{Gateway, parse_sse};
use infera_e2e::load::Load;
use infera_e2e::{Cluster, eventually, repo};
use serde_json::{Value, json};
use std::collections::BTreeMap;

const MODEL: &str = "sim-llama-8b-pool";

/// Mixed workers in a pool, two pickers, small requests (the node has 2 CPUs), the
/// Envoy pods admitted by the engines' NetworkPolicy as the guide says.
fn mixed_manifest(name: &str) -> String {
    format!(
        "apiVersion: infera.amd.com/v1alpha1
kind: InferaDeployment
metadata: {{name: {name}}}
spec:
  replicas: 2
  model: {{name: {MODEL}, source: {{hostPath: {{path: /models/none}}}}}}
  engine: {{kind: sim, simFlavor: vllm}}
  network:
    networkPolicy:
      allowFrom: [{{podSelector: {{matchLabels: {{app.kubernetes.io/name: envoy}}}}}}]
  gateway:
    replicas: 1
    resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}
    inferencePool:
      pickerReplicas: 2
      failureMode: FailClose
      gatewayRef: {{name: inference-gateway}}
      resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}
"
    )
}

fn chat(content: &str, stream: bool) -> Value {
    json!({"model": MODEL, "max_tokens": 4, "stream": stream,
           "messages": [{"role": "user", "content": content}]})
}

/// The long shared system prompt of the prefix test.
fn with_system(question: &str) -> Value {
    let system = "You are the reference librarian of a very large technical archive. ".repeat(24);
    json!({"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]})
}

/// Picks per worker, summed over the pickers.
async fn picks(pickers: &[(String, Gateway)]) -> BTreeMap<String, u64> {
    let mut total = BTreeMap::new();
    for (_, p) in pickers {
        for (worker, n) in p.picks().await.unwrap() {
            *total.entry(worker).or_insert(0) += n;
        }
    }
    total
}

fn grew(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> Vec<String> {
    after
        .iter()
        .filter(|(k, n)| before.get(*k).copied().unwrap_or(0) < **n)
        .map(|(k, _)| k.clone())
        .collect()
}

async fn status_pool(cluster: &Cluster, ns: &str, name: &str) -> Value {
    cluster
        .get_json(&["get", "idep", name, "-n", ns])
        .await
        .unwrap()
}

#[tokio::test]
async fn mixed_workers_serve_through_envoy_and_the_operators_inference_pool() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-pool").await.unwrap();
    let ns = ns.name.as_str();
    let name = "pool";
    cluster.apply(ns, &mixed_manifest(name)).await.unwrap();
    cluster.wait_ready(ns, name).await.unwrap();

    // Pickers ready; the route names a Gateway nobody made: reported, nothing else lost.
    let idep = eventually(
        &cluster,
        ns,
        "InferencePoolReady GatewayNotFound",
        ROLLOUT,
        || async {
            let idep = status_pool(&cluster, ns, name).await;
            let ready = idep["status"]["inferencePool"]["pickerReadyReplicas"].clone();
            match condition(&idep, "InferencePoolReady") {
                Some(c) if c["reason"] == "GatewayNotFound" && ready == 2 => Ok(idep),
                other => Err(format!("{other:?}, pickers ready {ready}")),
            }
        },
    )
    .await
    .unwrap();
    let status = &idep["status"]["inferencePool"];
    assert_eq!(status["pickerReadyReplicas"], 2, "{status}");
    assert_eq!(
        status["route"]["gateway"],
        format!("{ns}/inference-gateway")
    );
    let message = condition(&idep, "InferencePoolReady").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("does not exist"), "{message}");

    let envoy = cluster
        .envoy_for_pool(
            ns,
            "envoy",
            &format!("{name}-pool"),
            &EnvoyOptions::default(),
        )
        .await
        .unwrap();
    let pickers = cluster.pickers(ns, name).await.unwrap();
    assert_eq!(pickers.len(), 2);

    // Chat, completions and a stream through Envoy's Service.
    let (status, body, _, _) = envoy
        .duplex
        .send_served("/v1/chat/completions", &chat("hello through envoy", false))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["object"], "chat.completion", "{body}");
    let (status, body) = envoy
        .duplex
        .send(
            "/v1/completions",
            &json!({"model": MODEL, "prompt": "once upon a time", "max_tokens": 4}),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = envoy
        .duplex
        .send("/v1/chat/completions", &chat("stream it", true))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let events = parse_sse(&body);
    assert_eq!(events.last(), Some(&json!("[DONE]")), "{body}");
    assert!(events.len() >= 3, "{body}");

    // Follow-ups of a shared prefix land on the worker that holds it, cached.
    let applied = r#"infera_gateway_kv_events_total{outcome="applied"}"#;
    let mut before_events = Vec::new();
    for (_, p) in &pickers {
        before_events.push(p.metric(applied).await.unwrap());
    }
    let before = picks(&pickers).await;
    let (status, body) = envoy
        .duplex
        .send("/v1/chat/completions", &with_system("first question"))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let first = grew(&before, &picks(&pickers).await);
    assert_eq!(first.len(), 1, "one worker picked: {first:?}");
    eventually(
        &cluster,
        ns,
        "both pickers applied the first request's KV events",
        ROLLOUT,
        || async {
            for ((_, p), was) in pickers.iter().zip(&before_events) {
                let now = p.metric(applied).await.map_err(|e| e.to_string())?;
                if now <= *was {
                    return Err(format!("applied {now}"));
                }
            }
            Ok(())
        },
    )
    .await
    .unwrap();
    for question in ["second question", "third question", "fourth question"] {
        let before = picks(&pickers).await;
        let (status, body) = envoy
            .duplex
            .send("/v1/chat/completions", &with_system(question))
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(grew(&before, &picks(&pickers).await), first, "{question}");
        let body: Value = serde_json::from_str(&body).unwrap();
        let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        assert!(cached > 0, "{question}: no cached tokens: {body}");
    }

    // One picker pod deleted under load: the other picks, no request fails.
    let before: u64 = picks(&pickers).await.values().sum();
    let load = Load::start(&envoy.duplex, MODEL, 2, 8);
    eventually(&cluster, ns, "the load picked", ROLLOUT, || async {
        let now: u64 = picks(&pickers).await.values().sum();
        if now >= before + 6 {
            Ok(())
        } else {
            Err(format!("{} picks", now - before))
        }
    })
    .await
    .unwrap();
    cluster
        .kubectl(&["delete", "pod", &pickers[0].0, "-n", ns, "--wait=true"])
        .await
        .unwrap();
    eventually(&cluster, ns, "two pickers again", ROLLOUT, || async {
        let now = cluster.pickers(ns, name).await.map_err(|e| e.to_string())?;
        if now.len() == 2 {
            Ok(())
        } else {
            Err(format!("{} ready", now.len()))
        }
    })
    .await
    .unwrap();
    let report = load.stop().await;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(report.ok >= 10, "{report:?}");

    // A killed worker pod: every request after it is served (Envoy goes down the
    // picker's fallbacks), and the picker stops naming it.
    let pickers = cluster.pickers(ns, name).await.unwrap();
    let engines = cluster.engine_pods(ns, name).await.unwrap();
    let victim = engines[0]["metadata"]["name"].as_str().unwrap().to_owned();
    let victim_ip = engines[0]["status"]["podIP"].as_str().unwrap().to_owned();
    cluster
        .kubectl(&[
            "delete",
            "pod",
            &victim,
            "-n",
            ns,
            "--grace-period=0",
            "--force",
        ])
        .await
        .unwrap();
    for n in 0..12 {
        let (status, body) = envoy
            .duplex
            .send(
                "/v1/chat/completions",
                &chat(&format!("after the kill {n}"), n % 2 == 1),
            )
            .await
            .unwrap();
        assert_eq!(status, 200, "request {n} after the kill: {body}");
    }
    eventually(
        &cluster,
        ns,
        "the killed worker no longer routed",
        ROLLOUT,
        || async {
            for (_, p) in &pickers {
                let (_, text) = p.get("/v1/workers").await.map_err(|e| e.to_string())?;
                if text.contains(&format!("{victim_ip}:")) {
                    return Err(format!("still listed: {text}"));
                }
            }
            Ok(())
        },
    )
    .await
    .unwrap();

    // No picker answering: the pool says FailClose, and Envoy configured from it
    // refuses; once it says FailOpen, Envoy serves on its own. (The buffered listener:
    // Envoy 1.40 does not fail open a full-duplex exchange, whatever it is told.)
    let no_picker = EnvoyOptions {
        picker_service: Some("no-such-picker".into()),
    };
    let closed: EnvoyGateway = cluster
        .envoy_for_pool(ns, "envoy-closed", &format!("{name}-pool"), &no_picker)
        .await
        .unwrap();
    // Refused at once on both listeners: a 500, or Envoy closing the connection while
    // the body is still being sent (it answers before reading it).
    for gateway in [&closed.buffered, &closed.duplex] {
        match gateway
            .send("/v1/chat/completions", &chat("no picker", false))
            .await
        {
            Ok((status, body)) => assert!(status >= 500, "FailClose: {status} {body}"),
            Err(e) => assert!(e.to_string().contains("error sending request"), "{e}"),
        }
    }
    cluster
        .kubectl(&[
            "patch",
            "idep",
            name,
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"gateway":{"inferencePool":{"failureMode":"FailOpen"}}}}"#,
        ])
        .await
        .unwrap();
    eventually(&cluster, ns, "the pool says FailOpen", ROLLOUT, || async {
        let pool = cluster
            .get_json(&["get", "inferencepool", &format!("{name}-pool"), "-n", ns])
            .await
            .map_err(|e| e.to_string())?;
        let mode = pool["spec"]["endpointPickerRef"]["failureMode"].clone();
        if mode == "FailOpen" {
            Ok(())
        } else {
            Err(format!("{mode}"))
        }
    })
    .await
    .unwrap();
    // A gateway of its own, so no request can reach the FailClose one's pod while its
    // replacement rolls in.
    let open = cluster
        .envoy_for_pool(ns, "envoy-open", &format!("{name}-pool"), &no_picker)
        .await
        .unwrap();
    let (status, body) = open
        .buffered
        .send("/v1/chat/completions", &chat("no picker, fail open", false))
        .await
        .unwrap();
    assert_eq!(status, 200, "FailOpen without a picker: {body}");
}

#[tokio::test]
async fn an_earlier_gaie_manifest_converted_serves_both_legs_through_the_decode_frontends() {
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-pool-pd").await.unwrap();
    let ns = ns.name.as_str();
    // The earlier operator's 1P1D with spec.gaie, converted as a user would.
    let path = repo().join("examples/migrate/earlier-vllm-pd-gaie.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let out = infera::convert::convert_text(&text, "earlier-vllm-pd-gaie.yaml").unwrap();
    assert_ne!(
        out.worst(),
        Some(infera::convert::findings::Severity::Error),
        "{:?}",
        out.findings
    );
    let mut docs = out.documents.clone();
    let name = docs[1]["metadata"]["name"].as_str().unwrap().to_owned();
    let pool = docs[1]["spec"]["gateway"]["inferencePool"].clone();
    assert_eq!(
        pool["gatewayRef"],
        json!({"name": "inference-gateway", "namespace": "gateways"}),
        "{pool}"
    );
    // No GPUs and no vLLM image here: the engine becomes the simulator imitating vLLM,
    // and the documents land in the test's namespace; the pool is as converted.
    for doc in &mut docs {
        doc["metadata"]["namespace"] = json!(ns);
    }
    let spec = &mut docs[1]["spec"];
    spec["engine"] = json!({"kind": "sim", "simFlavor": "vllm"});
    spec["model"] = json!({"name": MODEL, "source": {"hostPath": {"path": "/models/none"}}});
    spec["gateway"]["replicas"] = json!(0);
    spec["gateway"]["inferencePool"]["pickerReplicas"] = json!(1);
    spec["gateway"]["inferencePool"]["resources"] =
        json!({"requests": {"cpu": "50m", "memory": "64Mi"}});
    spec["network"] = json!({"networkPolicy": {"allowFrom": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "envoy"}}}]}});
    for doc in &docs {
        cluster.apply(ns, &doc.to_string()).await.unwrap();
    }
    eventually(&cluster, ns, "the picker ready", ROLLOUT, || async {
        let idep = status_pool(&cluster, ns, &name).await;
        let ready = idep["status"]["inferencePool"]["pickerReadyReplicas"].as_i64();
        let roles = idep["status"]["roles"].clone();
        let workers_ready = roles
            .as_array()
            .is_some_and(|r| r.len() == 2 && r.iter().all(|r| r["readyReplicas"] == 1));
        if ready == Some(1) && workers_ready {
            Ok(())
        } else {
            Err(format!("picker {ready:?}, roles {roles}"))
        }
    })
    .await
    .unwrap();
    let envoy = cluster
        .envoy_for_pool(
            ns,
            "envoy",
            &format!("{name}-pool"),
            &EnvoyOptions::default(),
        )
        .await
        .unwrap();
    let decode = cluster
        .pods(
            ns,
            &format!("infera.amd.com/deployment={name},infera.amd.com/role=decode"),
        )
        .await
        .unwrap();
    let prefill = cluster
        .pods(
            ns,
            &format!("infera.amd.com/deployment={name},infera.amd.com/role=prefill"),
        )
        .await
        .unwrap();
    // A worker is named by its pod's address or name.
    let names = |pods: &[Value]| {
        [
            pods[0]["status"]["podIP"].as_str().unwrap().to_owned(),
            pods[0]["metadata"]["name"].as_str().unwrap().to_owned(),
        ]
    };
    let (decode_names, prefill_names) = (names(&decode), names(&prefill));
    for stream in [false, true] {
        let (status, body, _, served) = envoy
            .duplex
            .send_served("/v1/chat/completions", &chat("both legs please", stream))
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        // The decode pod's frontend ran the pair the picker named.
        let p = served.prefill.clone().unwrap_or_default();
        let d = served.decode.clone().unwrap_or_default();
        assert!(
            prefill_names.iter().any(|n| p.contains(n.as_str())),
            "prefill {served:?} not {prefill_names:?}"
        );
        assert!(
            decode_names.iter().any(|n| d.contains(n.as_str())),
            "decode {served:?} not {decode_names:?}"
        );
        if stream {
            assert_eq!(parse_sse(&body).last(), Some(&json!("[DONE]")), "{body}");
        }
    }
}
