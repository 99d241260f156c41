#!/usr/bin/env python3
"""Stand-alone NATS request-plane client behaving like the earlier Python one.

Sends one request envelope to ``infera.req.<token>`` (token =
base64url(worker_id), unpadded) and prints every reply frame as a JSON line
``{"type", "status", "headers", "payload"}`` until a done or error frame.
When no frame arrives for ``--idle-timeout`` seconds it prints
``{"type": "timeout"}`` and publishes the inbox to ``infera.cancel.<token>``
three times, one second apart, as the earlier client does. Exits 0.

Usage (Python 3.11, ``pip install --no-deps -r requirements.txt``)::

    python earlier_client.py --nats nats://127.0.0.1:4222 \\
        --worker-id 127.0.0.1:8000 --path /v1/completions \\
        --body '{"model": "m", "prompt": "hi"}' [--stream [--migratable]] \\
        [--jetstream] [--idle-timeout 900]

``--jetstream`` publishes through JetStream (stream INFERA_REQUESTS, created
if missing) with the inbox in header ``rs-inbox``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json

import nats
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

REQUEST_STREAM = "INFERA_REQUESTS"
CANCEL_SENDS = 3
CANCEL_GAP_S = 1.0


def token(worker_id: str) -> str:
    return base64.urlsafe_b64encode(worker_id.encode()).decode().rstrip("=")


def envelope(args) -> bytes:
    """The earlier router's payload: ``migratable`` only on streaming requests."""
    payload = {
        "path": args.path,
        "stream": args.stream,
        "headers": None,
        "body": json.loads(args.body),
    }
    if args.stream:
        payload["migratable"] = args.migratable
    return json.dumps(payload).encode()


async def ensure_request_stream(js) -> None:
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


def frame(msg) -> dict:
    headers = dict(msg.headers or {})
    status = headers.get("rs-status")
    return {
        "type": headers.get("rs-type", "data"),
        "status": int(status) if status else None,
        "headers": headers,
        "payload": msg.data.decode("utf-8", errors="replace"),
    }


async def run(args) -> None:
    nc = await nats.connect(args.nats, name="earlier-client")
    tok = token(args.worker_id)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    subject = f"infera.req.{tok}"
    if args.jetstream:
        js = nc.jetstream()
        await ensure_request_stream(js)
        await js.publish(subject, envelope(args), headers={"rs-inbox": inbox})
    else:
        await nc.publish(subject, envelope(args), reply=inbox)

    timeout = args.idle_timeout if args.idle_timeout > 0 else None
    while True:
        try:
            msg = await sub.next_msg(timeout=timeout)
        except NatsTimeoutError:
            print(json.dumps({"type": "timeout"}), flush=True)
            await sub.unsubscribe()
            for i in range(CANCEL_SENDS):
                if i:
                    await asyncio.sleep(CANCEL_GAP_S)
                await nc.publish(f"infera.cancel.{tok}", inbox.encode())
            break
        out = frame(msg)
        print(json.dumps(out), flush=True)
        if out["type"] in ("done", "error"):
            break
    # Not drain(): the worker's trailing empty message would sit unread.
    await nc.flush()
    await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", required=True, help="NATS URL")
    parser.add_argument("--worker-id", required=True, help="worker id, e.g. 127.0.0.1:8000")
    parser.add_argument("--path", required=True, help="engine path, e.g. /v1/completions")
    parser.add_argument("--body", required=True, help="request body (JSON)")
    parser.add_argument("--stream", action="store_true", help="streaming request")
    parser.add_argument("--migratable", action="store_true", help="mark a stream migratable")
    parser.add_argument("--jetstream", action="store_true", help="publish via JetStream")
    parser.add_argument(
        "--idle-timeout", type=float, default=900, help="seconds per frame; 0 = wait forever"
    )
    args = parser.parse_args()
    if args.migratable and not args.stream:
        parser.error("--migratable requires --stream (unary envelopes carry no such key)")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
