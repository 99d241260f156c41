//! kvd's NVMe (L3) and distributed (L4) tiers, run as users run them: the real binary,
//! real files (O_DIRECT where the filesystem takes it, a tmpfs mount for a full disk),
//! a real redis-server. Killed with SIGKILL mid-write, restarted, every read is the
//! written bytes or a miss; damage is a miss; a full disk, a dead or silent store are
//! counted misses and the daemon serves on.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use infera_kvd::client::{Client, field, request_map};
use infera_kvd::remote::Backend;
use infera_kvd::remote::naming::{remote_key, unseal};
use infera_kvd::remote::redis::{Redis, parse_url};
use infera_kvd::wire::Scope;
use infera_testkit::redis::RedisServer;
use rmpv::Value;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::{Kvd, key, labelled, start, value_for, wait_for};

const KIB64: usize = 64 << 10;
const WAIT: Duration = Duration::from_secs(30);

fn client(kvd: &Kvd) -> Client {
    Client::connect(&kvd.socket, "tiers-test", true).unwrap()
}

fn stat(kvd: &Kvd, name: &str) -> u64 {
    let mut c = Client::connect(&kvd.socket, "stats", false).unwrap();
    let reply = c.request(&request_map("stats", vec![])).unwrap();
    field(&reply, name).and_then(Value::as_u64).unwrap()
}

fn series(kvd: &Kvd, s: &str) -> f64 {
    labelled(kvd.metrics, s)
}

fn stop(mut kvd: Kvd) {
    kvd.process.terminate();
    wait_for("kvd to exit on SIGTERM", WAIT, || {
        kvd.process.exited().is_some()
    });
}

fn l3_args<'a>(dir: &'a str, bytes: &'a str, ram: &'a str) -> Vec<&'a str> {
    vec![
        "--max-bytes",
        ram,
        "--long-path",
        dir,
        "--long-bytes",
        bytes,
        "--long-min-free-bytes",
        "0",
    ]
}

