"""Writes fixtures.json: what the earlier Infera server (AMD-AGI/Infera at 5890f7f,
`python -m infera.server`) answered on the endpoints a drop-in replacement must keep:
status, content type and body bytes, rendered by the web stack it ran on (FastAPI,
Starlette, pydantic; pinned in requirements.txt).

The earlier modules need its whole package (the registry, the routers, NATS), so the
handlers are restated here, minimally, from the files and lines named beside each: the
same checks in the same order, the same messages, the same kinds of response objects
(a dict through FastAPI's encoder, HTTPException's `{"detail": ...}`, the hand-built
`Response(json.dumps(...))` of prewarm). What they stand on (the kv-event client, the
registry, kvd's socket, the engines, the Kubernetes API) is replaced by stand-ins that
answer as the originals did: a real Unix-socket connect for kvd (so the OS error text is
the real one), httpx's MockTransport for the engines and the API server.

The restatement was checked once against the earlier modules themselves: with a
checkout of the earlier repository on the path, `infera.server.app` (its `init_app` given
stub registries, a stub kv-event client, the MockTransport engines below, and
`scaling.make_client` patched to the same stand-in API server) and `infera.kv.api`'s
`make_stats_router` over a real `KVIndex`, writer, subscriber pool and reconciler answer
65 of the 67 cases with these exact bytes; the other two need a live kvd.

gateway/src/earlier_server_tests.rs and gateway/tests/earlier_server.rs replay every case
against the gateway, set up as the case's `setup` says, and compare the bytes.

    python3 make_fixtures.py   # in a virtualenv of requirements.txt:
                               # testenv/venv earlier-server -r gateway/testdata/earlier_server/requirements.txt
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from dataclasses import asdict, dataclass

import httpx
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.testclient import TestClient

HERE = os.path.dirname(os.path.abspath(__file__))
# Worker ids and URLs as the earlier launchers registered them; names that cannot be
# mistaken for product strings.
W1, W2, W3 = "10.0.0.1:30000", "10.0.0.2:30000", "10.0.0.3:30000"
ABSENT_KVD = "/nonexistent/fixture-kvd.sock"


# --- /v1/kv-stats: infera/kv/api.py:78-128, infera/kv/index.py:63-70 ------------------
@dataclass
class IndexStats:
    nodes: int = 0
    confirmed_nodes: int = 0
    optimistic_nodes: int = 0
    publishers: int = 0
    models: int = 0
    compat_keys: int = 0


def add_kv_stats(app: FastAPI, *, reconciler: bool) -> None:
    # __main__.py:80-95, 291-298: writer and subscribers always, the reconciler only
    # with --kv-event-transport zmq; a fresh server's counters are all zero.
    @app.get("/v1/kv-stats")
    async def get_stats() -> dict:
        out: dict = {"index": asdict(IndexStats())}
        out["writer"] = {
            "batches_applied": 0,
            "events_applied_stored": 0,
            "events_applied_removed": 0,
            "events_applied_cleared": 0,
            "events_dropped_unknown_role": 0,
            "events_dropped_unknown_tier": 0,
            "events_dropped_malformed": 0,
        }
        out["subscribers"] = {
            "endpoints": [],
            "batches_received": 0,
            "batches_decoded": 0,
            "events_received": 0,
            "batches_dropped_overload": 0,
            "batches_dropped_malformed": 0,
            "batches_dropped_version": 0,
        }
        if reconciler:
            out["reconciler"] = {
                "snapshots_pulled": 0,
                "snapshots_applied": 0,
                "snapshots_failed": 0,
                "snapshots_stale": 0,
            }
        return out


# --- /v1/admin/cache-view/{worker_id}: infera/server/app.py:110-117 ---------------------
class StubKvClient:
    """kv_event/client.py:113-124: the view of a worker's rank (rank 0 when none)."""

    def __init__(self, views: dict):
        self.views = views

    def cache_view(self, worker_id: str, dp_rank: int | None) -> set:
        return self.views.get(worker_id, {}).get(dp_rank if dp_rank is not None else 0, set())


