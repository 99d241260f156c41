//! A real Redis server (Debian's `redis-server`, installed by the README's test command)
//! on loopback, in-memory only, killed on drop; it can be stopped and started again on
//! the same port to test a store that goes away and comes back.

use crate::TestEnvError;
use crate::process::{ServerProcess, free_port};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// A running redis-server.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    binary: PathBuf,
    process: Option<ServerProcess>,
    dir: TempDir,
}

fn prepare(message: String) -> TestEnvError {
    TestEnvError::Prepare {
        name: "redis-server",
        message,
    }
}

/// `INFERA_REDIS_SERVER`, else `redis-server` on PATH.
fn binary() -> Result<PathBuf, TestEnvError> {
    if let Some(p) = std::env::var_os("INFERA_REDIS_SERVER") {
        return Ok(p.into());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            prepare(
                "redis-server is not installed: `apt-get install redis-server` (the README's test command does)"
                    .into(),
            )
        })
}

fn ping(port: u16) -> Result<(), String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"PING\r\n").map_err(|e| e.to_string())?;
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).map_err(|e| e.to_string())?;
    (&buf == b"+PONG\r\n")
        .then_some(())
        .ok_or_else(|| format!("answered {:?}", String::from_utf8_lossy(&buf)))
}

/// How many keys the Redis at `addr` (`host:port`) holds (`DBSIZE`).
pub fn key_count(addr: &str) -> Result<u64, TestEnvError> {
    let ask = || -> Result<u64, String> {
        let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        s.write_all(b"DBSIZE\r\n").map_err(|e| e.to_string())?;
        let mut buf = [0u8; 32];
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        let reply = String::from_utf8_lossy(&buf[..n]);
        reply
            .strip_prefix(':')
            .and_then(|r| r.trim().parse().ok())
            .ok_or_else(|| format!("DBSIZE answered {reply:?}"))
    };
    ask().map_err(|e| prepare(format!("{addr}: {e}")))
}

impl RedisServer {
    /// Starts redis-server on a free port (no persistence) and waits until it answers
    /// PING.
    pub fn start() -> Result<Self, TestEnvError> {
        let dir = tempfile::Builder::new()
            .prefix("infera-redis-")
            .tempdir()
            .map_err(|e| prepare(e.to_string()))?;
        let mut server = Self {
            port: free_port().map_err(|e| prepare(e.to_string()))?,
            binary: binary()?,
            process: None,
            dir,
        };
        server.restart()?;
        Ok(server)
    }

    /// Starts the server again (on the same port) after [`RedisServer::kill`].
    pub fn restart(&mut self) -> Result<(), TestEnvError> {
        let args: Vec<String> = vec![
            "--bind".into(),
            "127.0.0.1".into(),
            "--port".into(),
            self.port.to_string(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            self.dir.path().display().to_string(),
        ];
        let mut process =
            ServerProcess::start(&self.binary, &args, &self.dir.path().join("redis.log")).map_err(
                |source| TestEnvError::Spawn {
                    name: "redis-server",
                    source,
                },
            )?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match ping(self.port) {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline || process.exited().is_some() => {
                    return Err(prepare(format!(
                        "not answering PING on port {} ({e}); log:\n{}",
                        self.port,
                        process.log_tail(20)
                    )));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        self.process = Some(process);
        Ok(())
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server now (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }
}
