//! S6 kvd, RAM tier: a real `infera-kvd` (next to this binary) with a RAM tier of
//! `ram_bytes`; 8B-model KV chunks (`chunk_bytes`, 32 MiB = 256 tokens x 128 KiB);
//! 70/30 get/put over a working set of twice the RAM tier, run once through a client
//! that reads the arena in place and once through one that gets values inline over the
//! socket; against that, a plain memcpy of the same chunks. Then inline GETs of 1 MiB
//! values for their p99.

use super::Ctx;
use super::stats::{quantile, summary};
use super::workload::Rng;
use anyhow::{Context, Result, anyhow, bail};
use infera_kvd::client::{Client, field, request_map};
use rmpv::Value;
use serde::Deserialize;
use serde_json::{Value as Json, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Sizes of S6.
#[derive(Debug, Clone, Deserialize)]
pub struct Size {
    chunk_bytes: usize,
    ram_bytes: u64,
    ops: usize,
    inline_probe_bytes: usize,
    inline_probe_ops: usize,
}

/// A running `infera-kvd`, killed on drop.
pub(super) struct Daemon {
    child: std::process::Child,
    /// Its socket.
    pub(super) socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Stops it with SIGTERM (queued writes are finished) and waits.
    pub(super) fn stop(mut self) -> Result<()> {
        let pid = i32::try_from(self.child.id())?;
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        self.child.wait()?;
        Ok(())
    }
}

fn start(binary: &Path, ram: u64, max_value: usize) -> Result<Daemon> {
    start_with(
        binary,
        &[
            "--max-bytes".into(),
            ram.to_string(),
            "--max-value-bytes".into(),
            max_value.to_string(),
            "--metrics-addr".into(),
            String::new(),
        ],
    )
}

/// Starts `binary` with `args` on a socket of its own and waits until it listens.
pub(super) fn start_with(binary: &Path, args: &[String]) -> Result<Daemon> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("kvd.sock");
    let child = std::process::Command::new(binary)
        .arg("--socket")
        .arg(&socket)
        .args(args)
        .env("RUST_LOG", "warn")
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline {
            bail!(
                "{} never listened on {}",
                binary.display(),
                socket.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Daemon {
        child,
        socket,
        _dir: dir,
    })
}

pub(super) fn key(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

fn get_map(k: u64) -> Value {
    request_map(
        "get",
        vec![
            ("key", Value::Binary(key(k).to_vec())),
            ("model", Value::from("llama-3.1-8b")),
        ],
    )
}

/// One GET; the bytes land in `buf`. Returns whether it hit.
pub(super) fn get(c: &mut Client, k: u64, buf: &mut Vec<u8>) -> Result<bool> {
    let reply = c.request(&get_map(k))?;
    match field(&reply, "op").and_then(Value::as_str) {
        Some("get_shared_response") => {
            let n = |f| field(&reply, f).and_then(Value::as_u64).unwrap_or(0);
            let arena = c
                .arena()
                .ok_or_else(|| anyhow!("a shared answer without an arena"))?;
            Ok(arena.read_into(
                n("slot_offset") as usize,
                n("length") as usize,
                n("version") as u32,
                buf,
            ))
        }
        _ => match field(&reply, "value") {
            Some(Value::Binary(b)) => {
                buf.clear();
                buf.extend_from_slice(b);
                Ok(true)
            }
            _ => Ok(false),
        },
    }
}

pub(super) fn gbps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / secs / 1e9
    } else {
        0.0
    }
}