def add_cache_view(app: FastAPI, kv_client: StubKvClient | None) -> None:
    @app.get("/v1/admin/cache-view/{worker_id}")
    async def cache_view(worker_id: str, dp_rank: int | None = None) -> dict:
        if kv_client is None:
            raise HTTPException(status_code=503, detail="KV-aware mode disabled")
        view = kv_client.cache_view(worker_id, dp_rank)
        return {"worker_id": worker_id, "dp_rank": dp_rank, "block_count": len(view)}


# --- /v1/cache/prewarm: infera/server/app.py:318-406, infera/kvd/client.py:224-262 ------
class KvdConnectionError(Exception):
    pass


async def kvd_prefetch(path: str, keys: list) -> None:
    """The part of KvdClient.connect that can fail here: the socket connect, with the
    message it raised (client.py:253-260)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        raise KvdConnectionError(f"could not connect to kvd at {path}: {exc}") from exc
    finally:
        sock.close()


def add_prewarm(app: FastAPI, kvd_socket_path: str | None) -> None:
    @app.post("/v1/cache/prewarm")
    async def cache_prewarm(request: Request) -> Response:
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            raise HTTPException(status_code=400, detail=f"bad json: {exc}") from exc
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise HTTPException(status_code=400, detail="`model` is required")
        hex_hashes = body.get("block_hashes")
        if not isinstance(hex_hashes, list) or not all(isinstance(h, str) for h in hex_hashes):
            raise HTTPException(
                status_code=400, detail="`block_hashes` must be a list of hex strings"
            )
        if not hex_hashes:
            return Response(
                content=json.dumps({"accepted": True, "n_keys": 0}),
                status_code=202,
                media_type="application/json",
            )
        try:
            keys = [bytes.fromhex(h) for h in hex_hashes]
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=f"bad hex in block_hashes: {exc}") from exc
        compat_key = body.get("compat_key", "")
        if not isinstance(compat_key, str):
            raise HTTPException(status_code=400, detail="`compat_key` must be a string")
        deadline_ms_raw = body.get("deadline_ms", 1000)
        try:
            deadline_ms = int(deadline_ms_raw)
        except (TypeError, ValueError) as exc:
            raise HTTPException(status_code=400, detail=f"`deadline_ms`: {exc}") from exc
        if deadline_ms <= 0:
            raise HTTPException(status_code=400, detail="`deadline_ms` must be positive")
        if kvd_socket_path is None:
            raise HTTPException(
                status_code=503,
                detail="prefetch unavailable — kvd_socket_path not configured",
            )
        try:
            if kvd_socket_path != "fixture:reachable":
                await kvd_prefetch(kvd_socket_path, keys)
        except KvdConnectionError as exc:
            raise HTTPException(status_code=503, detail=f"kvd unreachable: {exc}") from exc
        return Response(
            content=json.dumps({"accepted": True, "n_keys": len(keys)}),
            status_code=202,
            media_type="application/json",
        )


# --- /v1/admin/profile/{start,stop}: app.py:128-181, infera/server/profiling.py -------
@dataclass
class Worker:
    worker_id: str
    url: str
    model_name: str
    engine: str
    disagg_mode: str = "mixed"
    status: str = "active"


DISAGG_MODES = ("mixed", "prefill", "decode")


def select_targets(workers, *, worker_id=None, model=None, role=None):
    mode = None
    if role is not None and role != "":
        if role.lower() not in DISAGG_MODES:
            raise ValueError(
                f"invalid role {role!r}; expected one of: {', '.join(DISAGG_MODES)}"
            )
        mode = role.lower()
    out = []
    for w in workers:
        if w.status != "active":
            continue
        if worker_id is not None and w.worker_id != worker_id:
            continue
        if model is not None and w.model_name != model:
            continue
        if mode is not None and w.disagg_mode != mode:
            continue
        out.append(w)
    return out


async def profile_one(client, worker, action, body):
    url = f"{worker.url}/{action}_profile"
    try:
        resp = await client.post(url, json=body or {})
        try:
            detail = resp.json()
        except ValueError:
            detail = resp.text
        return {
            "worker_id": worker.worker_id,
            "url": url,
            "engine": worker.engine,
            "status_code": resp.status_code,
            "ok": resp.status_code < 400,
            "detail": detail,
        }
    except httpx.HTTPError as exc:
        return {
            "worker_id": worker.worker_id,
            "url": url,
            "engine": worker.engine,
            "status_code": None,
            "ok": False,
            "detail": f"{type(exc).__name__}: {exc}",
        }


# What the stand-in engines received, for the cases that pin the forwarded body.
FORWARDED: list = []


def engines(request: httpx.Request) -> httpx.Response:
    """The engines' profile endpoints as they answer: vLLM an empty 200 (its
    api_server's start_profile/stop_profile), SGLang its text (http_server.py); W3 is
    down."""
    if request.url.host == "10.0.0.3":
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
    FORWARDED.append((str(request.url), request.content.decode()))
    if request.url.host == "10.0.0.1" and request.url.path == "/start_profile":
        return httpx.Response(200, text="Start profiling.\n")
    if request.url.host == "10.0.0.1":
        return httpx.Response(200, text="Stop profiling. This will take some time.\n")
    return httpx.Response(200)


def add_profile(app: FastAPI, *, enabled: bool, workers: list) -> None:
    client = httpx.AsyncClient(transport=httpx.MockTransport(engines))

    async def action_of(action: str, request: Request) -> dict:
        if not enabled:
            raise HTTPException(
                status_code=403,
                detail="profiling disabled; start the server with --enable-profiling",
            )
        try:
            body = await request.json()
        except (json.JSONDecodeError, ValueError):
            body = {}
        if not isinstance(body, dict):
            body = {}
        qp = request.query_params
        worker_id = qp.get("worker_id") or body.pop("worker_id", None)
        model = qp.get("model") or body.pop("model", None)
        role = qp.get("role") or body.pop("role", None)
        try:
            targets = select_targets(workers, worker_id=worker_id, model=model, role=role)
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc
        if not targets:
            raise HTTPException(
                status_code=404,
                detail="no active worker matched the given worker_id/model/role",
            )
        results = await asyncio.gather(*(profile_one(client, w, action, body) for w in targets))
        return {
            "action": action,
            "requested": len(results),
            "succeeded": sum(1 for r in results if r["ok"]),
            "results": list(results),
        }

    @app.post("/v1/admin/profile/start")
    async def profile_start(request: Request) -> dict:
        return await action_of("start", request)

    @app.post("/v1/admin/profile/stop")
    async def profile_stop(request: Request) -> dict:
        return await action_of("stop", request)


# --- /v1/admin/scale: app.py:191-239, infera/server/scaling.py --------------------------
class ScalingError(Exception):
    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Scaler:
    """DeploymentScaler (scaling.py:78-256) over a stand-in API server: its own Pod's
    labels name the deployment, the InferaDeployment's spec.services and status give the
    pools. One pending Pod explains a pool short of replicas (_blocked_reason)."""

    def __init__(self, *, labelled: bool, cr: dict, pending: list | None = None) -> None:
        self.namespace, self.pod = "fixture-ns", "fixture-gateway-0"
        self.labelled, self.cr, self.pending = labelled, cr, pending or []

    def resolve(self) -> str:
        if not self.labelled:
            raise ScalingError(
                "this router was not created by the operator "
                "(no infera.amd.com/deployment label), so there is no deployment to scale",
                status=409,
            )
        return self.cr["metadata"]["name"]

    def blocked(self, svc: str) -> str | None:
        for pod in self.pending:
            if pod["service"] != svc:
                continue
            text = " ".join((pod["message"] or "").split())
            if len(text) > 300:
                text = text[:297] + "..."
            return f"{pod['reason']}: {text}" if pod["reason"] and text else pod["reason"] or text
        return None

    def snapshot(self) -> dict:
        name = self.resolve()
        spec = (self.cr.get("spec") or {}).get("services") or {}
        status = (self.cr.get("status") or {}).get("services") or {}
        pools = {}
        for svc, cfg in sorted(spec.items()):
            observed = status.get(svc) or {}
            want = int(cfg.get("replicas", 1))
            pools[svc] = pool = {
                "role": cfg.get("role") or "mixed",
                "replicas": want,
                "current_replicas": int(observed.get("replicas", 0)),
                "ready_replicas": int(observed.get("readyReplicas", 0)),
                "nodes_per_replica": int(cfg.get("numberOfNodes", 1)),
            }
            if pool["ready_replicas"] < want:
                blocked = self.blocked(svc)
                if blocked:
                    pool["blocked"] = blocked
        return {
            "deployment": name,
            "namespace": self.namespace,
            "state": (self.cr.get("status") or {}).get("state") or "unknown",
            "services": pools,
        }

    def scale(self, requested: dict) -> dict:
        if not requested:
            raise ScalingError("no services named")
        self.resolve()
        known = (self.cr.get("spec") or {}).get("services") or {}
        unknown = sorted(set(requested) - set(known))
        if unknown:
            raise ScalingError(
                f"no such service(s): {', '.join(unknown)}. "
                f"This deployment has: {', '.join(sorted(known))}"
            )
        for svc, count in sorted(requested.items()):
            if not isinstance(count, int) or isinstance(count, bool):
                raise ScalingError(f"{svc}: replicas must be an integer, got {count!r}")
            if count < 1:
                raise ScalingError(
                    f"{svc}: refusing to scale to {count}. A pool at zero stops serving, "
                    "and in a PD deployment an empty prefill or decode pool fails every "
                    "request. Edit the InferaDeployment directly if that is the intent."
                )
        for svc, count in requested.items():
            self.cr["spec"]["services"][svc]["replicas"] = count
        return self.snapshot()


def add_scale(app: FastAPI, scaler: Scaler | None) -> None:
    def require() -> Scaler:
        if scaler is None:
            raise HTTPException(
                status_code=403,
                detail="scaling API disabled; start the server with --enable-scaling-api",
            )
        return scaler

    @app.get("/v1/admin/scale")
    async def scale_get() -> dict:
        s = require()
        try:
            return s.snapshot()
        except ScalingError as exc:
            raise HTTPException(status_code=exc.status, detail=str(exc)) from exc

    @app.post("/v1/admin/scale")
    async def scale_set(request: Request) -> dict:
        s = require()
        try:
            body = await request.json()
        except (json.JSONDecodeError, ValueError) as exc:
            raise HTTPException(status_code=400, detail="body must be JSON") from exc
        services = (body or {}).get("services")
        if not isinstance(services, dict):
            raise HTTPException(
                status_code=400,
                detail='body must be {"services": {"<name>": {"replicas": N}}}',
            )
        requested = {}
        for name, cfg in services.items():
            requested[name] = cfg.get("replicas") if isinstance(cfg, dict) else cfg
        try:
            return s.scale(requested)
        except ScalingError as exc:
            raise HTTPException(status_code=exc.status, detail=str(exc)) from exc


# --- the cases ----------------------------------------------------------------------
def mixed_cr(replicas: int, ready: int) -> dict:
    """An earlier InferaDeployment with one mixed pool (the shape a converted deployment
    of this project's `spec.replicas` maps onto)."""
    return {
        "metadata": {"name": "fixture"},
        "spec": {"services": {"mixed": {"role": "mixed", "replicas": replicas}}},
        "status": {
            "state": "ready" if ready >= replicas else "pending",
            "services": {"mixed": {"replicas": replicas, "readyReplicas": ready}},
        },
    }


def pd_cr() -> dict:
    return {
        "metadata": {"name": "fixture"},
        "spec": {
            "services": {
                "decode": {"role": "decode", "replicas": 2},
                "prefill": {"role": "prefill", "replicas": 1},
            }
        },
        "status": {
            "state": "ready",
            "services": {
                "decode": {"replicas": 2, "readyReplicas": 2},
                "prefill": {"replicas": 1, "readyReplicas": 1},
            },
        },
    }


WORKERS = [
    Worker(W1, f"http://{W1}", "fixture-model", "sglang"),
    Worker(W2, f"http://{W2}", "fixture-model", "vllm", disagg_mode="decode"),
    Worker(W3, f"http://{W3}", "fixture-other", "vllm"),
]

VALID_HINT = {"model": "fixture-model", "block_hashes": ["00112233aabbccdd", "0102030405060708"]}

# (setup, name, method, path, body or None, content type of the request body)
CASES = [
    ("kv_stats_nats", "kv_stats_fresh", "GET", "/v1/kv-stats", None),
    ("kv_stats_zmq", "kv_stats_fresh_zmq", "GET", "/v1/kv-stats", None),
    ("round_robin", "cache_view_not_kv_aware", "GET", f"/v1/admin/cache-view/{W1}", None),
    ("round_robin", "cache_view_not_kv_aware_bad_rank", "GET", f"/v1/admin/cache-view/{W1}?dp_rank=abc", None),
    ("kv_aware", "cache_view", "GET", f"/v1/admin/cache-view/{W1}", None),
    ("kv_aware", "cache_view_rank", "GET", f"/v1/admin/cache-view/{W2}?dp_rank=1", None),
    ("kv_aware", "cache_view_rank_absent", "GET", f"/v1/admin/cache-view/{W2}?dp_rank=7", None),
    ("kv_aware", "cache_view_negative_rank", "GET", f"/v1/admin/cache-view/{W1}?dp_rank=-1", None),
    ("kv_aware", "cache_view_unknown_worker", "GET", "/v1/admin/cache-view/10.9.9.9:1", None),
    ("kv_aware", "cache_view_bad_rank", "GET", f"/v1/admin/cache-view/{W1}?dp_rank=abc", None),
    ("kv_aware", "cache_view_fractional_rank", "GET", f"/v1/admin/cache-view/{W1}?dp_rank=1.5", None),
    ("kv_aware", "cache_view_empty_rank", "GET", f"/v1/admin/cache-view/{W1}?dp_rank=", None),
    ("kv_aware", "cache_view_spaced_rank", "GET", f"/v1/admin/cache-view/{W2}?dp_rank=%201%20", None),
    ("prewarm_unconfigured", "prewarm_empty_body", "POST", "/v1/cache/prewarm", ""),
    ("prewarm_unconfigured", "prewarm_truncated_json", "POST", "/v1/cache/prewarm", '{"model": "x"'),
    ("prewarm_unconfigured", "prewarm_no_model", "POST", "/v1/cache/prewarm", "{}"),
    ("prewarm_unconfigured", "prewarm_empty_model", "POST", "/v1/cache/prewarm", '{"model": ""}'),
    ("prewarm_unconfigured", "prewarm_model_not_a_string", "POST", "/v1/cache/prewarm", '{"model": 7}'),
    ("prewarm_unconfigured", "prewarm_no_hashes", "POST", "/v1/cache/prewarm", '{"model": "m"}'),
    ("prewarm_unconfigured", "prewarm_hash_not_a_string", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00", 1]}'),
    ("prewarm_unconfigured", "prewarm_no_keys", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": [], "deadline_ms": -5}'),
    ("prewarm_unconfigured", "prewarm_bad_hex", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["0011", "00zz"]}'),
    ("prewarm_unconfigured", "prewarm_odd_hex", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["001"]}'),
    ("prewarm_unconfigured", "prewarm_spaced_hex", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": [" 00 11\\t22 ", "0 011"]}'),
    ("prewarm_unconfigured", "prewarm_unicode_hex", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00é1"]}'),
    ("prewarm_unconfigured", "prewarm_compat_key_not_a_string", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00"], "compat_key": 3}'),
    ("prewarm_unconfigured", "prewarm_deadline_text", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00"], "deadline_ms": "soon"}'),
    ("prewarm_unconfigured", "prewarm_deadline_quoted_text", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00"], "deadline_ms": "it\'s \\\\ late"}'),
    ("prewarm_unconfigured", "prewarm_deadline_null", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00"], "deadline_ms": null}'),
    ("prewarm_unconfigured", "prewarm_deadline_list", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00"], "deadline_ms": [5]}'),
    ("prewarm_unconfigured", "prewarm_deadline_object", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00"], "deadline_ms": {}}'),
    ("prewarm_unconfigured", "prewarm_deadline_zero", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00"], "deadline_ms": 0}'),
    ("prewarm_unconfigured", "prewarm_deadline_fraction", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00"], "deadline_ms": 0.7}'),
    ("prewarm_unconfigured", "prewarm_deadline_false", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00"], "deadline_ms": false}'),
    ("prewarm_unconfigured", "prewarm_unconfigured", "POST", "/v1/cache/prewarm", json.dumps(VALID_HINT)),
    ("prewarm_unconfigured", "prewarm_unconfigured_deadline_as_text", "POST", "/v1/cache/prewarm", '{"model": "m", "block_hashes": ["00"], "deadline_ms": " 250 "}'),
    ("prewarm_absent_kvd", "prewarm_kvd_unreachable", "POST", "/v1/cache/prewarm", json.dumps(VALID_HINT)),
    ("prewarm_kvd", "prewarm_accepted", "POST", "/v1/cache/prewarm", json.dumps({**VALID_HINT, "compat_key": "fixture-ck", "deadline_ms": "250"})),
    ("prewarm_kvd", "prewarm_accepted_short_keys", "POST", "/v1/cache/prewarm", '{"model": "fixture-model", "block_hashes": ["00", "0011223344556677", "aa bb"]}'),
    ("profiling_off", "profile_disabled", "POST", "/v1/admin/profile/start", "{}"),
    ("profiling_off", "profile_disabled_stop", "POST", "/v1/admin/profile/stop", None),
    ("profiling", "profile_bad_role", "POST", "/v1/admin/profile/start?role=router", None),
    ("profiling", "profile_no_match", "POST", "/v1/admin/profile/start", '{"model": "fixture-absent"}'),
    ("profiling", "profile_start_one", "POST", f"/v1/admin/profile/start?worker_id={W1}", f'{{"worker_id": "{W1}", "output_dir": "/tmp/fixture-trace", "num_steps": 3}}'),
    ("profiling", "profile_stop_by_model", "POST", "/v1/admin/profile/stop", '{"model": "fixture-model"}'),
    ("profiling", "profile_start_decode", "POST", "/v1/admin/profile/start?role=DECODE", "not json"),
    ("profiling", "profile_start_all", "POST", "/v1/admin/profile/start", "[1, 2]"),
    ("scaling_off", "scale_disabled_get", "GET", "/v1/admin/scale", None),
    ("scaling_off", "scale_disabled_post", "POST", "/v1/admin/scale", "not json"),
    ("scaling_unlabelled", "scale_not_operator_made", "GET", "/v1/admin/scale", None),
    ("scaling_unlabelled", "scale_not_operator_made_post", "POST", "/v1/admin/scale", '{"services": {"mixed": 3}}'),
    ("scaling_mixed", "scale_get_mixed", "GET", "/v1/admin/scale", None),
    ("scaling_mixed", "scale_bad_json", "POST", "/v1/admin/scale", "{"),
    ("scaling_mixed", "scale_no_services", "POST", "/v1/admin/scale", '{"pools": {}}'),
    ("scaling_mixed", "scale_null_body", "POST", "/v1/admin/scale", "null"),
    ("scaling_mixed", "scale_services_not_an_object", "POST", "/v1/admin/scale", '{"services": [1]}'),
    ("scaling_mixed", "scale_nothing_named", "POST", "/v1/admin/scale", '{"services": {}}'),
    ("scaling_mixed", "scale_unknown_service", "POST", "/v1/admin/scale", '{"services": {"worker": 2, "server": 1}}'),
    ("scaling_mixed", "scale_not_an_integer", "POST", "/v1/admin/scale", '{"services": {"mixed": {"replicas": "4"}}}'),
    ("scaling_mixed", "scale_fraction", "POST", "/v1/admin/scale", '{"services": {"mixed": 2.5}}'),
    ("scaling_mixed", "scale_bool", "POST", "/v1/admin/scale", '{"services": {"mixed": true}}'),
    ("scaling_mixed", "scale_missing_replicas", "POST", "/v1/admin/scale", '{"services": {"mixed": {}}}'),
    ("scaling_mixed", "scale_to_zero", "POST", "/v1/admin/scale", '{"services": {"mixed": {"replicas": 0}}}'),
    ("scaling_mixed", "scale_mixed_up", "POST", "/v1/admin/scale", '{"services": {"mixed": {"replicas": 3}}}'),
    ("scaling_pd", "scale_get_pd", "GET", "/v1/admin/scale", None),
    ("scaling_pd", "scale_pd_one_unknown_one_zero", "POST", "/v1/admin/scale", '{"services": {"prefill": 0, "router": 1}}'),
    ("scaling_pd", "scale_pd_zero_sorted_first", "POST", "/v1/admin/scale", '{"services": {"prefill": 2, "decode": 0}}'),
]

PENDING = [
    {
        "service": "mixed",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available:   3 Insufficient amd.com/gpu.\n preemption: 0/3 nodes are available.",
    }
]


def build(setup: str) -> FastAPI:
    app = FastAPI(title="Infera")
    kv_aware = setup not in ("round_robin",)
    add_kv_stats(app, reconciler=setup == "kv_stats_zmq")
    add_cache_view(
        app,
        StubKvClient({W1: {0: set(range(12))}, W2: {0: {1, 2}, 1: {1, 2, 3}}}) if kv_aware else None,
    )
    kvd = {"prewarm_absent_kvd": ABSENT_KVD, "prewarm_kvd": "fixture:reachable"}.get(setup)
    add_prewarm(app, kvd)
    add_profile(app, enabled=setup == "profiling", workers=WORKERS)
    scaler = {
        "scaling_unlabelled": lambda: Scaler(labelled=False, cr=mixed_cr(2, 2)),
        "scaling_mixed": lambda: Scaler(labelled=True, cr=mixed_cr(2, 1), pending=PENDING),
        "scaling_pd": lambda: Scaler(labelled=True, cr=pd_cr()),
    }.get(setup)
    add_scale(app, scaler() if scaler else None)
    return app


def main() -> None:
    out = []
    apps: dict = {}
    for setup, name, method, path, body in CASES:
        app = apps.setdefault(setup, build(setup))
        FORWARDED.clear()
        with TestClient(app) as client:
            kwargs = {}
            if body is not None:
                kwargs = {"content": body.encode(), "headers": {"content-type": "application/json"}}
            resp = client.request(method, path, **kwargs)
        case = {
            "name": name,
            "setup": setup,
            "method": method,
            "path": path,
            "request_body": body,
            "status": resp.status_code,
            "content_type": resp.headers.get("content-type"),
            "body": resp.content.decode("utf-8"),
        }
        if FORWARDED:
            case["forwarded"] = sorted(FORWARDED)
        out.append(case)
    with open(os.path.join(HERE, "fixtures.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "generator": "gateway/testdata/earlier_server/make_fixtures.py",
                "earlier": "AMD-AGI/Infera 5890f7f60750b17f598a1226a37c5be1fecf8045",
                "workers": [asdict(w) for w in WORKERS],
                "pending_pods": PENDING,
                "cases": out,
            },
            f,
            ensure_ascii=False,
            indent=1,
        )
        f.write("\n")


if __name__ == "__main__":
    main()
