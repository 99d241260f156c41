#!/usr/bin/env python3
"""Writes frames.json: kvd wire-protocol frames (see shared PROTOCOLS.md, "kvd wire
protocol") encoded by Python's msgpack package, independently of the Rust code.

Pinned: msgpack==1.2.4 (proto/testdata/requirements.txt). A frame is a u32
big-endian length followed by a msgpack map whose first key is "op", the other
fields following in the order of the field table; bytes are bin, strings str, ints
in the smallest form msgpack's packer picks, absent values nil.

Each entry: {"name", "direction": "request"|"reply", "map" (the map as JSON, bytes
written as {"bin": "<hex>"}), "frame_hex"}. Reason and message strings are examples:
only the codes and the field layout are part of the contract.
Run from this folder: python3 make_frames.py
"""
import json
import struct

import msgpack

KEY = bytes(range(8))                                  # 00 01 .. 07
KEY2 = bytes(range(8, 16))                             # 08 09 .. 0f
VALUE = b"kv-bytes"                                    # 8 bytes
VALUE2 = b"KV-BYTES"
MODEL = "llama-3-8b"
COMPAT = "fp16-tp1"
SLOT_SIZE = 64                                         # round_up(16 + 8, 64)
ARENA_SIZE = 64 * 1024 * 1024
PID = 4242
LEASE = 7

REQUESTS = [
    # One frame per request op, every field given.
    ("hello", {"op": "hello", "client_id": "vllm-0", "protocol_version": 1,
               "prefers_shared_arena": True}),
    ("get", {"op": "get", "key": KEY, "model": MODEL, "compat_key": COMPAT}),
    ("batch_get", {"op": "batch_get", "keys": [KEY, KEY2], "model": MODEL,
                   "compat_key": COMPAT}),
    ("set", {"op": "set", "key": KEY, "value": VALUE, "retention": "long",
             "model": MODEL, "compat_key": COMPAT,
             "metadata": {"source": "prefill", "tokens": 16}, "ttl_seconds": 3600}),
    ("batch_set", {"op": "batch_set", "keys": [KEY, KEY2], "values": [VALUE, VALUE2],
                   "retentions": ["short", "long"],
                   "metadatas": [{}, {"source": "prefill"}],
                   "model": MODEL, "compat_key": COMPAT, "ttls_seconds": [None, 3600]}),
    ("set_reserve", {"op": "set_reserve", "size": 4096}),
    ("set_commit", {"op": "set_commit", "lease_token": LEASE, "key": KEY, "length": 8,
                    "model": MODEL, "compat_key": COMPAT, "retention": "short",
                    "ttl_seconds": 600}),
    ("set_cancel", {"op": "set_cancel", "lease_token": LEASE}),
    ("prefetch_hint", {"op": "prefetch_hint", "keys": [KEY, KEY2], "model": MODEL,
                       "compat_key": COMPAT, "deadline_ms": 250}),
    ("exists", {"op": "exists", "keys": [KEY, KEY2], "model": MODEL,
                "compat_key": COMPAT}),
    # An Infera extension (the earlier `lookup_tier` for several keys at once).
    ("batch_lookup_tier", {"op": "batch_lookup_tier", "keys": [KEY, KEY2],
                           "model": MODEL, "compat_key": COMPAT}),
    ("clear", {"op": "clear", "model": MODEL, "compat_key": COMPAT}),
    ("stats", {"op": "stats"}),
    # Optional fields omitted (the daemon applies the defaults).
    ("get_minimal", {"op": "get", "key": KEY}),
    ("set_minimal", {"op": "set", "key": KEY, "value": VALUE}),
    ("set_ttl_nil", {"op": "set", "key": KEY, "value": VALUE, "retention": "short",
                     "model": "", "compat_key": "", "metadata": {},
                     "ttl_seconds": None}),
    ("hello_minimal", {"op": "hello", "client_id": "vllm-0"}),
]

REPLIES = [
    ("hello_ack_shared_arena", {"op": "hello_ack", "server_id": "infera-kvd",
                                "protocol_version": 1,
                                "shared_arena": [ARENA_SIZE, 0, PID]}),
    ("hello_ack_no_arena", {"op": "hello_ack", "server_id": "infera-kvd",
                            "protocol_version": 1, "shared_arena": None}),
    ("get_response_hit", {"op": "get_response", "value": VALUE, "retention": "long"}),
    ("get_response_miss", {"op": "get_response", "value": None, "retention": None}),
    ("get_shared_response", {"op": "get_shared_response",
                             "slot_offset": 3 * SLOT_SIZE + 16, "length": 8,
                             "version": 2, "retention": "long",
                             "slot_size": SLOT_SIZE}),
    ("batch_get_response", {"op": "batch_get_response", "values": [VALUE, None],
                            "retentions": ["short", None]}),
    ("batch_get_shared_response", {"op": "batch_get_shared_response",
                                   "offsets": [16, -1], "lengths": [8, 0],
                                   "versions": [2, 0], "retentions": ["short", None],
                                   "slot_size": SLOT_SIZE}),
    ("set_ack_accepted", {"op": "set_ack", "accepted": True, "reason": None}),
    ("set_ack_rejected", {"op": "set_ack", "accepted": False,
                          "reason": "retention downgrade: existing entry is long"}),
    ("batch_set_ack", {"op": "batch_set_ack", "accepted": [True, False],
                       "reasons": [None, "ttl_seconds <= 0: not stored"]}),
    ("set_reserve_response", {"op": "set_reserve_response", "lease_token": LEASE,
                              "slot_id": 3, "payload_offset": 3 * SLOT_SIZE + 16,
                              "payload_max_size": SLOT_SIZE - 16, "reason": ""}),
    ("set_reserve_response_failure", {"op": "set_reserve_response", "lease_token": 0,
                                      "slot_id": -1, "payload_offset": -1,
                                      "payload_max_size": 0,
                                      "reason": "size 4096 exceeds slot payload size 48"}),
    ("set_commit_response", {"op": "set_commit_response", "accepted": True,
                             "reason": None}),
    ("set_cancel_response", {"op": "set_cancel_response"}),
    ("exists_response", {"op": "exists_response", "present": [True, False]}),
    ("batch_lookup_tier_response", {"op": "batch_lookup_tier_response",
                                    "tiers": ["ram", "file", "remote", "miss"]}),
    ("clear_ack", {"op": "clear_ack", "cleared_entries": 2}),
    ("stats_response", {"op": "stats_response", "entries": 2, "host_bytes": 128,
                        "spillover_bytes": 0, "long_bytes": 64, "gets_total": 5,
                        "sets_total": 3, "hits_total": 4, "misses_total": 1,
                        "evictions_total": 0}),
    ("error", {"op": "error", "code": "unknown_op",
               "message": "unknown op \"frobnicate\""}),
]


def to_json(value):
    if isinstance(value, bytes):
        return {"bin": value.hex()}
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    return value


def frame(msg):
    body = msgpack.packb(msg, use_bin_type=True)
    # The packed bytes must read back as the same map, "op" first.
    back = msgpack.unpackb(body, raw=False)
    assert back == msg and next(iter(back)) == "op", msg
    return struct.pack(">I", len(body)) + body


def main():
    out, names = [], set()
    for direction, table in (("request", REQUESTS), ("reply", REPLIES)):
        for name, msg in table:
            assert name not in names, name
            names.add(name)
            out.append({"name": name, "direction": direction, "map": to_json(msg),
                        "frame_hex": frame(msg).hex()})
    with open("frames.json", "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
