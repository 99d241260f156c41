#!/usr/bin/env python3
"""Record the earlier Python request plane's NATS traffic as JSON fixtures.

Runs the earlier implementation (NatsRequestServer / NatsRequestClient from
``infera.common.nats_request`` in a read-only checkout of the earlier Python
Infera) against a tiny canned HTTP engine and a NATS server you start, and
records every message published on ``>`` (subject, reply, headers, payload)
in arrival order, one list per scenario. Inbox names become ``_INBOX.1``,
``_INBOX.2``, ... (first appearance, per scenario) and the worker token
becomes ``<token>``, so two runs produce identical output.

Usage (Python 3.11, ``pip install --no-deps -r requirements.txt``)::

    nats-server -js -p 4333 -sd /tmp/nats-fixtures &
    python make_fixtures.py --legacy /path/to/AMD-AGI-Infera-checkout \\
        --nats nats://127.0.0.1:4333 --out earlier_frames.json

The script deletes the INFERA_REQUESTS stream at start and end, so point it
at a throwaway server. The engine is importable (``start_engine``) for other
test scripts in this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REQUEST_STREAM = "INFERA_REQUESTS"
# Fixed worker ids keep tokens stable across runs; the engine port is free.
CORE_WORKER_ID = "127.0.0.1:8000"
JS_WORKER_ID = "127.0.0.1:8001"
SETTLE_S = 0.5
CANCEL_WAIT_S = 3.5

COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "text": "hi", "logprobs": None, "finish_reason": "length"}],
}
BAD_REQUEST = {
    "error": {
        "message": "prompt is not allowed",
        "type": "invalid_request_error",
        "param": "prompt",
        "code": None,
    }
}


def _compact(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _sse_event(text: str, finish_reason: str | None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    chunk = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [choice],
    }
    return b"data: " + _compact(chunk) + b"\n\n"


SSE_EVENTS = [_sse_event("a", None), _sse_event("b", None), _sse_event("c", "length")]
SSE_DONE = b"data: [DONE]\n\n"


class _EngineHandler(BaseHTTPRequestHandler):
    """Canned OpenAI-like engine: POST /v1/completions only."""

    protocol_version = "HTTP/1.1"
    # Gap between streamed writes so every SSE event is its own chunk.
    chunk_gap_s = 0.05

    def log_message(self, fmt, *args) -> None:
        logging.debug("engine: " + fmt, *args)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.path != "/v1/completions":
            self._send_json(404, {"error": {"message": "not found", "type": "not_found"}})
        elif body.get("prompt") == "bad":
            self._send_json(400, BAD_REQUEST)
        elif body.get("stream"):
            self._stream(slow=body.get("prompt") == "slow")
        else:
            self._send_json(200, COMPLETION)

    def _send_json(self, status: int, obj) -> None:
        data = _compact(obj)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, slow: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = SSE_EVENTS[:1] if slow else [*SSE_EVENTS, SSE_DONE]
        try:
            for event in events:
                self._write_chunk(event)
                time.sleep(self.chunk_gap_s)
            if slow:
                # Interrupted early when the engine is shut down.
                self.server.stopping.wait(30)
                self._write_chunk(SSE_DONE)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def start_engine(host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Start the canned engine in a daemon thread; stop it with stop_engine()."""
    server = ThreadingHTTPServer((host, port), _EngineHandler)
    server.daemon_threads = True
    server.stopping = threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_engine(server: ThreadingHTTPServer) -> None:
    server.stopping.set()
    server.shutdown()
    server.server_close()


def token(worker_id: str) -> str:
    return base64.urlsafe_b64encode(worker_id.encode()).decode().rstrip("=")


class Recorder:
    """Raw NATS connection subscribed to ``>``, split into scenario segments."""

    def __init__(self) -> None:
        self.messages: list[dict] = []

    async def on_msg(self, msg) -> None:
        self.messages.append(
            {
                "subject": msg.subject,
                "reply": msg.reply or None,
                "headers": dict(msg.headers) if msg.headers else None,
                "payload": msg.data.decode("utf-8"),
            }
        )

    def take(self) -> list[dict]:
        taken, self.messages = self.messages, []
        return taken