fn fs_type(dir: &Path) -> String {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn clear(c: &mut Client, model: &str) -> u64 {
    let reply = c
        .request(&request_map("clear", vec![("model", Value::from(model))]))
        .unwrap();
    field(&reply, "cleared_entries")
        .and_then(Value::as_u64)
        .unwrap()
}

#[test]
fn long_entries_live_on_disk_across_restarts_and_hits_come_up_into_ram() {
    let l3 = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = l3.path().to_str().unwrap();
    let args = l3_args(dir, "33554432", "2097152");
    let kvd = start(&args);
    let mut c = client(&kvd);
    c.set(key(1000), &value_for(1000, KIB64), "short", "m")
        .unwrap()
        .unwrap();
    for n in 0..64 {
        c.set(key(n), &value_for(n, KIB64), "long", "m")
            .unwrap()
            .unwrap();
    }
    wait_for("64 entries on disk", WAIT, || {
        series(&kvd, "infera_kvd_tier_entries{tier=\"nvme\"}") == 64.0
    });
    // Disk filesystems take O_DIRECT; others may not (then the device is buffered).
    let disk_fs = matches!(fs_type(l3.path()).as_str(), "ext2/ext3" | "xfs" | "btrfs");
    let io = if disk_fs { "direct" } else { "buffered" };
    assert_eq!(
        series(&kvd, &format!("infera_kvd_nvme_devices{{io=\"{io}\"}}")),
        1.0,
        "{} on {}",
        io,
        fs_type(l3.path())
    );
    for n in 0..64 {
        assert_eq!(
            c.get(key(n), "m").unwrap(),
            Some(value_for(n, KIB64)),
            "key {n}"
        );
    }
    let from_disk = series(&kvd, "infera_kvd_tier_hits_total{tier=\"nvme\"}");
    assert!(
        from_disk >= 33.0,
        "2 MiB of RAM holds at most 31 of 64: {from_disk}"
    );
    assert_eq!(
        series(&kvd, "infera_kvd_tier_promotions_total{tier=\"nvme\"}"),
        from_disk
    );
    // Copies brought up from disk give way to new writes of any class.
    c.set(key(2000), &value_for(2000, KIB64), "short", "m")
        .unwrap()
        .expect("a promoted copy is evicted for a short write");
    let refused = c.set(key(5), b"x", "short", "m").unwrap();
    assert!(
        refused
            .as_ref()
            .is_err_and(|r| r.contains("retention downgrade")),
        "{refused:?}"
    );
    assert_eq!(stat(&kvd, "long_bytes"), 64 * KIB64 as u64);
    stop(kvd);

    let kvd = start(&args);
    // A client without the arena gets the bytes inline, also when they come from disk.
    let mut inline = Client::connect(&kvd.socket, "inline", false).unwrap();
    assert!(inline.arena().is_none());
    for n in [3, 40, 63] {
        assert!(
            inline.get(key(n), "m").unwrap() == Some(value_for(n, KIB64)),
            "key {n} inline"
        );
    }
    stop(kvd);

    let kvd = start(&args);
    let mut c = client(&kvd);
    assert_eq!(
        c.get(key(1000), "m").unwrap(),
        None,
        "short entries stay in RAM"
    );
    for n in (0..64).rev() {
        assert_eq!(
            c.get(key(n), "m").unwrap(),
            Some(value_for(n, KIB64)),
            "key {n} after a restart"
        );
    }
    assert_eq!(
        (stat(&kvd, "hits_total"), stat(&kvd, "misses_total")),
        (64, 1),
        "a hit on disk is a hit"
    );
    stop(kvd);

    // prefetch_hint warms entries into RAM; the gets that follow are RAM hits.
    let kvd = start(&args);
    let mut c = client(&kvd);
    let keys: Vec<Value> = (0..8).map(|n| Value::Binary(key(n).to_vec())).collect();
    c.send(&request_map(
        "prefetch_hint",
        vec![("keys", Value::Array(keys)), ("model", Value::from("m"))],
    ))
    .unwrap();
    wait_for("8 keys prefetched", WAIT, || {
        series(&kvd, "infera_kvd_prefetch_keys_total{outcome=\"warmed\"}") == 8.0
    });
    let disk_hits = series(&kvd, "infera_kvd_tier_hits_total{tier=\"nvme\"}");
    for n in 0..8 {
        assert_eq!(c.get(key(n), "m").unwrap(), Some(value_for(n, KIB64)));
    }
    assert_eq!(
        series(&kvd, "infera_kvd_tier_hits_total{tier=\"ram\"}"),
        8.0
    );
    assert_eq!(
        series(&kvd, "infera_kvd_tier_hits_total{tier=\"nvme\"}"),
        disk_hits
    );

    // clear removes them from disk too, for good.
    assert!(clear(&mut c, "m") >= 64);
    assert_eq!(c.get(key(20), "m").unwrap(), None);
    stop(kvd);
    let kvd = start(&args);
    let mut c = client(&kvd);
    assert_eq!(
        c.get(key(20), "m").unwrap(),
        None,
        "cleared before the restart"
    );
    assert_eq!(series(&kvd, "infera_kvd_tier_entries{tier=\"nvme\"}"), 0.0);
}

fn len_of(n: u64) -> usize {
    if n.is_multiple_of(1_000_000) {
        KIB64
    } else {
        4096 + (n as usize * 7919) % (KIB64 - 4096)
    }
}

#[test]
fn killed_mid_write_every_read_is_the_written_bytes_or_a_miss() {
    let l3 = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = l3.path().to_str().unwrap();
    // 64 slots of 64 KiB on disk, so slots are reused many times over.
    let args = l3_args(dir, "4194304", "1048576");
    let mut attempted = Vec::new();
    for round in 0..3u64 {
        let mut kvd = start(&args);
        let acked = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let socket = kvd.socket.clone();
            let (acked, stop) = (acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket, "writer", true).unwrap();
                let mut tried = Vec::new();
                for i in 0.. {
                    let n = round * 1_000_000 + i;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    tried.push(n);
                    match c.set(key(n), &value_for(n, len_of(n)), "long", "m") {
                        Ok(Ok(())) => acked.fetch_add(1, Ordering::Relaxed),
                        Ok(Err(reason)) => panic!("refused: {reason}"),
                        Err(_) => break,
                    };
                }
                tried
            })
        };
        wait_for("writes on disk and many more acknowledged", WAIT, || {
            acked.load(Ordering::Relaxed) >= 300 && stat(&kvd, "long_bytes") > 0
        });
        kvd.process.kill();
        stop.store(true, Ordering::Relaxed);
        attempted.extend(writer.join().unwrap());
    }
    let kvd = start(&args);
    let mut c = client(&kvd);
    let (mut recovered, mut missed) = (0, 0);
    for &n in &attempted {
        match c.get(key(n), "m").unwrap() {
            Some(v) => {
                assert!(
                    v == value_for(n, len_of(n)),
                    "key {n}: wrong bytes after a crash"
                );
                recovered += 1;
            }
            None => missed += 1,
        }
    }
    assert!(recovered > 0, "nothing survived ({missed} misses)");
    assert!(missed > 0, "64 slots cannot hold {} keys", attempted.len());
}

