//! A real engine's pod with RDMA on the real node: the `node-env` init container reads
//! the node and writes `/run/infera/engine-env.sh`, and the engine container sources it
//! through the operator's `/bin/sh` wrapper before exec'ing the engine. The engine is
//! the simulator standing in for vLLM (`infera_e2e::sim_engine`); its image has no
//! shell, so a `podTemplate` override mounts the node's static busybox at `/bin/sh`
//! (`scripts/test` installs busybox-static), as a platform team would patch an image
//! without one. What the engine process ends up with is read from its `/proc` on this
//! host: the node has no RDMA NIC, so the GID indices are the earlier launchers'
//! fallback, 1; Mooncake's affinity default is set; and no peer-memory module is
//! loaded here, so DMABUF stays on.
//!
//! Run by `scripts/test` in its cluster stage.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_e2e::Cluster;
use infera_e2e::process::container_process;
use infera_e2e::sim_engine::{model_folder, sim_image, vllm_manifest};

#[tokio::test]
async fn an_rdma_engine_starts_with_what_node_env_read_on_the_node() {
    let busybox = std::path::Path::new("/bin/busybox");
    assert!(
        busybox.is_file(),
        "/bin/busybox is missing: testenv/apt-install busybox-static (scripts/test does)"
    );
    let cluster = Cluster::connect().await.unwrap();
    let ns = cluster.namespace("e2e-node-env").await.unwrap();
    let ns = ns.name.clone();
    let folder = model_folder().unwrap();
    let image = sim_image(&cluster).await.unwrap();
    // The node's static busybox as the image's shell.
    let engine = "    podTemplate:
      spec:
        volumes: [{name: shell, hostPath: {path: /bin/busybox, type: File}}]
        containers:
          - name: engine
            volumeMounts: [{name: shell, mountPath: /bin/sh, readOnly: true}]
";
    let spec = "  network:\n    rdma: {enabled: true}\n";
    let manifest = vllm_manifest("rdma-vllm", folder.path(), &image, engine, spec);
    cluster.apply(&ns, &manifest).await.unwrap();
    cluster.wait_ready(&ns, "rdma-vllm").await.unwrap();
    let pods = cluster.engine_pods(&ns, "rdma-vllm").await.unwrap();
    let pod = &pods[0];
    let name = pod["metadata"]["name"].as_str().unwrap();
    let init: Vec<&str> = pod["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(init.first(), Some(&"node-env"), "{init:?}");
    let engine = pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "engine")
        .unwrap();
    assert_eq!(engine["command"][0], "/bin/sh", "{}", engine["command"]);

    // The engine process (exec'd by the wrapper: `vllm serve ...`) has the file's values.
    // The engine (`vllm serve ...`), not the sidecar that passes those words on.
    let proc = container_process(name, |argv| {
        argv.first().is_some_and(|a| a.ends_with("vllm"))
            && argv.get(1).is_some_and(|a| a == "serve")
    })
    .expect("the engine's process on this host");
    let environ = std::fs::read(proc.join("environ")).unwrap();
    let environ: Vec<String> = String::from_utf8_lossy(&environ)
        .split('\0')
        .map(str::to_owned)
        .collect();
    for var in [
        "MC_GID_INDEX=1",
        "NCCL_IB_GID_INDEX=1",
        "MORI_IB_GID_INDEX=1",
        "MC_ENABLE_DEST_DEVICE_AFFINITY=1",
        "VLLM_ROCM_USE_AITER=1",
    ] {
        assert!(
            environ.iter().any(|v| v == var),
            "{name}: {var} not in the engine's env: {environ:?}"
        );
    }
    assert!(
        !environ
            .iter()
            .any(|v| v.starts_with("MOONCAKE_DISABLE_HIP_DMABUF=")),
        "no peer-memory module is loaded here"
    );
    // The command line is vLLM's, not the wrapper's.
    let cmdline = std::fs::read(proc.join("cmdline")).unwrap();
    let argv: Vec<String> = String::from_utf8_lossy(&cmdline)
        .split('\0')
        .map(str::to_owned)
        .collect();
    assert!(argv[0].ends_with("vllm") && argv[1] == "serve", "{argv:?}");
}
