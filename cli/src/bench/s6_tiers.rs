//! S6, the tiers below RAM: a real `infera-kvd` with an NVMe tier (O_DIRECT where the
//! filesystem takes it) and, when a `redis-server` is at hand, a distributed tier.
//! - L3 reads through kvd (every GET a RAM miss, read from disk and promoted) against
//!   the same disk's sequential read of the container file with O_DIRECT, the way kvd
//!   reads it (and `dd iflag=direct` when installed);
//! - L4 get and put latency of chunk-sized values, through kvd's own backend;
//! - the time to reload a `prefix_tokens` prefix of the 8B model from each tier,
//!   against recomputing it (the calibrated prefill model).

use super::s6::{Daemon, gbps, get, key, start_with};
use super::stats::{quantile, summary};
use anyhow::{Context, Result, anyhow, bail};
use infera_kvd::client::{Client, field, request_map};
use infera_kvd::remote::Backend;
use infera_kvd::remote::naming::{clear_pattern, remote_key, seal};
use infera_kvd::remote::redis::{Redis, parse_url};
use infera_kvd::wire::Scope;
use infera_proto::retention::Retention;
use rmpv::Value;
use serde::Deserialize;
use serde_json::{Value as Json, json};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Sizes of the tier part.
#[derive(Debug, Clone, Deserialize)]
pub struct TierSize {
    chunk_bytes: usize,
    /// NVMe container bytes; half of it is written and read back.
    l3_bytes: u64,
    /// Tokens of the reloaded prefix (8B: 128 KiB each).
    prefix_tokens: usize,
    /// L4 gets and puts timed per value size.
    l4_ops: usize,
}

impl TierSize {
    /// The tier sizes of a scenario size.
    pub fn from_value(size: &Json) -> Result<Self> {
        serde_json::from_value(size.clone())
            .context("S6 sizes: chunk_bytes, l3_bytes, prefix_tokens, l4_ops")
    }

    /// Tokens of the reloaded prefix.
    pub fn prefix_tokens(&self) -> usize {
        self.prefix_tokens
    }
}

/// Where the tiers live.
#[derive(Debug, Clone, Default)]
pub struct TierTarget {
    /// Directory for the NVMe tier (default: a temp dir under the output folder).
    pub l3_path: Option<PathBuf>,
    /// A Redis/Valkey to use (default: start `redis-server` from PATH if installed).
    pub redis_url: Option<String>,
    /// Output folder (home of the default L3 directory).
    pub out: PathBuf,
}

const MODEL: &str = "llama-3.1-8b";
/// Pinned host-to-device copy on the calibration card (calib/README.md), GB/s.
const H2D_GBPS: f64 = 54.8;

