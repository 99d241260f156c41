//! The tiers a worker declares below its engine (`--kv-tiers`) follow the kvd beside it:
//! in the record while kvd's socket answers, gone while it does not (a router must not
//! credit blocks the worker can no longer load), back when kvd is.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{args_of, launch_with, unique_prefix, wait_key};
use infera_proto::kv_tiers::{DeclaredTiers, KvTier};
use infera_testkit::process::{ServerProcess, workspace_binary};
use std::path::Path;
use std::time::{Duration, Instant};

fn start_kvd(dir: &Path, socket: &Path) -> ServerProcess {
    let _ = std::fs::remove_file(socket);
    let kvd = ServerProcess::start(
        &workspace_binary("infera-kvd").unwrap(),
        &args_of(&[
            "--socket",
            socket.to_str().unwrap(),
            "--max-bytes",
            "16777216",
            "--metrics-addr",
            "",
        ]),
        &dir.join("kvd.log"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "kvd never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    kvd
}

/// The tiers the record under `key` declares, once `pred` holds for them.
async fn tiers_until(
    key: &str,
    sidecar: &mut ServerProcess,
    what: &str,
    pred: impl Fn(&[KvTier]) -> bool,
) -> Vec<KvTier> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let record = wait_key(key, true, Duration::from_secs(60), sidecar)
            .await
            .unwrap();
        let tiers: Vec<KvTier> = DeclaredTiers::from_kv(record.kv.as_ref())
            .costs
            .iter()
            .map(|(t, _)| *t)
            .collect();
        if pred(&tiers) {
            return tiers;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the record declares {tiers:?}; sidecar log:\n{}",
            sidecar.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn declared_tiers_leave_the_record_with_kvd_and_come_back_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kvd.sock");
    let mut kvd = start_kvd(dir.path(), &socket);
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let flags = args_of(&[
        "--kvd-socket",
        socket.to_str().unwrap(),
        "--kv-tiers",
        "host,remote",
    ]);
    let mut launched = launch_with(&etcd, &unique_prefix("kv-tiers"), "10", &flags).await;
    let (key, sidecar) = (launched.key.clone(), &mut launched.sidecar);
    let all = [KvTier::Host, KvTier::Remote];
    tiers_until(&key, sidecar, "kvd up", |t| t == all).await;

    kvd.kill();
    tiers_until(&key, sidecar, "kvd killed", <[KvTier]>::is_empty).await;

    let _kvd = start_kvd(dir.path(), &socket);
    tiers_until(&key, sidecar, "kvd back", |t| t == all).await;
    // The same lease throughout: the record was updated, never withdrawn.
    let mut etcd = infera_testkit::etcd_client().await.unwrap();
    let got = etcd.get(key.as_str(), None).await.unwrap();
    assert!(got.kvs()[0].lease() != 0);
    assert!(got.kvs()[0].version() >= 3, "put, then twice updated");
}
