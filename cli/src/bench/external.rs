//! Another router in place of Infera's gateway: started from a command template on
//! the bench's simulated fleet, waited for until it answers, measured by its process's
//! CPU time, stopped at the end.

use anyhow::{Context, Result, bail};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A running external router.
#[derive(Debug)]
pub struct External {
    child: tokio::process::Child,
    /// Its base URL.
    pub base: String,
}

/// The placeholder for the workers' KV-event endpoints in a router command.
pub const KV_EVENT_SOURCES: &str = "{kv_event_sources}";

/// The argv of `template` with `{port}`, `{metrics_port}` (a second free port),
/// `{workers}` (one argument per URL) and `{kv_event_sources}` (`--kv-event-source
/// URL=ENDPOINT` per worker that publishes KV events, `events` in `workers`' order, as
/// vLLM's router takes them) filled.
pub fn build_argv(
    template: &str,
    port: u16,
    metrics_port: u16,
    workers: &[String],
    events: &[Option<String>],
) -> Vec<String> {
    let mut argv = Vec::new();
    for word in template.split_whitespace() {
        if word == "{workers}" {
            argv.extend(workers.iter().cloned());
        } else if word == KV_EVENT_SOURCES {
            for (worker, endpoint) in workers.iter().zip(events) {
                if let Some(endpoint) = endpoint {
                    argv.push("--kv-event-source".into());
                    argv.push(format!("{worker}={endpoint}"));
                }
            }
        } else {
            argv.push(
                word.replace("{port}", &port.to_string())
                    .replace("{metrics_port}", &metrics_port.to_string()),
            );
        }
    }
    argv
}

/// User + system CPU time of process `pid` (from `/proc/<pid>/stat`, 10 ms ticks).
pub fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) start after the last ')';
    // utime and stime are fields 14 and 15, so 12 and 13 after it.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

impl External {
    /// Starts `template` against `workers` and waits (up to a minute) until a
    /// completion for `model` succeeds through it.
    pub async fn start(
        template: &str,
        workers: &[String],
        events: &[Option<String>],
        model: &str,
    ) -> Result<External> {
        let port = crate::up::local::free_port()?;
        let metrics_port = crate::up::local::free_port()?;
        let argv = build_argv(template, port, metrics_port, workers, events);
        Self::spawn(
            &argv,
            &format!("http://127.0.0.1:{port}"),
            model,
            "external router",
            &reqwest::Client::new(),
        )
        .await
    }

    /// Runs `argv` and waits (up to a minute) until a completion for `model` succeeds
    /// at `base` through `client`; `what` names it in errors.
    pub async fn spawn(
        argv: &[String],
        base: &str,
        model: &str,
        what: &str,
        client: &reqwest::Client,
    ) -> Result<External> {
        let log_path = std::env::temp_dir().join(format!(
            "infera-bench-{}-{}.log",
            what.replace(' ', "-"),
            std::process::id()
        ));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let Some((program, args)) = argv.split_first() else {
            bail!("the {what}'s command is empty");
        };
        let child = tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the {what} {program}"))?;
        let mut ext = External {
            child,
            base: base.to_owned(),
        };
        let body = serde_json::json!({"model": model, "prompt": "ready?", "max_tokens": 1});
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = ext.child.try_wait()? {
                bail!(
                    "the {what} exited at start: {status} (its output: {})",
                    log_path.display()
                );
            }
            let ok = client
                .post(format!("{}/v1/completions", ext.base))
                .json(&body)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return Ok(ext);
            }
            if Instant::now() > deadline {
                bail!(
                    "the {what} did not serve a completion within a minute (its output: {})",
                    log_path.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// CPU time it used so far.
    pub fn cpu(&self) -> Duration {
        self.child.id().map_or(Duration::ZERO, process_cpu)
    }

    /// Stops it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_fill_the_port_and_one_argument_per_worker() {
        let argv = build_argv(
            "python -m r --port {port} --worker-urls {workers} --m {metrics_port}",
            9000,
            9001,
            &["http://a:1".into(), "http://b:2".into()],
            &[],
        );
        assert_eq!(
            argv,
            [
                "python",
                "-m",
                "r",
                "--port",
                "9000",
                "--worker-urls",
                "http://a:1",
                "http://b:2",
                "--m",
                "9001"
            ]
        );
        assert!(process_cpu(std::process::id()) < Duration::from_secs(3600));
    }

    #[test]
    fn kv_event_sources_pair_each_publishing_worker_with_its_endpoint() {
        let argv = build_argv(
            "vllm-router --worker-urls {workers} --policy kv_aware {kv_event_sources}",
            1,
            2,
            &[
                "http://a:1".into(),
                "http://b:2".into(),
                "http://c:3".into(),
            ],
            &[Some("tcp://a:5".into()), None, Some("tcp://c:7".into())],
        );
        assert_eq!(
            argv[argv.len() - 4..],
            [
                "--kv-event-source",
                "http://a:1=tcp://a:5",
                "--kv-event-source",
                "http://c:3=tcp://c:7"
            ]
        );
    }
}