#[test]
fn a_torn_journal_and_damaged_data_are_misses_not_wrong_bytes() {
    let l3 = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = l3.path().to_str().unwrap();
    let args = l3_args(dir, "4194304", "1048576");
    let kvd = start(&args);
    let mut c = client(&kvd);
    for n in 0..8 {
        c.set(key(n), &value_for(n, KIB64), "long", "m")
            .unwrap()
            .unwrap();
        // One at a time, so key n is in slot n and the journal's last record is key 7.
        wait_for("the entry on disk", WAIT, || {
            series(&kvd, "infera_kvd_tier_entries{tier=\"nvme\"}") == (n + 1) as f64
        });
    }
    stop(kvd);
    let journal = l3.path().join("kvd-l3.journal");
    let len = std::fs::metadata(&journal).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let data = l3.path().join("kvd-l3.data");
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&data, bytes).unwrap();

    let kvd = start(&args);
    let mut c = client(&kvd);
    let got: Vec<Option<Vec<u8>>> = (0..8).map(|n| c.get(key(n), "m").unwrap()).collect();
    for (n, v) in got.iter().enumerate() {
        match n {
            0 | 7 => assert_eq!(*v, None, "key {n} is damaged or torn"),
            _ => assert_eq!(
                v.as_deref(),
                Some(&value_for(n as u64, KIB64)[..]),
                "key {n}"
            ),
        }
    }
    assert_eq!(
        series(
            &kvd,
            "infera_kvd_tier_failures_total{tier=\"nvme\",op=\"read\",reason=\"corrupt\"}"
        ),
        1.0
    );
    let log = std::fs::read_to_string(kvd.dir.path().join("kvd.log")).unwrap();
    assert!(log.contains("torn or damaged tail"), "{log}");
}

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_full_disk_and_the_free_space_floor_cost_writes_not_the_daemon() {
    let (mnt, _guard) = mount("tmpfs", "size=16m");
    let dir = mnt.path().join("l3");
    let dir = dir.to_str().unwrap();
    let args = l3_args(dir, "12582912", "1048576");
    let kvd = start(&args);
    let mut c = client(&kvd);
    for n in 0..4 {
        c.set(key(n), &value_for(n, KIB64), "long", "m")
            .unwrap()
            .unwrap();
    }
    wait_for("4 entries on disk", WAIT, || {
        series(&kvd, "infera_kvd_tier_entries{tier=\"nvme\"}") == 4.0
    });
    {
        use std::io::Write;
        let mut filler = std::fs::File::create(mnt.path().join("filler")).unwrap();
        while filler.write_all(&[7u8; 1 << 16]).is_ok() {}
    }
    let no_space = "infera_kvd_tier_failures_total{tier=\"nvme\",op=\"write\",reason=\"no_space\"}";
    let mut n = 100;
    while series(&kvd, no_space) < 1.0 {
        assert!(n < 400, "the journal never hit the full disk");
        c.set(key(n), &value_for(n, KIB64), "long", "m")
            .unwrap()
            .expect("RAM still takes the write");
        n += 1;
        wait_for("the write to be tried on disk", WAIT, || {
            series(&kvd, "infera_kvd_tier_queued_writes{tier=\"nvme\"}") == 0.0
        });
    }
    // The disk stays full: 30 more long writes are taken by RAM (15 slots) and fail on
    // disk, so at least 15 of them are misses now, counted, and never wrong bytes.
    let failed_before = series(&kvd, no_space);
    let first = n;
    for k in first..first + 30 {
        c.set(key(k), &value_for(k, KIB64), "long", "m")
            .unwrap()
            .expect("RAM still takes the write");
    }
    wait_for("30 failed disk writes", WAIT, || {
        series(&kvd, no_space) >= failed_before + 30.0
    });
    let misses_before = stat(&kvd, "misses_total");
    let mut misses = 0;
    for k in 100..first + 30 {
        match c.get(key(k), "m").unwrap() {
            Some(v) => assert!(v == value_for(k, KIB64), "key {k}"),
            None => misses += 1,
        }
    }
    assert!(misses >= 15, "{misses} misses");
    assert_eq!(stat(&kvd, "misses_total") - misses_before, misses);
    for k in 0..4 {
        assert_eq!(
            c.get(key(k), "m").unwrap(),
            Some(value_for(k, KIB64)),
            "written before the disk filled"
        );
    }
    stop(kvd);

    // Restarted with a floor above what is free: the container shrinks to stay clear of
    // it and writes stop, counted.
    let mut args = args.clone();
    args.extend(["--long-min-free-bytes", "1048576"]);
    let kvd = start(&args);
    let mut c = client(&kvd);
    let below = "infera_kvd_tier_failures_total{tier=\"nvme\",op=\"write\",reason=\"below_floor\"}";
    let mut n = 900;
    while series(&kvd, below) < 1.0 {
        assert!(n < 1000, "writes never stopped at the floor");
        c.set(key(n), &value_for(n, KIB64), "long", "m")
            .unwrap()
            .unwrap();
        n += 1;
        wait_for("the write to be tried on disk", WAIT, || {
            series(&kvd, "infera_kvd_tier_queued_writes{tier=\"nvme\"}") == 0.0
        });
    }
    assert_eq!(c.get(key(2), "m").unwrap(), Some(value_for(2, KIB64)));
}

