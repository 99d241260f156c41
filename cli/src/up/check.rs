//! `infera up --check`: a few requests through the gateway, each printed with its
//! answer, the worker that served it, and why (cached prefix tokens), so a newcomer sees
//! the router work.

use super::local::LocalCluster;
use anyhow::{Context, Result};
use infera_operator::api::RoutingPolicy;
use serde_json::{Value, json};
use std::collections::BTreeMap;

const SYSTEM_A: &str = "You are the on-call assistant of a GPU inference platform. Answer in one short paragraph, cite the relevant runbook section, prefer commands the operator can paste, and say when a question needs a human. The platform runs vLLM, SGLang and ATOM engines on AMD MI355X nodes with AINIC RDMA networking.";
const SYSTEM_B: &str = "You are a travel agent for a small company. Keep answers to three sentences, list prices in euros, and always mention the cancellation policy before confirming anything.";

/// One request of the check.
struct Probe {
    system: &'static str,
    question: &'static str,
}

const PROBES: [Probe; 4] = [
    Probe {
        system: SYSTEM_A,
        question: "A decode worker shows high ITL; what do I check first?",
    },
    Probe {
        system: SYSTEM_A,
        question: "How do I find the RoCEv2 GID index of a node?",
    },
    Probe {
        system: SYSTEM_B,
        question: "Can I book two nights in Lisbon next week?",
    },
    Probe {
        system: SYSTEM_A,
        question: "What does a Degraded condition on an InferaDeployment mean?",
    },
];

/// The gateway's picks so far, `(role, worker) -> count`, from its `/metrics`.
async fn picks(client: &reqwest::Client, base: &str) -> Result<BTreeMap<(String, String), u64>> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .context("reading the gateway's metrics")?
        .text()
        .await?;
    Ok(infera_gateway::parse_picks(&text))
}

/// Sends the probes for `model`; returns whether every one succeeded.
pub async fn run_check(
    cluster: &LocalCluster,
    model: &str,
    policy: RoutingPolicy,
    completions_only: bool,
) -> Result<bool> {
    let client = reqwest::Client::new();
    let mut ok = true;
    println!("\nchecking: {} requests to {model}", PROBES.len());
    for (i, probe) in PROBES.iter().enumerate() {
        let before = picks(&client, &cluster.url()).await?;
        let (path, body) = if completions_only {
            (
                "/v1/completions",
                json!({"model": model, "prompt": format!("{}\n\n{}", probe.system, probe.question), "max_tokens": 24}),
            )
        } else {
            (
                "/v1/chat/completions",
                json!({"model": model, "max_tokens": 24, "messages": [
                    {"role": "system", "content": probe.system},
                    {"role": "user", "content": probe.question}]}),
            )
        };
        let resp = client
            .post(format!("{}{path}", cluster.url()))
            .json(&body)
            .send()
            .await
            .context("sending a check request to the gateway")?;
        let status = resp.status();
        let answer: Value = resp.json().await.unwrap_or(Value::Null);
        // The gateway counts each pick when it makes it: the new ones are this request's.
        let after = picks(&client, &cluster.url()).await?;
        let mut served: Vec<String> = after
            .iter()
            .filter(|(k, n)| before.get(*k).copied().unwrap_or(0) < **n)
            .map(|((role, worker), _)| format!("{worker} ({role})"))
            .collect();
        // Prefill before decode.
        served.sort_by_key(|s| !s.ends_with("(prefill)"));
        println!("#{} {:?}", i + 1, probe.question);
        if !status.is_success() {
            ok = false;
            println!("   FAILED: {status} {answer}");
            continue;
        }
        let text = answer
            .pointer("/choices/0/message/content")
            .or_else(|| answer.pointer("/choices/0/text"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .replace('\n', " ");
        let prompt = answer
            .pointer("/usage/prompt_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let cached = answer
            .pointer("/usage/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let why = match (policy, cached) {
            (RoutingPolicy::KvAware, 0) => {
                "no worker held this prompt's prefix yet: the least loaded one".to_owned()
            }
            (RoutingPolicy::KvAware, c) => {
                format!("kv-aware: {c} of the {prompt} prompt tokens were already cached there")
            }
            (RoutingPolicy::RoundRobin, c) => {
                format!("round-robin ({c} of {prompt} prompt tokens were cached there)")
            }
            (RoutingPolicy::Random, c) => {
                format!("random ({c} of {prompt} prompt tokens were cached there)")
            }
        };
        println!("   -> {}: {why}", served.join(" + "));
        println!("   answer: {}", text.chars().take(100).collect::<String>());
    }
    println!("{}", if ok { "check passed" } else { "check FAILED" });
    Ok(ok)
}
