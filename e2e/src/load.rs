//! A bounded steady load on a gateway while a test changes the cluster (scales, deletes
//! pods, restarts etcd): a few clients, each sending one short request after another,
//! alternating JSON and streamed answers (half of them starting with a stream), until
//! stopped. Every outcome is recorded, so a
//! test asserts on failures with their reasons, not on timing.

use crate::gateway::{Gateway, ServedBy, parse_sse};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What a load run saw.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Requests answered in full.
    pub ok: u64,
    /// Failed requests: what each got (status and body, transport error, or a stream
    /// that ended with an error event or without `[DONE]`).
    pub failed: Vec<String>,
    /// Longest time a request took.
    pub slowest: Duration,
    /// How long the load ran.
    pub duration: Duration,
    /// Time to first token of each streamed request answered in full.
    pub ttft: Vec<Duration>,
    /// Who served each request answered in full, as its response named them.
    pub served: Vec<ServedBy>,
}

/// A running load; [`Load::stop`] ends it and returns the report.
pub struct Load {
    stop: watch::Sender<bool>,
    clients: JoinSet<LoadReport>,
    started: Instant,
}

impl Load {
    /// Starts `clients` clients sending chat completions for `model` with `max_tokens`.
    pub fn start(gateway: &Gateway, model: &str, clients: usize, max_tokens: u32) -> Self {
        Self::with_prompt(gateway, model, clients, max_tokens, 0)
    }

    /// As [`Load::start`], each prompt padded to about `prompt_chars` characters (a
    /// prefill-heavy load; the simulator's byte codec makes a character a token).
    pub fn with_prompt(
        gateway: &Gateway,
        model: &str,
        clients: usize,
        max_tokens: u32,
        prompt_chars: usize,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let mut set = JoinSet::new();
        for client in 0..clients {
            let gateway = gateway.clone();
            let model = model.to_owned();
            let stopped = stopped.clone();
            let ask = Ask {
                client,
                max_tokens,
                prompt_chars,
            };
            set.spawn(async move { run_client(gateway, model, ask, stopped).await });
        }
        Self {
            stop,
            clients: set,
            started: Instant::now(),
        }
    }

    /// Stops the clients after their current request and sums what they saw.
    pub async fn stop(mut self) -> LoadReport {
        let _ = self.stop.send(true);
        let mut total = LoadReport {
            duration: self.started.elapsed(),
            ..Default::default()
        };
        while let Some(done) = self.clients.join_next().await {
            match done {
                Ok(report) => {
                    total.ok += report.ok;
                    total.failed.extend(report.failed);
                    total.slowest = total.slowest.max(report.slowest);
                    total.ttft.extend(report.ttft);
                    total.served.extend(report.served);
                }
                Err(e) => total.failed.push(format!("a load client panicked: {e}")),
            }
        }
        total
    }
}

/// What one client asks.
struct Ask {
    client: usize,
    max_tokens: u32,
    prompt_chars: usize,
}

impl Ask {
    /// Request `n`'s prompt: distinct from every other, padded to the size asked for.
    fn prompt(&self, n: u64) -> String {
        let head = format!("client {} request {n}", self.client);
        let pad = self.prompt_chars.saturating_sub(head.len());
        let filler: String = "lorem ipsum dolor sit amet "
            .chars()
            .cycle()
            .take(pad)
            .collect();
        format!("{head} {filler}")
    }
}

async fn run_client(
    gateway: Gateway,
    model: String,
    ask: Ask,
    stopped: watch::Receiver<bool>,
) -> LoadReport {
    let Ask {
        client, max_tokens, ..
    } = ask;
    let mut report = LoadReport::default();
    let mut n: u64 = 0;
    while !*stopped.borrow() {
        n += 1;
        // Half the clients start with a stream: both kinds are in flight from the start.
        let stream = (n + client as u64 / 2).is_multiple_of(2);
        let body = json!({
            "model": model, "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": ask.prompt(n)}],
        });
        let started = Instant::now();
        let outcome = gateway.send_served("/v1/chat/completions", &body).await;
        report.slowest = report.slowest.max(started.elapsed());
        match outcome {
            Ok((200, text, first, served)) => match judge(&text, stream) {
                Ok(()) => {
                    report.ok += 1;
                    report.served.push(served);
                    if stream {
                        report.ttft.push(first);
                    }
                }
                Err(why) => report.failed.push(format!("client {client} #{n}: {why}")),
            },
            Ok((status, text, _, _)) => report
                .failed
                .push(format!("client {client} #{n}: {status} {text}")),
            Err(e) => report.failed.push(format!("client {client} #{n}: {e}")),
        }
    }
    report
}

/// Whether a 200 answer is whole: JSON with a choice, or a stream of chunks without an
/// error event that ends with `[DONE]`.
fn judge(text: &str, stream: bool) -> Result<(), String> {
    if !stream {
        let body: Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text}"))?;
        return if body["choices"][0]["message"].is_object() {
            Ok(())
        } else {
            Err(format!("no choice: {text}"))
        };
    }
    let events = parse_sse(text);
    if let Some(error) = events.iter().find(|e| e.get("error").is_some()) {
        return Err(format!("stream error event: {error}"));
    }
    match events.last() {
        Some(Value::String(done)) if done == "[DONE]" => Ok(()),
        _ => Err(format!("stream ended without [DONE]: {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::judge;

    #[test]
    fn judges_whole_and_broken_answers() {
        assert!(judge(r#"{"choices":[{"message":{"content":"x"}}]}"#, false).is_ok());
        assert!(judge(r#"{"error":{"message":"x"}}"#, false).is_err());
        assert!(judge("data: {\"choices\":[]}\n\ndata: [DONE]\n\n", true).is_ok());
        assert!(judge("data: {\"choices\":[]}\n\n", true).is_err());
        assert!(
            judge(
                "data: {\"error\":{\"message\":\"gone\"}}\n\ndata: [DONE]\n\n",
                true
            )
            .is_err()
        );
    }
}