struct RedisChild {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for RedisChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis() -> Result<Option<RedisChild>> {
    let Ok(found) = which("redis-server") else {
        return Ok(None);
    };
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = std::process::Command::new(found)
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let url = format!("redis://127.0.0.1:{port}");
    let store = Redis::new(
        parse_url(&url).map_err(|e| anyhow!(e))?,
        Duration::from_secs(1),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.exists(&["probe".into()]).is_err() {
        if Instant::now() > deadline {
            bail!("redis-server never answered on {url}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Some(RedisChild {
        child,
        url,
        _dir: dir,
    }))
}

fn which(name: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("{name} not found on PATH"))
}

fn stat(socket: &Path, name: &str) -> Result<u64> {
    let mut c = Client::connect(socket, "bench-stats", false)?;
    let reply = c.request(&request_map("stats", vec![]))?;
    field(&reply, name)
        .and_then(Value::as_u64)
        .ok_or_else(|| anyhow!("stats has no {name}"))
}

fn metric(port: u16, series: &str) -> f64 {
    let text = (|| -> std::io::Result<String> {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })()
    .unwrap_or_default();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .filter(|r| r.starts_with(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

fn kvd(binary: &Path, ram: u64, chunk: usize, metrics: u16, extra: &[String]) -> Result<Daemon> {
    let mut args: Vec<String> = vec![
        "--max-bytes".into(),
        ram.to_string(),
        "--max-value-bytes".into(),
        chunk.to_string(),
        "--metrics-addr".into(),
        format!("127.0.0.1:{metrics}"),
    ];
    args.extend_from_slice(extra);
    start_with(binary, &args)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// GETs keys `0..n` in order; per-GET ms, and the bytes.
fn read_all(socket: &Path, n: u64) -> Result<(Vec<f64>, u64)> {
    let mut c = Client::connect(socket, "bench-reader", true)?;
    let mut buf = Vec::new();
    let mut ms = Vec::new();
    let mut bytes = 0;
    for k in 0..n {
        let t = Instant::now();
        if !get(&mut c, k, &mut buf)? {
            bail!("key {k} missed");
        }
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        bytes += buf.len() as u64;
    }
    Ok((ms, bytes))
}

fn write_all(socket: &Path, n: u64, chunk: &[u8], retention: &str) -> Result<()> {
    let mut c = Client::connect(socket, "bench-writer", true)?;
    for k in 0..n {
        c.set(key(k), chunk, retention, MODEL)?
            .map_err(|r| anyhow!("kvd refused key {k}: {r}"))?;
    }
    Ok(())
}

fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !cond()? {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Sequential O_DIRECT reads of `bytes` of `path` in `block`-byte reads, as kvd reads.
fn direct_read(path: &Path, bytes: u64, block: usize) -> Result<f64> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("opening {} with O_DIRECT", path.display()))?;
    let mut raw = vec![0u8; block + 4096];
    let start = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[start..start + block];
    let mut done = 0u64;
    let t = Instant::now();
    while done < bytes {
        let n = f.read(buf)?;
        if n == 0 {
            break;
        }
        done += n as u64;
    }
    Ok(gbps(done, t.elapsed().as_secs_f64()))
}

/// `dd if=path of=/dev/null bs=block count=n iflag=direct`, its GB/s.
fn dd(path: &Path, block: usize, count: u64) -> Option<f64> {
    let t = Instant::now();
    let out = std::process::Command::new("dd")
        .arg(format!("if={}", path.display()))
        .args([
            "of=/dev/null",
            &format!("bs={block}"),
            &format!("count={count}"),
            "iflag=direct",
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| gbps(block as u64 * count, t.elapsed().as_secs_f64()))
}

fn fs_type(dir: &Path) -> String {
    std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// What every part of the run shares.
struct Bench<'a> {
    binary: &'a Path,
    chunk: Vec<u8>,
    /// Flags of a kvd with the NVMe tier.
    l3_flags: Vec<String>,
    prefix_chunks: u64,
    prefix_tokens: usize,
}

impl Bench<'_> {
    fn chunk_bytes(&self) -> usize {
        self.chunk.len()
    }

    fn prefix_bytes(&self) -> u64 {
        self.prefix_chunks * self.chunk_bytes() as u64
    }

    /// A kvd whose RAM holds the whole prefix.
    fn roomy_kvd(&self, extra: &[String]) -> Result<Daemon> {
        let ram = self.prefix_bytes() + 2 * self.chunk_bytes() as u64;
        kvd(self.binary, ram, self.chunk_bytes(), free_port()?, extra)
    }

    /// Writes `n` chunks as `long` into the NVMe tier, then reads them back through a
    /// restarted kvd: the row, kvd's own L3 read GB/s, and whether it used O_DIRECT.
    fn l3_read(&self, n: u64) -> Result<(Json, f64, bool)> {
        let chunk_bytes = self.chunk_bytes();
        let small_ram = (2 * chunk_bytes as u64).max(64 << 20);
        let port = free_port()?;
        let d = kvd(self.binary, small_ram, chunk_bytes, port, &self.l3_flags)?;
        let t = Instant::now();
        write_all(&d.socket, n, &self.chunk, "long")?;
        let expected = n * chunk_bytes as u64;
        wait_until("the working set on disk", Duration::from_secs(3600), || {
            Ok(stat(&d.socket, "long_bytes")? >= expected)
        })?;
        let write_gbps = gbps(expected, t.elapsed().as_secs_f64());
        let direct = metric(port, "infera_kvd_nvme_devices{io=\"direct\"}") >= 1.0;
        d.stop()?;
        let t = Instant::now();
        let port = free_port()?;
        let d = kvd(self.binary, small_ram, chunk_bytes, port, &self.l3_flags)?;
        let recovery_s = t.elapsed().as_secs_f64();
        eprintln!("  L3 read back through kvd");
        let t = Instant::now();
        let (ms, bytes) = read_all(&d.socket, n)?;
        let client_gbps = gbps(bytes, t.elapsed().as_secs_f64());
        let read_ns = metric(
            port,
            "infera_kvd_tier_read_nanoseconds_total{tier=\"nvme\"}",
        );
        let read_bytes = metric(port, "infera_kvd_tier_read_bytes_total{tier=\"nvme\"}");
        let daemon_gbps = if read_ns > 0.0 {
            read_bytes / read_ns
        } else {
            0.0
        };
        d.stop()?;
        let row = json!({
            "mode": "l3-get-via-kvd",
            "hit_ratio": 1.0,
            "get_gb_per_s": client_gbps,
            "l3_read_gb_per_s": daemon_gbps,
            "get_ms": summary(&ms, 1.0),
            "write_gb_per_s": write_gbps,
            "recovery_s": recovery_s,
            "o_direct": direct,
        });
        Ok((row, daemon_gbps, direct))
    }

    /// The prefix's chunks read in order from a fresh kvd started with `extra`: the row
    /// and the total ms.
    fn reload(&self, tier: &str, extra: &[String]) -> Result<(Json, f64)> {
        let d = self.roomy_kvd(extra)?;
        if extra.is_empty() {
            write_all(&d.socket, self.prefix_chunks, &self.chunk, "short")?;
            // First touch of the client's mapping is not reload cost: read once first.
            read_all(&d.socket, self.prefix_chunks)?;
        }
        let (ms, _) = read_all(&d.socket, self.prefix_chunks)?;
        let total: f64 = ms.iter().sum();
        let row = json!({
            "mode": format!("reload-{}-tokens-{tier}", self.prefix_tokens),
            "get_gb_per_s": gbps(self.prefix_bytes(), total / 1e3),
            "get_ms": summary(&ms, 1.0),
            "total_ms": total,
        });
        Ok((row, total))
    }

    /// Get and put latency of 1 MiB and chunk-sized values through kvd's backend.
    fn l4_latency(&self, store: &Redis, ops: usize) -> Result<Vec<Json>> {
        let scope = model_scope("bench");
        let mut sizes = vec![1usize << 20, self.chunk_bytes()];
        sizes.dedup();
        let mut rows = Vec::new();
        for bytes in sizes {
            let sealed = seal(&self.chunk[..bytes.min(self.chunk.len())], Retention::Long);
            let (mut puts, mut gets) = (Vec::new(), Vec::new());
            for i in 0..ops as u64 {
                let name = remote_key(BENCH_NAMESPACE, &scope, &key(i + ((bytes as u64) << 20)));
                let t = Instant::now();
                store
                    .put(&name, &sealed, None)
                    .map_err(|e| anyhow!("put: {e}"))?;
                puts.push(t.elapsed().as_secs_f64() * 1e3);
                let t = Instant::now();
                store
                    .get(&name)
                    .map_err(|e| anyhow!("get: {e}"))?
                    .ok_or_else(|| anyhow!("get missed"))?;
                gets.push(t.elapsed().as_secs_f64() * 1e3);
            }
            rows.push(json!({
                "mode": format!("l4-redis-{}KiB", bytes >> 10),
                "get_gb_per_s": gbps(bytes as u64 * ops as u64, gets.iter().sum::<f64>() / 1e3),
                "get_ms": summary(&gets, 1.0),
                "put_ms": summary(&puts, 1.0),
                "put_p99_ms": quantile(&puts, 0.99),
            }));
        }
        let _ = store.clear(&clear_pattern(BENCH_NAMESPACE, &Scope::default()));
        Ok(rows)
    }

    /// Writes the prefix behind to the store through one kvd, then reloads it through
    /// another with nothing in RAM.
    fn l4_reload(&self, store: &Redis, url: &str) -> Result<(Json, f64)> {
        let remote = [
            "--remote-url".to_owned(),
            url.to_owned(),
            "--remote-timeout-ms".into(),
            "10000".into(),
        ];
        let w = self.roomy_kvd(&remote)?;
        write_all(&w.socket, self.prefix_chunks, &self.chunk, "long")?;
        let names: Vec<String> = (0..self.prefix_chunks)
            .map(|k| remote_key("infera-kvd", &model_scope(""), &key(k)))
            .collect();
        wait_until(
            "the prefix written behind to L4",
            Duration::from_secs(600),
            || Ok(store.exists(&names).is_ok_and(|v| v.iter().all(|b| *b))),
        )?;
        drop(w);
        let reloaded = self.reload("remote", &remote);
        let _ = store.clear(&clear_pattern("infera-kvd", &Scope::default()));
        reloaded
    }
}

/// Namespace of the latency probe's keys.
const BENCH_NAMESPACE: &str = "infera-bench";

fn model_scope(compat_key: &str) -> Scope {
    Scope {
        model: MODEL.into(),
        compat_key: compat_key.into(),
    }
}

/// Runs the tier part of S6.
pub fn run(size: &TierSize, binary: &Path, target: &TierTarget, recompute_ms: f64) -> Result<Json> {
    let chunk_bytes = size.chunk_bytes;
    std::fs::create_dir_all(&target.out)?;
    let l3_dir = match &target.l3_path {
        Some(p) => tempfile::Builder::new()
            .prefix("infera-s6-l3-")
            .tempdir_in(p)?,
        None => tempfile::Builder::new()
            .prefix(".infera-s6-l3-")
            .tempdir_in(&target.out)?,
    };
    let l3 = l3_dir
        .path()
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path"))?
        .to_owned();
    let bench = Bench {
        binary,
        chunk: (0..chunk_bytes).map(|i| (i % 251) as u8).collect(),
        l3_flags: vec![
            "--long-path".into(),
            l3.clone(),
            "--long-bytes".into(),
            size.l3_bytes.to_string(),
            "--long-min-free-bytes".into(),
            "0".into(),
        ],
        prefix_chunks: (size.prefix_tokens * 131_072).div_ceil(chunk_bytes) as u64,
        prefix_tokens: size.prefix_tokens,
    };
    let n = size.l3_bytes / 2 / chunk_bytes as u64;
    let mut runs = Vec::new();

    eprintln!(
        "  L3 on {l3} ({}): writing {n} chunks of {chunk_bytes} bytes",
        fs_type(l3_dir.path())
    );
    let (row, daemon_gbps, direct) = bench.l3_read(n)?;
    runs.push(row);
    eprintln!("  the disk's own sequential read (O_DIRECT)");
    let container = l3_dir.path().join("kvd-l3.data");
    let disk_gbps = direct_read(&container, n * chunk_bytes as u64, chunk_bytes)?;
    runs.push(json!({"mode": "disk-seq-read-o_direct", "get_gb_per_s": disk_gbps}));
    if let Some(g) = dd(&container, chunk_bytes, n) {
        runs.push(json!({"mode": "dd-iflag-direct", "get_gb_per_s": g}));
    }

    eprintln!(
        "  reloading {} tokens ({} bytes) from RAM and from L3",
        size.prefix_tokens,
        bench.prefix_bytes()
    );
    let mut reload = serde_json::Map::new();
    for (tier, flags) in [("ram", Vec::new()), ("nvme", bench.l3_flags.clone())] {
        let (row, total) = bench.reload(tier, &flags)?;
        runs.push(row);
        reload.insert(tier.into(), json!(total));
    }

    let spawned;
    let redis_url = match &target.redis_url {
        Some(u) => Some(u.clone()),
        None => {
            spawned = start_redis()?;
            spawned.as_ref().map(|r| r.url.clone())
        }
    };
    let mut l4 = Json::Null;
    if let Some(url) = &redis_url {
        eprintln!("  L4 on {url}: get/put latency, then reloading the prefix");
        let store = Redis::new(
            parse_url(url).map_err(|e| anyhow!(e))?,
            Duration::from_secs(10),
        );
        let rows = bench.l4_latency(&store, size.l4_ops)?;
        runs.extend(rows.iter().cloned());
        let (row, total) = bench.l4_reload(&store, url)?;
        runs.push(row);
        reload.insert("remote".into(), json!(total));
        l4 = json!({"url": url, "rows": rows});
    } else {
        eprintln!("  L4 skipped: no --redis-url and no redis-server on PATH");
    }
    let prefix_bytes = bench.prefix_bytes();
    let verdicts = json!({
        "l3_share_of_disk_seq_read": daemon_gbps / disk_gbps.max(1e-9),
        "l3_at_least_70_percent_of_disk": daemon_gbps >= 0.7 * disk_gbps,
        "l3_o_direct": direct,
        "reload_ms": reload,
        "reload_prefix_bytes": prefix_bytes,
        "recompute_ms": recompute_ms,
        "reload_pays_above_gb_per_s": prefix_bytes as f64 / (recompute_ms * 1e6),
        "host_to_device_ms_at_54_8_gbps": prefix_bytes as f64 / (H2D_GBPS * 1e9) * 1e3,
        "l4": l4,
        "tiers_target": "L3 >= 70% of the disk's sequential read (both with O_DIRECT)",
    });
    Ok(json!({"runs": runs, "verdicts": verdicts}))
}
