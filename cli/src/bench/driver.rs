//! Sending requests and timing them: one request (streamed or not) with its TTFT,
//! inter-token gaps, end-to-end time and token counts from `usage`, and an open-loop
//! Poisson schedule over many requests with a progress line.

use super::workload::Rng;
use futures::StreamExt;
use serde_json::Value;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Longest a request may take before it counts as an error (a stuck request must not
/// hang a run).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// The driver's HTTP client: many idle connections per host, the request timeout.
pub fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(REQUEST_TIMEOUT)
        .tcp_nodelay(true)
        .build()?)
}

/// A client that opens a new connection per request. Routers that leave Nagle on
/// (the SGLang router 0.3.2) stall each response after the first on a kept-alive
/// connection until the client's delayed ACK (about 40 ms); a fresh connection has no
/// such stall, so a comparison of routers measures routing.
pub fn client_per_request() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(REQUEST_TIMEOUT)
        .tcp_nodelay(true)
        .build()?)
}

/// What one request measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// 2xx and a complete answer.
    pub ok: bool,
    /// HTTP status (0: no answer).
    pub status: u16,
    /// Seconds to the first token.
    pub ttft: Option<f64>,
    /// Seconds between tokens.
    pub itls: Vec<f64>,
    /// Seconds to the end.
    pub e2e: f64,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: u64,
    /// `usage.completion_tokens`.
    pub output_tokens: u64,
    /// The answer's text: what a client appends to a conversation's history.
    pub text: String,
    /// What went wrong.
    pub error: Option<String>,
}

fn read_usage(out: &mut Outcome, v: &Value) {
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        out.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
        out.output_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
        out.cached_tokens = u
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
    }
}

/// The text of a completion or chat answer, or of one streamed chunk of either.
fn answer_text(v: &Value) -> Option<&str> {
    let choice = &v["choices"][0];
    ["/text", "/delta/content", "/message/content"]
        .iter()
        .find_map(|p| choice.pointer(p).and_then(Value::as_str))
        .filter(|t| !t.is_empty())
}

/// POSTs `body` to `url` and measures it; `body.stream` decides the mode.
pub async fn send(client: &reqwest::Client, url: &str, body: &Value) -> Outcome {
    let started = Instant::now();
    let mut out = Outcome::default();
    let resp = match client.post(url).json(body).send().await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(e.to_string());
            out.e2e = started.elapsed().as_secs_f64();
            return out;
        }
    };
    out.status = resp.status().as_u16();
    let streaming = body["stream"].as_bool().unwrap_or(false);
    if !resp.status().is_success() {
        out.error = Some(
            resp.text()
                .await
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect(),
        );
        out.e2e = started.elapsed().as_secs_f64();
        return out;
    }
    if !streaming {
        match resp.json::<Value>().await {
            Ok(v) => {
                read_usage(&mut out, &v);
                out.text = answer_text(&v).unwrap_or_default().to_owned();
                out.ok = true;
            }
            Err(e) => out.error = Some(e.to_string()),
        }
        out.e2e = started.elapsed().as_secs_f64();
        out.ttft = Some(out.e2e);
        return out;
    }
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let mut last: Option<Instant> = None;
    let mut done = false;
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            out.error = Some("the stream broke".into());
            break;
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(pos) = buf.find("\n\n") {
            let event: String = buf.drain(..pos + 2).collect();
            for line in event.lines() {
                let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                    continue;
                };
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let Ok(v) = serde_json::from_str::<Value>(data) else {
                    continue;
                };
                if v.get("error").is_some() {
                    out.error = Some(v["error"].to_string());
                }
                if let Some(token) = answer_text(&v) {
                    out.text.push_str(token);
                    let now = Instant::now();
                    match last {
                        None => out.ttft = Some(now.duration_since(started).as_secs_f64()),
                        Some(prev) => out.itls.push(now.duration_since(prev).as_secs_f64()),
                    }
                    last = Some(now);
                }
                read_usage(&mut out, &v);
            }
        }
    }
    out.e2e = started.elapsed().as_secs_f64();
    out.ok = done && out.error.is_none();
    out
}

