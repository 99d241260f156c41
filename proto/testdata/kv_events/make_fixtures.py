#!/usr/bin/env python3
"""Writes KV-event batch fixtures in every layout engines emit, using msgspec
(pip install msgspec) with the same Struct options as each engine's own classes,
plus expected.json: what a correct decoder must read from each fixture.

Layouts and where their class definitions were read:

- sglang: SGLang python/sglang/srt/disaggregation/kv_events.py (v0.5.x, commit
  006d053f): EventBatch(array_like, omit_defaults) with ts, events (no rank: a
  data-parallel rank publishes on port base+rank); KVCacheEvent(array_like,
  omit_defaults, tag=True); BlockStored(block_hashes, parent_block_hash, token_ids,
  block_size, lora_id); BlockRemoved(block_hashes).
- vllm-array: vLLM v0.10.x vllm/distributed/kv_events.py: EventBatch(array_like,
  omit_defaults) with data_parallel_rank; KVCacheEvent(array_like, omit_defaults,
  tag=True); BlockStored adds medium; BlockRemoved(block_hashes, medium).
- vllm-tagged-map: vLLM 0.25.x (the version the earlier Infera pinned) and ATOM:
  EventBatch still array_like, KVCacheEvent(omit_defaults, tag=True) without
  array_like, so each event is a map tagged {"type": "BlockStored", ...};
  BlockStored adds lora_name, extra_keys, group_idx, kv_cache_spec_kind,
  kv_cache_spec_sliding_window.
- vllm-map-batch: vLLM main (commit 0181ea3173e5): EventBatch(omit_defaults)
  without array_like, so the batch is a map too.

Hashes are ints (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, and SGLang) or 32-byte
sha256 digests (vLLM's default since block hashes became bytes).
Run from this folder: python3 make_fixtures.py
"""
import hashlib
import json
from typing import Any, Optional, Union

import msgspec

# --- sglang ---------------------------------------------------------------------------


class SgBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class SgEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class SgBlockStored(SgEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]


class SgBlockRemoved(SgEvent, tag="BlockRemoved"):
    block_hashes: list[int]


class SgAllBlocksCleared(SgEvent, tag="AllBlocksCleared"):
    pass


# --- vLLM 0.10.x: arrays all the way ----------------------------------------------------

Hash = Union[bytes, int]


class V10Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class V10Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class V10BlockStored(V10Event, tag="BlockStored"):
    block_hashes: list[Hash]
    parent_block_hash: Optional[Hash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]


