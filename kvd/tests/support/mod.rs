//! Starting `infera-kvd` for a test and reading its metrics.

#![allow(dead_code)]

use infera_testkit::process::{ServerProcess, free_port};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct Kvd {
    pub process: ServerProcess,
    pub socket: PathBuf,
    pub metrics: u16,
    pub dir: tempfile::TempDir,
}

pub fn start(extra: &[&str]) -> Kvd {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kvd.sock");
    let metrics = free_port().unwrap();
    let mut args: Vec<String> = vec![
        "--socket".into(),
        socket.display().to_string(),
        "--max-bytes".into(),
        (64u64 << 20).to_string(),
        "--max-value-bytes".into(),
        (1u64 << 20).to_string(),
        "--metrics-addr".into(),
        format!("127.0.0.1:{metrics}"),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let process = ServerProcess::start(
        Path::new(env!("CARGO_BIN_EXE_infera-kvd")),
        &args,
        &dir.path().join("kvd.log"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "kvd never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    Kvd {
        process,
        socket,
        metrics,
        dir,
    }
}

pub fn metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

pub fn metric(port: u16, name: &str) -> f64 {
    metrics(port)
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(-1.0)
}

/// Polls `cond` every 20 ms until it holds; fails with `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A metric's value with its labels, e.g. `infera_kvd_tier_hits_total{tier="nvme"}`
/// (-1 when absent).
pub fn labelled(port: u16, series: &str) -> f64 {
    metrics(port)
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .filter(|rest| rest.starts_with(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(-1.0)
}

/// The 8-byte key of `n`.
pub fn key(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

/// Bytes that differ for every key and length (so a value returned for the wrong key,
/// or torn, is noticed).
pub fn value_for(n: u64, len: usize) -> Vec<u8> {
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
