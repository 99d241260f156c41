//! The `infera-kvd` binary as engines use it: a Python client written from the field
//! table alone does the whole handshake with fd passing and every op; the Rust client
//! reads in place; a writer killed while holding a lease gives its slot back; the socket
//! is owner-only; `stats`, `/metrics` and SIGTERM behave.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_kvd::client::{Client, field, request_map};
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{metric, metrics, start};

const MSGPACK: &str = "msgpack==1.2.4";

#[test]
fn a_python_client_from_the_field_table_does_every_op_and_reads_in_place() {
    let kvd = start(&[]);
    let python = infera_testkit::python_tools::python_with(MSGPACK).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/kvd_client.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&kvd.socket)
        .arg((1u64 << 20).to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "python client:\n{stdout}\n{}\nkvd log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        kvd.process.log_tail(30)
    );
    assert_eq!(
        std::fs::metadata(&kvd.socket).unwrap().permissions().mode() & 0o777,
        0o600,
        "owner-only socket"
    );
    let text = metrics(kvd.metrics);
    for name in [
        "infera_kvd_hits_total",
        "infera_kvd_op_duration_seconds_count{op=\"get\"}",
        "infera_kvd_errors_total{code=\"unknown_op\"}",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
}

#[test]
fn the_rust_client_reads_in_place_and_a_killed_writer_gives_its_slot_back() {
    let kvd = start(&[]);
    let mut arena = Client::connect(&kvd.socket, "rust-arena", true).unwrap();
    assert!(arena.arena().is_some(), "the memfd came over SCM_RIGHTS");
    let value: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    arena.set([7; 8], &value, "long", "m").unwrap().unwrap();
    assert_eq!(arena.get([7; 8], "m").unwrap().unwrap(), value);
    let mut inline = Client::connect(&kvd.socket, "rust-inline", false).unwrap();
    assert!(inline.arena().is_none());
    assert_eq!(
        inline.get([7; 8], "m").unwrap().unwrap(),
        value,
        "inline copy of the same bytes"
    );
    assert_eq!(
        inline.get([7; 8], "other-model").unwrap(),
        None,
        "scoped by model"
    );
    // A writer process takes a lease and dies without committing.
    let python = infera_testkit::python_tools::python_with(MSGPACK).unwrap();
    let writer = r#"
import msgpack, socket, struct, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
def call(m):
    b = msgpack.packb(m); s.sendall(struct.pack(">I", len(b)) + b)
    n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    return msgpack.unpackb(s.recv(n, socket.MSG_WAITALL))
call({"op": "hello", "client_id": "doomed"})
r = call({"op": "set_reserve", "size": 4096})
assert r["lease_token"] > 0, r
print("leased", flush=True)
time.sleep(60)
"#;
    let mut child = Command::new(python)
        .arg("-c")
        .arg(writer)
        .arg(&kvd.socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "leased");
    assert_eq!(metric(kvd.metrics, "infera_kvd_leases"), 1.0);
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(kvd.metrics, "infera_kvd_leases") != 0.0 {
        assert!(
            Instant::now() < deadline,
            "the dead writer's lease was never released"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = arena.request(&request_map("stats", vec![])).unwrap();
    assert_eq!(
        field(&stats, "entries").and_then(rmpv::Value::as_u64),
        Some(1),
        "nothing half-written was published"
    );
}

#[test]
fn stats_subcommand_a_second_daemon_and_sigterm() {
    let mut kvd = start(&["--shared-arena-bytes", "0"]);
    let mut c = Client::connect(&kvd.socket, "t", true).unwrap();
    assert!(
        c.arena().is_none(),
        "no arena configured: values come inline"
    );
    c.set([1; 8], b"abc", "short", "").unwrap().unwrap();
    assert_eq!(c.get([1; 8], "").unwrap().unwrap(), b"abc");
    let out = Command::new(env!("CARGO_BIN_EXE_infera-kvd"))
        .args(["stats", "--socket"])
        .arg(&kvd.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["entries"], 1);
    assert_eq!(stats["hits_total"], 1);
    let second = Command::new(env!("CARGO_BIN_EXE_infera-kvd"))
        .args(["--metrics-addr", "", "--socket"])
        .arg(&kvd.socket)
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("served by another kvd"));
    kvd.process.terminate();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = kvd.process.exited() {
            break s;
        }
        assert!(Instant::now() < deadline, "kvd ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    assert!(
        !kvd.socket.exists(),
        "the socket file is removed on shutdown"
    );
}

#[test]
fn only_allowed_users_connect() {
    let store = infera_kvd::store::Store::new(1 << 20, None);
    let mut d = infera_kvd::daemon::Daemon::new(store, "t".into(), 1 << 20);
    assert!(d.peer_allowed(1000, 1000), "the daemon's own user");
    assert!(!d.peer_allowed(0, 65532), "root only with --allow-uid 0");
    d.allowed_uids = vec![0];
    assert!(d.peer_allowed(0, 65532));
    assert!(!d.peer_allowed(1001, 65532));
}

#[test]
fn an_inline_batch_larger_than_a_frame_is_refused_not_built() {
    use infera_kvd::wire::{Reply, Request, Scope, SetItem};
    use infera_proto::retention::Retention;
    let store = infera_kvd::store::Store::new(8 << 20, None);
    let d = infera_kvd::daemon::Daemon::new(store, "t".into(), 1 << 20);
    let mut conn = d.connect();
    for k in 0..2u8 {
        let item = SetItem {
            key: [k; 8],
            value: vec![k; 600 << 10],
            retention: Retention::Short,
            ttl_seconds: None,
        };
        let r = d.handle(
            Request::Set {
                item,
                scope: Scope::default(),
            },
            &mut conn,
        );
        assert!(
            matches!(r, Some(Reply::SetAck { accepted: true, .. })),
            "{r:?}"
        );
    }
    let one = d.handle(
        Request::BatchGet {
            keys: vec![[0; 8]],
            scope: Scope::default(),
        },
        &mut conn,
    );
    assert!(matches!(one, Some(Reply::BatchGetResponse { .. })));
    let both = d.handle(
        Request::BatchGet {
            keys: vec![[0; 8], [1; 8]],
            scope: Scope::default(),
        },
        &mut conn,
    );
    match both {
        Some(Reply::Error { code, .. }) => assert_eq!(code, "value_too_large"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_prefetch_hint_sent_over_a_short_connection_reaches_the_daemon() {
    use infera_kvd::client::{PrefetchHint, SendHintError, send_prefetch_hint};
    // A lower tier, so the hint is worked on (with RAM alone there is nothing to warm).
    let nvme = tempfile::tempdir().unwrap();
    let kvd = start(&[
        "--long-path",
        nvme.path().to_str().unwrap(),
        "--long-bytes",
        "4194304",
    ]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let hint = PrefetchHint {
        keys: vec![[1; 8], [2; 8], [3; 8]],
        model: "fixture-model".into(),
        compat_key: String::new(),
        deadline_ms: 500,
    };
    runtime
        .block_on(send_prefetch_hint(
            &kvd.socket,
            "fixture-prefetch",
            &hint,
            Duration::from_secs(5),
        ))
        .unwrap();
    support::wait_for("3 keys looked up", Duration::from_secs(10), || {
        metric(
            kvd.metrics,
            "infera_kvd_prefetch_keys_total{outcome=\"missing\"}",
        ) == 3.0
    });
    let absent = kvd.dir.path().join("absent.sock");
    let err = runtime
        .block_on(send_prefetch_hint(
            &absent,
            "fixture-prefetch",
            &hint,
            Duration::from_secs(5),
        ))
        .unwrap_err();
    assert!(matches!(err, SendHintError::Connect { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "could not connect to kvd at {}: [Errno 2] No such file or directory",
            absent.display()
        ),
        "worded as the earlier server's Python client worded it"
    );
}