fn mount(kind: &str, options: &str) -> (tempfile::TempDir, Mount) {
    let mnt = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", kind, "-o", options, kind])
        .arg(mnt.path())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "mounting a {kind} needs root (the README's test command runs as root)"
    );
    let guard = Mount(mnt.path().to_owned());
    (mnt, guard)
}

#[test]
fn a_filesystem_without_o_direct_is_used_buffered_and_says_so() {
    let (mnt, _guard) = mount("ramfs", "mode=0700");
    let dir = mnt.path().join("l3");
    let dir = dir.to_str().unwrap();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_infera-kvd"))
        .args([
            "--socket",
            mnt.path().join("s.sock").to_str().unwrap(),
            "--metrics-addr",
            "",
        ])
        .args(l3_args(dir, "8388608", "1048576"))
        .args(["--io-mode", "direct"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(
        err.contains("refuses O_DIRECT") && err.contains("--io-mode auto"),
        "{err}"
    );

    let kvd = start(&l3_args(dir, "8388608", "1048576"));
    let log = std::fs::read_to_string(kvd.dir.path().join("kvd.log")).unwrap();
    assert!(log.contains("refuses O_DIRECT"), "{log}");
    assert_eq!(
        series(&kvd, "infera_kvd_nvme_devices{io=\"buffered\"}"),
        1.0
    );
    let mut c = client(&kvd);
    c.set(key(1), &value_for(1, KIB64), "long", "m")
        .unwrap()
        .unwrap();
    wait_for("the entry on disk", WAIT, || {
        series(&kvd, "infera_kvd_tier_entries{tier=\"nvme\"}") == 1.0
    });
    stop(kvd);
    let kvd = start(&l3_args(dir, "8388608", "1048576"));
    assert_eq!(
        client(&kvd).get(key(1), "m").unwrap(),
        Some(value_for(1, KIB64))
    );
}

fn name(n: u64) -> String {
    remote_key(
        "infera-kvd",
        &Scope {
            model: "m".into(),
            compat_key: String::new(),
        },
        &key(n),
    )
}

#[test]
fn redis_shares_long_entries_across_hosts_and_a_dead_store_is_a_counted_miss() {
    let mut redis = RedisServer::start().unwrap();
    let url = redis.url();
    let store = Redis::new(parse_url(&url).unwrap(), Duration::from_secs(2));
    let a = start(&[
        "--max-bytes",
        "1048576",
        "--remote-url",
        &url,
        "--remote-retry-ms",
        "200",
    ]);
    let mut ca = client(&a);
    ca.set(key(99), &value_for(99, KIB64), "short", "m")
        .unwrap()
        .unwrap();
    for n in 0..20 {
        ca.set(key(n), &value_for(n, KIB64), "long", "m")
            .unwrap()
            .unwrap();
    }
    let names: Vec<String> = (0..20).map(name).collect();
    wait_for("20 entries written behind", WAIT, || {
        store.exists(&names).unwrap().iter().all(|b| *b)
    });
    assert_eq!(
        store.exists(&[name(99)]).unwrap(),
        vec![false],
        "short stays local"
    );
    let (stored, ttl) = store.get(&name(3)).unwrap().unwrap();
    assert_eq!(&unseal(stored).unwrap().0[..], &value_for(3, KIB64)[..]);
    assert_eq!(ttl, None, "written without a TTL");
    store
        .put("ttl-probe", b"x", Some(Duration::from_secs(60)))
        .unwrap();
    let (_, ttl) = store.get("ttl-probe").unwrap().unwrap();
    let ttl = ttl.unwrap();
    assert!(
        ttl > Duration::from_secs(50) && ttl <= Duration::from_secs(60),
        "{ttl:?}"
    );

    // Another host's kvd reads them through.
    let b = start(&[
        "--max-bytes",
        "1048576",
        "--remote-url",
        &url,
        "--remote-retry-ms",
        "60000",
    ]);
    let mut cb = client(&b);
    for n in 0..20 {
        assert_eq!(
            cb.get(key(n), "m").unwrap(),
            Some(value_for(n, KIB64)),
            "key {n}"
        );
    }
    assert_eq!(
        series(&b, "infera_kvd_tier_hits_total{tier=\"remote\"}"),
        20.0
    );
    let reply = cb
        .request(&request_map(
            "exists",
            vec![
                (
                    "keys",
                    Value::Array(vec![
                        Value::Binary(key(0).to_vec()),
                        Value::Binary(key(500).to_vec()),
                    ]),
                ),
                ("model", Value::from("m")),
            ],
        ))
        .unwrap();
    assert_eq!(
        field(&reply, "present").unwrap(),
        &Value::Array(vec![Value::from(true), Value::from(false)])
    );
    assert_eq!(
        cb.get(key(7), "other-model").unwrap(),
        None,
        "namespaced by model"
    );

    // A host with both tiers keeps what it read from the store on its disk too.
    let l3 = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut both_args = l3_args(l3.path().to_str().unwrap(), "8388608", "1048576");
    both_args.extend(["--remote-url", &url]);
    let both = start(&both_args);
    let mut cboth = client(&both);
    for n in 0..5 {
        assert!(cboth.get(key(n), "m").unwrap() == Some(value_for(n, KIB64)));
    }
    wait_for("the store's answers kept on disk", WAIT, || {
        series(&both, "infera_kvd_tier_entries{tier=\"nvme\"}") == 5.0
    });
    stop(both);

    // The store dies: lookups miss (counted), writes are still taken.
    redis.kill();
    let both = start(&both_args);
    let mut cboth = client(&both);
    for n in 0..5 {
        assert!(
            cboth.get(key(n), "m").unwrap() == Some(value_for(n, KIB64)),
            "key {n} from disk"
        );
    }
    assert_eq!(
        series(&both, "infera_kvd_tier_hits_total{tier=\"nvme\"}"),
        5.0
    );
    let started = Instant::now();
    assert_eq!(cb.get(key(500), "m").unwrap(), None);
    assert_eq!(cb.get(key(501), "m").unwrap(), None);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        series(
            &b,
            "infera_kvd_tier_failures_total{tier=\"remote\",op=\"read\",reason=\"unavailable\"}"
        ) >= 2.0
    );
    assert_eq!(series(&b, "infera_kvd_remote_up"), 0.0);
    ca.set(key(200), &value_for(200, KIB64), "long", "m")
        .unwrap()
        .unwrap();

    // It comes back: writing behind resumes after the pause, and the pooled
    // connections the dead server left behind are replaced, not failures.
    redis.restart().unwrap();
    let again = store.exists(&[name(0)]);
    assert!(
        again.is_ok(),
        "a dead pooled connection is replaced: {again:?}"
    );
    wait_for("writes to resume", WAIT, || {
        ca.set(key(201), &value_for(201, KIB64), "long", "m")
            .unwrap()
            .unwrap();
        store.exists(&[name(201)]).is_ok_and(|v| v == vec![true])
    });
    clear(&mut ca, "m");
    wait_for("clear to reach the store", WAIT, || {
        store.exists(&[name(201)]).is_ok_and(|v| v == vec![false])
    });
}

#[test]
fn a_store_that_never_answers_costs_a_lookup_its_timeout_then_is_skipped() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let kvd = start(&[
        "--remote-url",
        &url,
        "--remote-timeout-ms",
        "100",
        "--remote-retry-ms",
        "60000",
    ]);
    let mut c = client(&kvd);
    let started = Instant::now();
    assert_eq!(c.get(key(1), "m").unwrap(), None);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        series(
            &kvd,
            "infera_kvd_tier_failures_total{tier=\"remote\",op=\"read\",reason=\"timeout\"}"
        ),
        1.0
    );
    assert_eq!(c.get(key(2), "m").unwrap(), None);
    assert_eq!(
        series(
            &kvd,
            "infera_kvd_tier_failures_total{tier=\"remote\",op=\"read\",reason=\"unavailable\"}"
        ),
        1.0,
        "skipped, not waited on"
    );
    c.set(key(3), b"v", "long", "m").unwrap().unwrap();
    assert_eq!(
        c.get(key(3), "m").unwrap(),
        Some(b"v".to_vec()),
        "RAM serves on"
    );
    drop(silent);
}

