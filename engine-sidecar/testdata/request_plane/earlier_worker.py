#!/usr/bin/env python3
"""Stand-alone NATS request-plane worker behaving like the earlier Python one.

Serves ``infera.req.<token>`` (token = base64url(worker_id), unpadded) by
proxying each request envelope to a local engine over HTTP and streaming the
reply back to the request's inbox as ``rs-type`` data / done / error frames.
An inbox published on ``infera.cancel.<token>`` aborts that request.

Usage (Python 3.11, ``pip install --no-deps -r requirements.txt``)::

    python earlier_worker.py --nats nats://127.0.0.1:4222 \\
        --worker-id 127.0.0.1:8000 --engine http://127.0.0.1:8000 [--max-pending N]

With ``--max-pending`` > 0 requests come from a durable JetStream consumer
on the INFERA_REQUESTS work-queue stream, with the inbox in header
``rs-inbox``. Stdout carries only ``ready`` and ``cancelled <inbox>`` lines;
logs go to stderr. SIGTERM or SIGINT stops the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import signal

import httpx
import nats
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

REQUEST_STREAM = "INFERA_REQUESTS"
ACK_WAIT_S = 3600
HTTP_IDLE_TIMEOUT_S = 900

log = logging.getLogger("earlier_worker")


def token(worker_id: str) -> str:
    return base64.urlsafe_b64encode(worker_id.encode()).decode().rstrip("=")


async def ensure_request_stream(js) -> None:
    """Create (or else update) the work-queue stream behind infera.req.>."""
    config = StreamConfig(
        name=REQUEST_STREAM,
        subjects=["infera.req.>"],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.MEMORY,
        discard=DiscardPolicy.OLD,
        max_msgs=1_000_000,
    )
    try:
        await js.add_stream(config)
    except Exception:  # noqa: BLE001 - exists with other settings
        await js.update_stream(config)


class Worker:
    def __init__(self, nc, engine: str) -> None:
        self.nc = nc
        self.engine = engine.rstrip("/")
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(HTTP_IDLE_TIMEOUT_S, connect=30.0))
        self.inflight: dict[str, asyncio.Task] = {}

    async def reply(self, inbox: str, kind: str, data: bytes = b"", status=None) -> None:
        headers = {"rs-type": kind}
        if status is not None:
            headers["rs-status"] = str(status)
        await self.nc.publish(inbox, data, headers=headers)

    async def on_request(self, msg) -> None:
        inbox = (msg.headers or {}).get("rs-inbox") or msg.reply
        if not inbox:
            log.warning("request without a reply inbox on %s; dropped", msg.subject)
            await acknowledge(msg)
            return
        self.inflight[inbox] = asyncio.create_task(self.serve(inbox, msg))

    async def on_cancel(self, msg) -> None:
        inbox = msg.data.decode(errors="replace")
        task = self.inflight.get(inbox)
        if task is not None and not task.done():
            task.cancel()
            print(f"cancelled {inbox}", flush=True)

    async def serve(self, inbox: str, msg) -> None:
        try:
            await self.proxy(inbox, json.loads(msg.data))
        except asyncio.CancelledError:
            await self.reply(inbox, "error", b"request cancelled")
        except Exception as exc:  # noqa: BLE001 - reported to the client
            log.warning("request failed: %s", exc)
            await self.reply(inbox, "error", str(exc).encode())
        finally:
            self.inflight.pop(inbox, None)
            await acknowledge(msg)

    async def proxy(self, inbox: str, envelope: dict) -> None:
        url = self.engine + envelope.get("path", "/v1/chat/completions")
        body = envelope.get("body", {})
        headers = envelope.get("headers") or None
        if envelope.get("stream"):
            async with self.http.stream("POST", url, json=body, headers=headers) as resp:
                async for chunk in resp.aiter_raw():
                    if chunk:
                        await self.reply(inbox, "data", chunk)
        else:
            resp = await self.http.post(url, json=body, headers=headers)
            await self.reply(inbox, "data", resp.content)
        await self.reply(inbox, "done", status=resp.status_code)

    async def close(self) -> None:
        for task in list(self.inflight.values()):
            task.cancel()
        await asyncio.gather(*self.inflight.values(), return_exceptions=True)
        await self.http.aclose()


async def acknowledge(msg) -> None:
    """Ack the request once answered, as the earlier worker does.

    A JetStream message acks to its $JS.ACK subject. A core message has no
    ack subject, so this is an empty, header-less publish to its reply
    inbox, arriving after the final frame: clients must ignore it.
    """
    if msg.reply:
        await msg.ack()


async def run(args) -> None:
    nc = await nats.connect(args.nats, name="earlier-worker", max_reconnect_attempts=-1)
    worker = Worker(nc, args.engine)
    tok = token(args.worker_id)
    await nc.subscribe(f"infera.cancel.{tok}", cb=worker.on_cancel)
    subject = f"infera.req.{tok}"
    js = None
    if args.max_pending > 0:
        js = nc.jetstream()
        await ensure_request_stream(js)
        await js.subscribe(
            subject,
            durable=tok,
            cb=worker.on_request,
            manual_ack=True,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_S, max_deliver=1
            ),
        )
    else:
        await nc.subscribe(subject, cb=worker.on_request)
    await nc.flush()
    log.info("serving %s -> %s", subject, args.engine)
    print("ready", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await worker.close()
    if js is not None:
        # The durable outlives the subscription; a new worker id never reuses it.
        await js.delete_consumer(REQUEST_STREAM, tok)
    await nc.drain()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", required=True, help="NATS URL")
    parser.add_argument("--worker-id", required=True, help="worker id, e.g. 127.0.0.1:8000")
    parser.add_argument("--engine", required=True, help="engine base URL")
    parser.add_argument("--max-pending", type=int, default=0, help="> 0: JetStream mode")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