class V10BlockRemoved(V10Event, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: Optional[str]


class V10AllBlocksCleared(V10Event, tag="AllBlocksCleared"):
    pass


# --- vLLM 0.25.x / ATOM: array batch, tagged-map events -------------------------------


class TmBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class TmEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class TmBlockStored(TmEvent, tag="BlockStored"):
    block_hashes: list[Hash]
    parent_block_hash: Optional[Hash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None


class TmBlockRemoved(TmEvent, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: Optional[str]
    group_idx: Optional[int] = None


class TmAllBlocksCleared(TmEvent, tag="AllBlocksCleared"):
    pass


# --- vLLM main: the batch is a map too ---------------------------------------------------


class MbBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


def digest(i):
    return hashlib.sha256(f"block-{i}".encode()).digest()


def norm_hash(h):
    return f"b:{h.hex()}" if isinstance(h, bytes) else f"i:{h}"


FIELDS = ["lora_id", "medium", "lora_name", "group_idx", "kv_cache_spec_kind",
          "kv_cache_spec_sliding_window"]


def expect_event(e):
    """The normalized view a decoder must produce; absent fields read as null."""
    kind = type(e).__struct_config__.tag
    out = {"type": kind}
    if kind == "AllBlocksCleared":
        return out
    out["block_hashes"] = [norm_hash(h) for h in e.block_hashes]
    if kind == "BlockStored":
        p = e.parent_block_hash
        out["parent_block_hash"] = None if p is None else norm_hash(p)
        out["token_ids"] = list(e.token_ids)
        out["block_size"] = e.block_size
        for f in FIELDS:
            out[f] = getattr(e, f, None)
    else:
        out["medium"] = getattr(e, "medium", None)
        out["group_idx"] = getattr(e, "group_idx", None)
    return out


def fixtures():
    big = 2**64 - 1  # an unsigned 64-bit hash above i64::MAX
    yield "sglang", SgBatch(ts=1732900000.25, events=[
        SgBlockStored(block_hashes=[11, 12], parent_block_hash=None,
                      token_ids=list(range(8)), block_size=4, lora_id=None),
        SgBlockStored(block_hashes=[13], parent_block_hash=12,
                      token_ids=[8, 9, 10, 11], block_size=4, lora_id=None),
        SgBlockRemoved(block_hashes=[13]),
        SgAllBlocksCleared(),
    ])
    yield "vllm-array", V10Batch(ts=1732900001.5, data_parallel_rank=1, events=[
        V10BlockStored(block_hashes=[big, -5], parent_block_hash=None,
                       token_ids=list(range(32)), block_size=16, lora_id=None, medium="GPU"),
        V10BlockStored(block_hashes=[digest(3)], parent_block_hash=-5,
                       token_ids=list(range(32, 48)), block_size=16, lora_id=7, medium="GPU"),
        V10BlockRemoved(block_hashes=[big], medium="GPU"),
        V10AllBlocksCleared(),
    ])
    yield "vllm-tagged-map", TmBatch(ts=1732900002.0, events=[
        TmBlockStored(block_hashes=[digest(0), digest(1)], parent_block_hash=None,
                      token_ids=list(range(128)), block_size=64, lora_id=None,
                      medium="GPU", lora_name=None, group_idx=0,
                      kv_cache_spec_kind="full_attention"),
        TmBlockStored(block_hashes=[digest(2)], parent_block_hash=digest(1),
                      token_ids=list(range(128, 192)), block_size=64, lora_id=3,
                      medium="GPU", lora_name="adapter-fixture",
                      extra_keys=[("mm-hash-fixture",)], group_idx=0,
                      kv_cache_spec_kind="mla_attention"),
        TmBlockStored(block_hashes=[digest(9)], parent_block_hash=None,
                      token_ids=list(range(64)), block_size=64, lora_id=None,
                      medium="GPU", lora_name=None, group_idx=1,
                      kv_cache_spec_kind="mamba"),
        TmBlockRemoved(block_hashes=[digest(2)], medium="GPU", group_idx=0),
        TmAllBlocksCleared(),
    ])
    yield "vllm-map-batch", MbBatch(ts=1732900003.125, data_parallel_rank=0, events=[
        TmBlockStored(block_hashes=[1, 2], parent_block_hash=None,
                      token_ids=list(range(32)), block_size=16, lora_id=None,
                      medium="GPU", lora_name=None, group_idx=0,
                      kv_cache_spec_kind="sink_full_attention"),
        TmBlockStored(block_hashes=[3], parent_block_hash=2,
                      token_ids=list(range(32, 48)), block_size=16, lora_id=None,
                      medium="CPU", lora_name=None, group_idx=0,
                      kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128),
        TmBlockRemoved(block_hashes=[1, 2], medium="GPU"),
        TmAllBlocksCleared(),
    ])


if __name__ == "__main__":
    enc = msgspec.msgpack.Encoder()
    expected = {}
    for name, batch in fixtures():
        with open(f"{name}.msgpack", "wb") as f:
            f.write(enc.encode(batch))
        expected[name] = {
            "ts": batch.ts,
            "data_parallel_rank": getattr(batch, "data_parallel_rank", None),
            "events": [expect_event(e) for e in batch.events],
        }
    with open("expected.json", "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print(f"msgspec {msgspec.__version__}: wrote {len(expected)} fixtures")