/// A value that says which key and version it is, so a reader can check any bytes it is
/// given without knowing which write won.
fn versioned(n: u64, version: u64) -> Vec<u8> {
    let len = 8192 + (n as usize * 4099 + version as usize * 577) % (KIB64 - 8192);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&n.to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&value_for(n * 1_000_003 + version, len - 16));
    v
}

fn check(n: u64, bytes: &[u8]) {
    assert!(bytes.len() >= 16, "key {n}: {} bytes", bytes.len());
    let key_of = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let version = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    assert_eq!(key_of, n, "key {n} answered with key {key_of}'s bytes");
    assert!(
        bytes == versioned(n, version),
        "key {n} version {version}: torn bytes"
    );
}

#[test]
fn concurrent_writes_reads_and_clears_never_answer_wrong_bytes() {
    let l3 = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // 15 RAM slots and 32 disk slots for 48 keys: constant eviction, promotion and slot
    // reuse on both tiers while values are read.
    let args = l3_args(l3.path().to_str().unwrap(), "2097152", "1048576");
    let kvd = start(&args);
    let socket = kvd.socket.clone();
    // The first value fixes both slot sizes: the largest one.
    client(&kvd)
        .set(key(999), &value_for(999, KIB64), "long", "m")
        .unwrap()
        .unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                // Two writers, a reader through the arena and one inline.
                let mut c = Client::connect(&socket, "stress", t != 3).unwrap();
                let mut hits = 0;
                for i in 0..1500u64 {
                    let n = (i * 7 + t * 13) % 48;
                    if t < 2 {
                        let stored = c.set(key(n), &versioned(n, i * 2 + t), "long", "m");
                        assert_eq!(stored.unwrap(), Ok(()));
                        if t == 0 && i % 300 == 299 {
                            let reply = c
                                .request(&request_map("clear", vec![("model", Value::from("m"))]))
                                .unwrap();
                            assert!(field(&reply, "cleared_entries").is_some());
                        }
                    } else if let Some(v) = c.get(key(n), "m").unwrap() {
                        check(n, &v);
                        hits += 1;
                    }
                }
                hits
            })
        })
        .collect();
    let hits: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(hits > 0, "the readers found nothing");
    assert!(series(&kvd, "infera_kvd_tier_hits_total{tier=\"nvme\"}") > 0.0);
    assert!(
        kvd.process
            .log_tail(50)
            .lines()
            .all(|l| !l.contains("panicked"))
    );
}