_INBOX_RE = re.compile(r"_INBOX\.[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
# $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<timestamp>.<pending>
_JS_ACK_TS_RE = re.compile(r"^(\$JS\.ACK\.(?:[^.]+\.){5})\d+\.")


def _filter(messages: list[dict]) -> tuple[list[dict], dict]:
    """Keep infera.* and _INBOX.* traffic; count the JetStream traffic dropped.

    Dropped: $JS.* subjects, replies to $JS.* requests, and the PubAcks for
    JetStream publishes (replies to an infera.req publish carrying rs-inbox).
    A PubAck sent to a core request's own reply inbox is kept: the earlier
    client reads it as a data frame.
    """
    js_replies = {m["reply"] for m in messages if m["subject"].startswith("$JS.") and m["reply"]}
    pub_ack_inboxes = {
        m["reply"]
        for m in messages
        if m["subject"].startswith("infera.req.")
        and m["reply"]
        and "rs-inbox" in (m["headers"] or {})
    }
    kept = []
    dropped = {"js_subjects": 0, "js_api_replies": 0, "pub_acks": 0}
    for m in messages:
        if m["subject"].startswith("$JS."):
            dropped["js_subjects"] += 1
        elif m["subject"] in js_replies:
            dropped["js_api_replies"] += 1
        elif m["subject"] in pub_ack_inboxes:
            dropped["pub_acks"] += 1
        elif m["subject"].startswith(("infera.", "_INBOX.")):
            kept.append(m)
    return kept, dropped


def _normalize(messages: list[dict], worker_token: str) -> list[dict]:
    names: dict[str, str] = {}

    def fix(text: str | None) -> str | None:
        if text is None:
            return None
        text = _INBOX_RE.sub(lambda m: names.setdefault(m[0], f"_INBOX.{len(names) + 1}"), text)
        text = _JS_ACK_TS_RE.sub(r"\g<1><timestamp>.", text)
        return text.replace(worker_token, "<token>")

    out = []
    for m in messages:
        headers = m["headers"]
        out.append(
            {
                "subject": fix(m["subject"]),
                "reply": fix(m["reply"]),
                "headers": {k: fix(v) for k, v in headers.items()} if headers else None,
                "payload": fix(m["payload"]),
            }
        )
    return out


async def _run_client(client, worker_id: str, payload: dict, first_only: bool) -> list:
    """Consume the earlier client's stream(); stop after one item if asked."""
    yields = []
    async with contextlib.aclosing(client.stream(worker_id, payload)) as agen:
        async for kind, status, data in agen:
            yields.append([kind, status, data.decode("utf-8")])
            if first_only:
                break
    return yields


def _payload(prompt: str, stream: bool) -> dict:
    # Built like the earlier router (infera/router/mixed.py): unary has no
    # "migratable" key; streaming always has it (true when migration is on).
    body = {"model": "m", "prompt": prompt}
    if not stream:
        return {"path": "/v1/completions", "stream": False, "headers": None, "body": body}
    body["stream"] = True
    return {
        "path": "/v1/completions",
        "stream": True,
        "headers": None,
        "body": body,
        "migratable": True,
    }


async def _reset_stream(js) -> None:
    with contextlib.suppress(Exception):
        await js.delete_stream(REQUEST_STREAM)


async def _assert_unserved(nc, worker_ids) -> None:
    """Fail fast if a stray worker would answer (and pollute) the recording."""
    from nats.errors import NoRespondersError

    for worker_id in worker_ids:
        for prefix in ("infera.req", "infera.cancel"):
            subject = f"{prefix}.{token(worker_id)}"
            try:
                await nc.request(subject, b"", timeout=1)
            except NoRespondersError:
                continue
            raise SystemExit(f"{subject} already has a subscriber; use a fresh nats-server")


async def record(legacy_nats_request, nats_url: str, engine_port: int) -> dict:
    import nats

    client_cls = legacy_nats_request.NatsRequestClient
    server_cls = legacy_nats_request.NatsRequestServer
    timeouts = {"idle_timeout": 30, "max_duration": 0}

    recorder = Recorder()
    rec_nc = await nats.connect(nats_url, name="fixture-recorder")
    await _reset_stream(rec_nc.jetstream())
    await _assert_unserved(rec_nc, (CORE_WORKER_ID, JS_WORKER_ID))
    await rec_nc.subscribe(">", cb=recorder.on_msg)
    await rec_nc.flush()

    worker = server_cls(CORE_WORKER_ID, engine_port, url=nats_url, max_pending=0, **timeouts)
    client = client_cls(url=nats_url, max_pending=0, **timeouts)
    await worker.start()
    await client.start()

    scenarios: dict[str, list] = {}
    yields: dict[str, list] = {}
    workers: dict[str, dict] = {}
    filtered: dict[str, dict] = {}

    async def run(name, cli, worker_id, payload, first_only=False, wait=SETTLE_S):
        await asyncio.sleep(SETTLE_S)
        recorder.take()
        yields[name] = await _run_client(cli, worker_id, payload, first_only)
        await asyncio.sleep(wait)
        await rec_nc.flush()
        kept, filtered[name] = _filter(recorder.take())
        scenarios[name] = _normalize(kept, token(worker_id))
        workers[name] = {"worker_id": worker_id, "token": token(worker_id)}

    await run("unary", client, CORE_WORKER_ID, _payload("hi", False))
    await run("stream", client, CORE_WORKER_ID, _payload("hi", True))
    await run("error", client, CORE_WORKER_ID, _payload("bad", False))
    await run("error_stream", client, CORE_WORKER_ID, _payload("bad", True))
    await run("cancel", client, CORE_WORKER_ID, _payload("slow", True), True, CANCEL_WAIT_S)

    js_worker = server_cls(JS_WORKER_ID, engine_port, url=nats_url, max_pending=1, **timeouts)
    js_client = client_cls(url=nats_url, max_pending=1, **timeouts)
    await js_worker.start()
    await js_client.start()
    await run("jetstream", js_client, JS_WORKER_ID, _payload("hi", False))
    # The stream now captures infera.req.> for every worker, core ones too.
    await run("unary_core_with_stream", client, CORE_WORKER_ID, _payload("hi", False))

    for closable in (js_client, client):
        await closable.aclose()
    for server in (js_worker, worker):
        await server.stop()
    await _reset_stream(rec_nc.jetstream())
    await rec_nc.drain()
    return {
        "workers": workers,
        "client_yields": yields,
        "jetstream_filtered": filtered,
        "scenarios": scenarios,
    }


def _git_head(path: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", path, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--legacy", required=True, help="earlier Python Infera checkout")
    parser.add_argument("--nats", required=True, help="NATS URL (JetStream enabled)")
    parser.add_argument("--out", required=True, help="output JSON path")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    sys.path.insert(0, args.legacy)
    from infera.common import nats_request

    engine = start_engine()
    try:
        recorded = asyncio.run(record(nats_request, args.nats, engine.server_address[1]))
    finally:
        stop_engine(engine)
    fixture = {
        "generated_by": "engine-sidecar/testdata/request_plane/make_fixtures.py",
        "earlier_commit": _git_head(args.legacy),
        "notes": [
            "worker_id is fixed (not the engine's real port) so tokens are stable.",
            "Inboxes are renamed _INBOX.N per scenario in order of first appearance.",
            "$JS.ACK reply subjects have their timestamp token replaced by <timestamp>.",
            "client_yields: (kind, status, data) tuples the earlier client yielded.",
            "jetstream_filtered: counts of JetStream traffic dropped per scenario.",
            "unary_core_with_stream: core request sent while INFERA_REQUESTS exists.",
        ],
        **recorded,
    }
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(fixture, fh, indent=2)
        fh.write("\n")


if __name__ == "__main__":
    main()
