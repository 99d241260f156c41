//! The engine process: launched in its own process group, watched, asked for its
//! health, page size and load over HTTP, and stopped (SIGTERM to the group, SIGKILL after
//! a grace period).

use infera_engine_prep::prepare::PreparedEngine;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// The engine: launched by the sidecar, or attached to (its own container).
#[derive(Debug)]
pub struct EngineProcess {
    child: Option<Child>,
    base_url: String,
    http: reqwest::Client,
}

impl EngineProcess {
    /// Spawns the prepared engine in a new process group; its output is inherited.
    pub fn launch(prepared: &PreparedEngine, base_url: String) -> std::io::Result<Self> {
        let mut cmd = Command::new(&prepared.program);
        for name in &prepared.unset {
            cmd.env_remove(name);
        }
        cmd.args(&prepared.args)
            .envs(prepared.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        die_with_parent(&mut cmd);
        let child = cmd.spawn()?;
        Ok(Self {
            child: Some(child),
            base_url,
            http: reqwest::Client::new(),
        })
    }

    /// An engine the sidecar does not own (attach mode): watched over HTTP only.
    pub fn attach(base_url: String) -> Self {
        Self {
            child: None,
            base_url,
            http: reqwest::Client::new(),
        }
    }

    /// Whether the engine answers `/health` now.
    pub async fn is_healthy(&self) -> bool {
        self.get("/health")
            .await
            .is_some_and(|r| r.status().is_success())
    }

    /// The engine's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref()?.id()
    }

    /// Whether the engine has exited (and how).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    async fn get(&self, path: &str) -> Option<reqwest::Response> {
        self.http
            .get(format!("{}{path}", self.base_url))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()
    }

    /// Polls `/health` until it answers 200; fails if the engine exits or `timeout` passes.
    pub async fn wait_healthy(&mut self, timeout: Duration) -> Result<(), String> {
        let started = Instant::now();
        let mut last_log = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return Err(format!(
                    "the engine exited with {status} before it was healthy"
                ));
            }
            if self
                .get("/health")
                .await
                .is_some_and(|r| r.status().is_success())
            {
                tracing::info!(
                    "engine healthy after {:.1}s",
                    started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            if started.elapsed() > timeout {
                return Err(format!("the engine was not healthy within {timeout:?}"));
            }
            if last_log.elapsed() > Duration::from_secs(30) {
                tracing::info!(
                    "waiting for the engine to load ({:.0}s so far)",
                    started.elapsed().as_secs_f64()
                );
                last_log = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The engine's resolved page size: vLLM's `cache_config_info{block_size}` metric, or
    /// SGLang's `page_size` in `/get_server_info`.
    pub async fn resolved_block_size(&self) -> Option<u32> {
        if let Some(resp) = self.get("/metrics").await
            && let Ok(text) = resp.text().await
            && let Some(bs) = parse_block_size_metric(&text)
        {
            return Some(bs);
        }
        let info: serde_json::Value = self.get("/get_server_info").await?.json_value().await?;
        info.get("page_size")?
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
    }

    /// Requests running plus waiting, from the engine's own metrics.
    pub async fn load(&self) -> Option<f64> {
        let text = self.get("/metrics").await?.text().await.ok()?;
        let names = [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "sglang:num_running_reqs",
            "sglang:num_queue_reqs",
        ];
        let mut total = None;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if names.iter().any(|n| line.starts_with(n))
                && let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok())
            {
                *total.get_or_insert(0.0) += v;
            }
        }
        total
    }

    /// Waits until the engine has had no request for `settle`, at most `timeout`.
    pub async fn drain(&self, settle: Duration, timeout: Duration) -> bool {
        let started = Instant::now();
        let mut idle_since: Option<Instant> = None;
        while started.elapsed() < timeout {
            match self.load().await {
                Some(0.0) => {
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= settle {
                        return true;
                    }
                }
                Some(n) => {
                    idle_since = None;
                    tracing::info!("draining: {n} requests still on the engine");
                }
                None => return true,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// SIGTERM to the engine's group, SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let pid = self.pid();
        // An attached engine is stopped by its own container's lifecycle.
        let child = self.child.as_mut()?;
        if let Some(pid) = pid {
            signal_group(pid, libc::SIGTERM);
        }
        match tokio::time::timeout(grace, child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                if let Some(pid) = pid {
                    signal_group(pid, libc::SIGKILL);
                }
                child.wait().await.ok()
            }
        }
    }
}

/// The engine gets SIGTERM if the sidecar dies (even by SIGKILL), so no engine is left
/// serving without a registration. PR_SET_PDEATHSIG follows the thread that spawned the
/// child: the sidecar runs on a single-threaded runtime, on its main thread.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (prctl, getppid, kill).
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() == 1 {
                libc::kill(libc::getpid(), libc::SIGTERM);
            }
            Ok(())
        });
    }
}

#[allow(unsafe_code)]
fn signal_group(pid: u32, signal: i32) {
    // SAFETY: kill(2) with a negative pid signals the process group the engine leads
    // (spawned with process_group(0)); it reads no memory of ours.
    unsafe {
        libc::kill(-(pid as i32), signal);
    }
}

trait JsonValue {
    async fn json_value(self) -> Option<serde_json::Value>;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.bytes().await.ok()?).ok()
    }
}

/// `block_size="N"` from vLLM's `cache_config_info` line.
pub fn parse_block_size_metric(text: &str) -> Option<u32> {
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let rest = &line[line.find("block_size=\"")? + "block_size=\"".len()..];
    rest[..rest.find('"')?].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_block_size_label() {
        let m = "# HELP x\nvllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"100\"} 1\n";
        assert_eq!(parse_block_size_metric(m), Some(32));
        assert_eq!(parse_block_size_metric("vllm:num_requests_running 0"), None);
    }
}