/// The 70/30 mix through one client; GET hits timed.
fn mixed(name: &str, binary: &Path, size: &Size, arena: bool, seed: u64) -> Result<Json> {
    let d = start(binary, size.ram_bytes, size.chunk_bytes)?;
    let mut c = Client::connect(&d.socket, name, arena)?;
    let working_set = (size.ram_bytes * 2) / size.chunk_bytes as u64;
    let chunk: Vec<u8> = (0..size.chunk_bytes).map(|i| (i % 251) as u8).collect();
    for k in 0..working_set {
        let _ = c.set(key(k), &chunk, "short", "llama-3.1-8b")?;
    }
    let mut buf = Vec::with_capacity(size.chunk_bytes);
    // Steady state: every page of the client's mapping (and of `buf`) touched once, as
    // in an engine that has run a while; first-touch page faults are not GET cost.
    for k in 0..working_set {
        get(&mut c, k, &mut buf)?;
    }
    let mut rng = Rng::new(seed);
    let (mut hit_ms, mut bytes, mut gets, mut hits, mut put_ms) =
        (Vec::new(), 0u64, 0u64, 0u64, Vec::new());
    let started = Instant::now();
    for _ in 0..size.ops {
        let k = rng.next_u64() % working_set;
        let t = Instant::now();
        if rng.unit() < 0.7 {
            gets += 1;
            if get(&mut c, k, &mut buf)? {
                hit_ms.push(t.elapsed().as_secs_f64() * 1e3);
                bytes += buf.len() as u64;
                hits += 1;
            }
        } else {
            let _ = c.set(key(k), &chunk, "short", "llama-3.1-8b")?;
            put_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let hit_secs: f64 = hit_ms.iter().sum::<f64>() / 1e3;
    Ok(json!({
        "mode": name,
        "gets": gets,
        "hit_ratio": if gets > 0 { hits as f64 / gets as f64 } else { 0.0 },
        "get_gb_per_s": gbps(bytes, hit_secs),
        "get_ms": summary(&hit_ms, 1.0),
        "put_ms": summary(&put_ms, 1.0),
        "wall_s": wall,
    }))
}

/// memcpy of chunks picked at random from a region as large as the RAM tier (so, like
/// the arena's slots, they come from DRAM, not from the cache) into a reused buffer.
fn memcpy(size: &Size, seed: u64) -> Json {
    let chunks = (size.ram_bytes as usize / size.chunk_bytes).max(1);
    let src: Vec<u8> = (0..chunks * size.chunk_bytes)
        .map(|i| (i % 251) as u8)
        .collect();
    let mut dst = vec![0u8; size.chunk_bytes];
    let mut rng = Rng::new(seed);
    let mut ms = Vec::new();
    let started = Instant::now();
    for _ in 0..size.ops {
        let c = (rng.next_u64() % chunks as u64) as usize;
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(
            &src[c * size.chunk_bytes..(c + 1) * size.chunk_bytes],
        ));
        std::hint::black_box(&dst);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let secs = started.elapsed().as_secs_f64();
    json!({
        "mode": "memcpy",
        "get_gb_per_s": gbps((size.chunk_bytes * size.ops) as u64, secs),
        "get_ms": summary(&ms, 1.0),
    })
}

/// Inline GETs of `inline_probe_bytes` values, all hits.
fn inline_probe(binary: &Path, size: &Size) -> Result<Json> {
    let d = start(binary, 256 << 20, size.inline_probe_bytes)?;
    let mut c = Client::connect(&d.socket, "inline-probe", false)?;
    let value = vec![7u8; size.inline_probe_bytes];
    for k in 0..16 {
        let _ = c.set(key(k), &value, "short", "llama-3.1-8b")?;
    }
    let mut buf = Vec::new();
    let mut ms = Vec::new();
    for i in 0..size.inline_probe_ops {
        let t = Instant::now();
        if !get(&mut c, (i % 16) as u64, &mut buf)? {
            bail!("the inline probe missed");
        }
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(
        json!({"mode": "inline-1MiB", "value_bytes": size.inline_probe_bytes, "get_ms": summary(&ms, 1.0), "p99_ms": quantile(&ms, 0.99)}),
    )
}

/// Runs S6 (RAM tier).
pub fn run(ctx: &Ctx, size: &Size, kvd: &Path) -> Result<Json> {
    // The probe first, on a quiet machine: the big runs leave gigabytes of freed
    // memory behind them.
    eprintln!("  inline GETs of {} bytes", size.inline_probe_bytes);
    let probe = inline_probe(kvd, size)?;
    eprintln!(
        "  memcpy of {} chunks of {} bytes",
        size.ops, size.chunk_bytes
    );
    let copy = memcpy(size, ctx.seed);
    eprintln!(
        "  arena GET (70/30 get/put, working set 2x the {}-byte RAM tier)",
        size.ram_bytes
    );
    let arena = mixed("arena", kvd, size, true, ctx.seed)?;
    eprintln!("  inline GET (same mix)");
    let inline = mixed("inline", kvd, size, false, ctx.seed)?;
    let bw = |r: &Json| r["get_gb_per_s"].as_f64().unwrap_or(0.0);
    let verdicts = json!({
        "arena_share_of_memcpy": bw(&arena) / bw(&copy).max(1e-9),
        "arena_at_least_80_percent_of_memcpy": bw(&arena) >= 0.8 * bw(&copy),
        "inline_1mib_p99_ms": probe["p99_ms"],
        "inline_1mib_p99_under_1ms": probe["p99_ms"].as_f64().is_some_and(|p| p < 1.0),
        "target": "arena GET >= 80% of memcpy bandwidth; inline p99 < 1 ms for 1 MiB",
    });
    Ok(json!({"runs": [copy, arena, inline, probe], "verdicts": verdicts}))
}