/// Sends `bodies` to `urls` (rotating) as a Poisson process of `rate` per second,
/// printing progress under `label`; returns outcomes in send order.
pub async fn open_loop(
    client: &reqwest::Client,
    urls: &[String],
    bodies: Vec<Value>,
    rate: f64,
    seed: u64,
    label: &str,
) -> Vec<Outcome> {
    let mut rng = Rng::new(seed);
    let total = bodies.len();
    let progress = Progress::start(label, total);
    let started = Instant::now();
    let mut at = 0.0;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, body) in bodies.into_iter().enumerate() {
        at += rng.exp(rate);
        tokio::time::sleep_until((started + Duration::from_secs_f64(at)).into()).await;
        let (client, url, done) = (
            client.clone(),
            urls[i % urls.len()].clone(),
            progress.counter(),
        );
        tasks.spawn(async move {
            let o = send(&client, &url, &body).await;
            done.fetch_add(1, Ordering::Relaxed);
            (i, o)
        });
    }
    let out = join_indexed(tasks, total).await;
    progress.finish();
    out
}

/// Waits for `tasks`, each returning its index below `n` and its result; the results in
/// index order (a task that panicked leaves the default in its place).
pub async fn join_indexed<T>(mut tasks: tokio::task::JoinSet<(usize, T)>, n: usize) -> Vec<T>
where
    T: Default + Clone + Send + 'static,
{
    let mut out = vec![T::default(); n];
    while let Some(r) = tasks.join_next().await {
        if let Ok((i, v)) = r
            && let Some(slot) = out.get_mut(i)
        {
            *slot = v;
        }
    }
    out
}

/// A progress line on stderr while requests run (redrawn on a terminal), then the
/// total and the time taken.
pub struct Progress {
    label: String,
    total: usize,
    done: Arc<AtomicUsize>,
    started: Instant,
    line: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// Starts drawing `label`'s line for `total` requests.
    pub fn start(label: &str, total: usize) -> Self {
        let done = Arc::new(AtomicUsize::new(0));
        let line = tokio::spawn(draw(label.to_owned(), total, done.clone()));
        Progress {
            label: label.to_owned(),
            total,
            done,
            started: Instant::now(),
            line,
        }
    }

    /// The counter a request adds one to when it is done.
    pub fn counter(&self) -> Arc<AtomicUsize> {
        self.done.clone()
    }

    /// Stops the line and prints the final count.
    pub fn finish(self) {
        self.line.abort();
        eprintln!(
            "\r[{}] {total}/{total} done in {:.1} s          ",
            self.label,
            self.started.elapsed().as_secs_f64(),
            total = self.total,
        );
    }
}

async fn draw(label: String, total: usize, done: Arc<AtomicUsize>) {
    let tty = std::io::stderr().is_terminal();
    let mut tick = tokio::time::interval(Duration::from_millis(if tty { 250 } else { 5000 }));
    loop {
        tick.tick().await;
        let n = done.load(Ordering::Relaxed);
        let width = 30;
        let filled = (n * width).checked_div(total).unwrap_or(width);
        let bar: String = "#".repeat(filled) + &"-".repeat(width - filled);
        if tty {
            eprint!("\r[{label}] [{bar}] {n}/{total}");
            let _ = std::io::stderr().flush();
        } else {
            eprintln!("[{label}] {n}/{total}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answer_text_reads_completions_chat_and_their_chunks() {
        let completion = json!({"choices": [{"text": "Hello"}]});
        let chunk = json!({"choices": [{"delta": {"content": " world"}}]});
        let chat = json!({"choices": [{"message": {"content": "Hi"}}]});
        assert_eq!(answer_text(&completion), Some("Hello"));
        assert_eq!(answer_text(&chunk), Some(" world"));
        assert_eq!(answer_text(&chat), Some("Hi"));
        let role_only = json!({"choices": [{"delta": {"role": "assistant", "content": ""}}]});
        assert_eq!(answer_text(&role_only), None, "no token in a role chunk");
        assert_eq!(answer_text(&json!({"usage": {}})), None);
    }
}
