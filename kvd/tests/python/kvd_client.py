#!/usr/bin/env python3
"""End-to-end check of a running infera-kvd, written from the "kvd wire protocol"
field table only (Python 3.11 stdlib + msgpack).

Usage: kvd_client.py SOCKET_PATH [MAX_VALUE_BYTES]

MAX_VALUE_BYTES is the daemon's --max-value-bytes (default 1048576); one set of that
+ 1 bytes must be refused with value_too_large. Prints one line per step and
"ALL OK" at the end; exits 1 on a failed check, 2 when the socket cannot be reached.
Every entry it writes is under a model name unique to this run.
"""
import mmap
import os
import socket
import struct
import sys
import time

import msgpack

TIMEOUT_S = 10.0
HEADER = 16
RETENTIONS = ("none", "ephemeral", "short", "long")
STATS_FIELDS = ("entries", "host_bytes", "spillover_bytes", "long_bytes", "gets_total",
                "sets_total", "hits_total", "misses_total", "evictions_total")


class Failure(Exception):
    pass


class CannotConnect(Exception):
    pass


class Closed(Exception):
    """The daemon closed the connection."""


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def round_up(n, align):
    return (n + align - 1) // align * align


class Conn:
    def __init__(self, path, label):
        self.label = label
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        try:
            self.sock.connect(path)
        except OSError as e:
            self.sock.close()
            raise CannotConnect(f"cannot connect to {path}: {e}") from e

    def close(self):
        self.sock.close()

    def send_body(self, body):
        try:
            self.sock.sendall(struct.pack(">I", len(body)) + body)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise Closed(f"[{self.label}] connection closed by the daemon while sending: {e}")
        except socket.timeout:
            raise Failure(f"[{self.label}] timed out ({TIMEOUT_S:.0f} s) sending a frame")

    def send(self, msg):
        self.send_body(msgpack.packb(msg, use_bin_type=True))

    def _recv_exact(self, n, what):
        # Exact-size reads only: reading past a frame could swallow the byte that
        # carries the memfd (and with it the fd).
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:], n - got)
            except socket.timeout:
                raise Failure(f"[{self.label}] timed out ({TIMEOUT_S:.0f} s) waiting for {what}")
            except ConnectionResetError:
                raise Closed(f"[{self.label}] connection reset while waiting for {what}")
            if k == 0:
                raise Closed(f"[{self.label}] connection closed while waiting for {what}")
            got += k
        return bytes(buf)

    def recv(self, what="a reply"):
        (length,) = struct.unpack(">I", self._recv_exact(4, what))
        check(length <= 64 << 20, f"[{self.label}] absurd frame length {length} for {what}")
        body = self._recv_exact(length, what)
        try:
            msg = msgpack.unpackb(body, raw=False)
        except Exception as e:  # noqa: BLE001 - any decode failure is a protocol failure
            raise Failure(f"[{self.label}] reply to {what} is not msgpack: {e}")
        check(isinstance(msg, dict), f"[{self.label}] reply to {what} is not a map: {msg!r}")
        check(next(iter(msg), None) == "op", f"[{self.label}] reply to {what} does not start with op: {list(msg)}")
        return msg

    def call(self, msg):
        self.send(msg)
        return self.recv(f"the reply to {msg['op']}")

    def recv_fd(self):
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 1, 1)
        except socket.timeout:
            raise Failure(f"[{self.label}] timed out waiting for the memfd after hello_ack")
        check(len(fds) == 1, f"[{self.label}] expected 1 fd over SCM_RIGHTS after hello_ack, got {len(fds)}")
        check(data == b"\0", f"[{self.label}] the fd-carrying byte is {data!r}, expected b'\\x00'")
        return fds[0]


def expect_op(reply, op, fields=()):
    if reply.get("op") == "error" and op != "error":
        raise Failure(f"expected {op}, got error {reply.get('code')!r}: {reply.get('message')!r}")
    check(reply.get("op") == op, f"expected op {op}, got {reply!r}")
    want = ["op", *fields]
    check(list(reply) == want, f"{op}: fields {list(reply)}, expected exactly {want} in that order")
    return reply


def expect_error(reply, code):
    expect_op(reply, "error", ("code", "message"))
    check(reply["code"] == code, f"expected error code {code!r}, got {reply['code']!r} ({reply['message']!r})")
    check(isinstance(reply["message"], str), f"error message is not a str: {reply!r}")
    return reply


GET_RESPONSE = ("value", "retention")
GET_SHARED = ("slot_offset", "length", "version", "retention", "slot_size")
BATCH_GET_RESPONSE = ("values", "retentions")
BATCH_GET_SHARED = ("offsets", "lengths", "versions", "retentions", "slot_size")


class Client:
    def __init__(self, path, max_value):
        self.path = path
        self.max_value = max_value
        run = (os.getpid() << 8 ^ int(time.time())) & 0xFFFFFFFF
        self.run = run
        self.model = f"kvd-client-test-{run:08x}"
        self.compat = ""
        self.mm = None
        self.inline = None     # connection used for torn-read fallback
        self.step_no = 0

    def key(self, n):
        return struct.pack(">IHH", self.run, 0x6B76, n)

    def value(self, n, size):
        pattern = f"value-{n}-".encode()
        return (pattern * (size // len(pattern) + 1))[:size]

    def step(self, text):
        self.step_no += 1
        self.current = f"step {self.step_no}: {text}"

    def ok(self, extra=""):
        print(f"{self.current} ... ok{(' (' + extra + ')') if extra else ''}", flush=True)

    def connect(self, label, prefers_arena):
        conn = Conn(self.path, label)
        ack = conn.call({"op": "hello", "client_id": f"kvd-client-{label}",
                         "protocol_version": 1, "prefers_shared_arena": prefers_arena})
        expect_op(ack, "hello_ack", ("server_id", "protocol_version", "shared_arena"))
        check(isinstance(ack["server_id"], str) and ack["server_id"],
              f"server_id must be a non-empty str: {ack!r}")
        check(ack["protocol_version"] == 1 and is_int(ack["protocol_version"]),
              f"protocol_version must be 1: {ack!r}")
        return conn, ack

    def sync(self, conn):
        """A stats round trip: proves the next frame read is the reply to what was sent."""
        reply = conn.call({"op": "stats"})
        expect_op(reply, "stats_response", STATS_FIELDS)
        return reply

    def set(self, conn, key, value, **extra):
        msg = {"op": "set", "key": key, "value": value, "retention": "short",
               "model": self.model, "compat_key": self.compat}
        msg.update(extra)
        return conn.call(msg)

    def expect_set_ok(self, reply):
        expect_op(reply, "set_ack", ("accepted", "reason"))
        check(reply["accepted"] is True, f"set not accepted: {reply!r}")
        check(reply["reason"] is None, f"accepted set_ack must have reason nil: {reply!r}")

    def expect_set_rejected(self, reply, op="set_ack"):
        expect_op(reply, op, ("accepted", "reason"))
        check(reply["accepted"] is False, f"{op} was accepted, expected a rejection: {reply!r}")
        check(isinstance(reply["reason"], str) and reply["reason"],
              f"rejected {op} must carry a reason str: {reply!r}")

    def get(self, conn, key):
        return conn.call({"op": "get", "key": key, "model": self.model,
                          "compat_key": self.compat})

    def inline_get(self, key):
        if self.inline is None:
            self.inline, ack = self.connect("fallback", False)
        reply = self.get(self.inline, key)
        expect_op(reply, "get_response", GET_RESPONSE)
        return reply["value"]

    def seqlock_read(self, offset, length, version, slot_size):
        """Reads a payload in place. Returns (bytes, None) or (None, why torn)."""
        check(is_int(offset) and offset >= HEADER, f"slot_offset {offset!r} invalid")
        check(is_int(length) and 0 <= length <= slot_size - HEADER,
              f"length {length!r} does not fit slot_size {slot_size}")
        check(offset % slot_size == HEADER,
              f"slot_offset {offset} is not slot start + 16 for slot_size {slot_size}")
        check(offset + length <= len(self.mm), f"payload {offset}+{length} past arena end {len(self.mm)}")
        hdr = offset - HEADER
        (v1,) = struct.unpack_from("<I", self.mm, hdr)
        if v1 & 1:
            return None, f"version {v1} odd before the read"
        (hlen,) = struct.unpack_from("<I", self.mm, hdr + 4)
        data = self.mm[offset:offset + length]
        (v2,) = struct.unpack_from("<I", self.mm, hdr)
        if v1 != v2:
            return None, f"version changed {v1} -> {v2} during the read"
        if v1 != version:
            return None, f"header version {v1} != reply version {version}"
        if hlen != length:
            return None, f"header length {hlen} != reply length {length}"
        return data, None

    def read_shared(self, reply_fields, key, quiescent=True):
        """Reads one shared hit; on a torn read falls back to an inline get (on a
        connection that did not prefer the arena). With no concurrent writer, a torn
        read is itself a failure."""
        offset, length, version, slot_size = reply_fields
        data, torn = self.seqlock_read(offset, length, version, slot_size)
        if torn is not None:
            check(not quiescent, f"torn read with no concurrent writer: {torn}")
            data = self.inline_get(key)
        return data

    def expect_shared_get(self, conn, key, want, retention):
        reply = self.get(conn, key)
        expect_op(reply, "get_shared_response", GET_SHARED)
        for f in ("slot_offset", "length", "version", "slot_size"):
            check(is_int(reply[f]), f"get_shared_response.{f} not an int: {reply!r}")
        check(reply["version"] % 2 == 0 and reply["version"] > 0,
              f"get_shared_response.version must be even and > 0: {reply!r}")
        check(reply["slot_size"] % 64 == 0 and reply["slot_size"] >= HEADER + len(want),
              f"slot_size {reply['slot_size']} not 64-aligned or too small")
        check(reply["slot_size"] == self.slot_size,
              f"slot_size changed: {self.slot_size} -> {reply['slot_size']}")
        check(reply["retention"] == retention, f"retention {reply['retention']!r}, expected {retention!r}")
        check(reply["length"] == len(want), f"length {reply['length']}, expected {len(want)}")
        data = self.read_shared((reply["slot_offset"], reply["length"], reply["version"],
                                 reply["slot_size"]), key)
        check(data == want, "bytes read from the arena differ from the value set")
        return reply

    # ----------------------------------------------------------------------------------

    def run_all(self):
        # 1. hello with the arena, memfd over SCM_RIGHTS, mmap it.
        self.step("hello prefers_shared_arena=True, receive memfd, mmap MAP_SHARED rw")
        main, ack = self.connect("main", True)
        sa = ack["shared_arena"]
        check(isinstance(sa, list) and len(sa) == 3 and all(is_int(x) for x in sa),
              f"shared_arena must be [arena_size, slot_size, server_pid], got {sa!r}")
        arena_size, slot_size, pid = sa
        check(arena_size > 0 and pid > 0 and slot_size >= 0, f"bad shared_arena {sa!r}")
        check(slot_size == 0 or slot_size % 64 == 0, f"slot_size {slot_size} not 64-aligned")
        fd = main.recv_fd()
        st = os.fstat(fd)
        check(st.st_size >= arena_size, f"memfd size {st.st_size} < arena_size {arena_size}")
        self.mm = mmap.mmap(fd, arena_size, flags=mmap.MAP_SHARED,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fd)
        self.sync(main)  # nothing stray after the fd byte
        # Values sized to fit a slot: the first value fixes the slot size.
        size = 4096 if slot_size == 0 else min(4096, slot_size - HEADER)
        check(size >= 1, f"slot_size {slot_size} leaves no room for a payload")
        self.slot_size = slot_size
        self.ok(f"arena {arena_size} B, slot_size {slot_size}, pid {pid}, value size {size}")

        # 2. set long, get -> shared, seqlock read.
        self.step("set (long) then get -> get_shared_response, seqlock read in place")
        k1, v1 = self.key(1), self.value(1, size)
        self.expect_set_ok(self.set(main, k1, v1, retention="long",
                                    metadata={"test": "kvd_client"}, ttl_seconds=None))
        reply = self.get(main, k1)
        expect_op(reply, "get_shared_response", GET_SHARED)
        if self.slot_size == 0:
            want_slot = round_up(HEADER + size, 64)
            check(reply["slot_size"] == want_slot,
                  f"first value of {size} B should fix slot_size {want_slot}, got {reply['slot_size']}")
            self.slot_size = reply["slot_size"]
        self.expect_shared_get(main, k1, v1, "long")
        self.ok(f"slot_size {self.slot_size}")

        # 3. zero-copy write.
        self.step("set_reserve + write in place + set_commit, then get and compare")
        k2, v2 = self.key(2), self.value(2, size)
        res = main.call({"op": "set_reserve", "size": size})
        expect_op(res, "set_reserve_response",
                  ("lease_token", "slot_id", "payload_offset", "payload_max_size", "reason"))
        check(res["reason"] == "", f"set_reserve failed: {res!r}")
        check(all(is_int(res[f]) for f in ("lease_token", "slot_id", "payload_offset",
                                            "payload_max_size")), f"non-int field: {res!r}")
        check(res["lease_token"] != 0 and res["slot_id"] >= 0, f"bad lease: {res!r}")
        off = res["payload_offset"]
        check(off == res["slot_id"] * self.slot_size + HEADER,
              f"payload_offset {off} != slot_id*slot_size+16 ({res['slot_id']}*{self.slot_size}+16)")
        check(res["payload_max_size"] >= size, f"payload_max_size {res['payload_max_size']} < {size}")
        check(off + size <= len(self.mm), "payload past arena end")
        (hv,) = struct.unpack_from("<I", self.mm, off - HEADER)
        check(hv & 1 == 1, f"leased slot's header version {hv} should be odd")
        self.mm[off:off + size] = v2
        com = main.call({"op": "set_commit", "lease_token": res["lease_token"], "key": k2,
                         "length": size, "model": self.model, "compat_key": self.compat})
        expect_op(com, "set_commit_response", ("accepted", "reason"))
        check(com["accepted"] is True and com["reason"] is None, f"set_commit rejected: {com!r}")
        (hv,) = struct.unpack_from("<I", self.mm, off - HEADER)
        check(hv & 1 == 0, f"committed slot's header version {hv} should be even")
        got = self.expect_shared_get(main, k2, v2, "short")  # retention "default" = short
        check(got["slot_offset"] == off,
              f"committed value served from offset {got['slot_offset']}, leased {off}")
        self.ok(f"slot {res['slot_id']}")

        # 4. reserve + cancel.
        self.step("set_reserve + set_cancel (a commit on the cancelled lease is refused)")
        res = main.call({"op": "set_reserve", "size": size})
        expect_op(res, "set_reserve_response",
                  ("lease_token", "slot_id", "payload_offset", "payload_max_size", "reason"))
        check(res["reason"] == "" and res["lease_token"] != 0, f"set_reserve failed: {res!r}")
        can = main.call({"op": "set_cancel", "lease_token": res["lease_token"]})
        expect_op(can, "set_cancel_response")
        late = main.call({"op": "set_commit", "lease_token": res["lease_token"],
                          "key": self.key(3), "length": size, "model": self.model,
                          "compat_key": self.compat})
        if late.get("op") == "error":
            expect_error(late, late.get("code"))
        else:
            self.expect_set_rejected(late, "set_commit_response")
        self.sync(main)
        self.ok()

        # 5. batch_set + batch_get (shared) + exists.
        self.step("batch_set + batch_get (shared, one miss) + exists (one missing)")
        bkeys = [self.key(10), self.key(11), self.key(12)]
        bvals = [self.value(10, size), self.value(11, size // 2), self.value(12, 1)]
        brets = ["short", "long", "ephemeral"]
        ack = main.call({"op": "batch_set", "keys": bkeys, "values": bvals, "retentions": brets,
                         "metadatas": [{}, {"n": 11}, {}], "model": self.model,
                         "compat_key": self.compat, "ttls_seconds": [None, 3600, None]})
        expect_op(ack, "batch_set_ack", ("accepted", "reasons"))
        check(ack["accepted"] == [True, True, True] and ack["reasons"] == [None, None, None],
              f"batch_set not all accepted: {ack!r}")
        missing = self.key(99)
        rep = main.call({"op": "batch_get", "keys": bkeys + [missing], "model": self.model,
                         "compat_key": self.compat})
        expect_op(rep, "batch_get_shared_response", BATCH_GET_SHARED)
        check(rep["slot_size"] == self.slot_size, f"slot_size {rep['slot_size']} != {self.slot_size}")
        for f in ("offsets", "lengths", "versions", "retentions"):
            check(isinstance(rep[f], list) and len(rep[f]) == 4, f"{f} must be a list of 4: {rep!r}")
        check(rep["offsets"][3] == -1 and rep["lengths"][3] == 0 and rep["versions"][3] == 0
              and rep["retentions"][3] is None, f"missing key not reported as a miss: {rep!r}")
        for i, (k, v, r) in enumerate(zip(bkeys, bvals, brets)):
            check(rep["retentions"][i] == r, f"batch_get retention[{i}] {rep['retentions'][i]!r} != {r!r}")
            check(rep["lengths"][i] == len(v), f"batch_get length[{i}] {rep['lengths'][i]} != {len(v)}")
            check(rep["versions"][i] % 2 == 0 and rep["versions"][i] > 0, f"version[{i}] not even: {rep!r}")
            data = self.read_shared((rep["offsets"][i], rep["lengths"][i], rep["versions"][i],
                                     rep["slot_size"]), k)
            check(data == v, f"batch_get value[{i}] read from the arena differs")
        g = self.get(main, missing)
        expect_op(g, "get_response", GET_RESPONSE)
        check(g["value"] is None and g["retention"] is None, f"get of a missing key: {g!r}")
        ex = main.call({"op": "exists", "keys": [bkeys[0], missing, k1], "model": self.model,
                        "compat_key": self.compat})
        expect_op(ex, "exists_response", ("present",))
        check(ex["present"] == [True, False, True], f"exists: {ex['present']!r}, expected [True, False, True]")
        self.ok()

        # 6. prefetch_hint: fire and forget.
        self.step("prefetch_hint (no reply), then a stats round trip stays in sync")
        main.send({"op": "prefetch_hint", "keys": [k1, missing], "model": self.model,
                   "compat_key": self.compat, "deadline_ms": 500})
        main.send({"op": "prefetch_hint", "keys": [k2]})  # optional fields omitted
        reply = main.call({"op": "stats"})
        check(reply.get("op") == "stats_response",
              f"after prefetch_hint the next frame should be stats_response, got {reply!r}")
        self.ok()

        # 7. stats.
        self.step("stats: every field present, ints")
        st = self.sync(main)
        for f in STATS_FIELDS:
            check(is_int(st[f]) and st[f] >= 0, f"stats.{f} not a non-negative int: {st[f]!r}")
        check(st["entries"] >= 5 and st["sets_total"] >= 4 and st["gets_total"] >= 4
              and st["hits_total"] >= 4 and st["misses_total"] >= 1,
              f"stats counters lower than this run alone accounts for: {st!r}")
        check(st["long_bytes"] >= size, f"long_bytes {st['long_bytes']} < the long value's {size}")
        self.ok(", ".join(f"{f}={st[f]}" for f in STATS_FIELDS))

        # 8. a client that does not prefer the arena.
        self.step("second connection prefers_shared_arena=False: no arena, inline values")
        plain, ack = self.connect("inline", False)
        check(ack["shared_arena"] is None, f"shared_arena should be nil: {ack!r}")
        self.sync(plain)  # no fd byte was sent
        g = self.get(plain, k1)
        expect_op(g, "get_response", GET_RESPONSE)
        check(g["value"] == v1 and g["retention"] == "long", "inline get differs from the value set")
        g = self.get(plain, k2)
        expect_op(g, "get_response", GET_RESPONSE)
        check(g["value"] == v2 and g["retention"] == "short", "inline get of the committed value differs")
        b = plain.call({"op": "batch_get", "keys": bkeys + [missing], "model": self.model,
                        "compat_key": self.compat})
        expect_op(b, "batch_get_response", BATCH_GET_RESPONSE)
        check(b["values"] == bvals + [None], "inline batch_get values differ")
        check(b["retentions"] == brets + [None], f"inline batch_get retentions {b['retentions']!r}")
        g = plain.call({"op": "get", "key": k1})  # model/compat omitted: another namespace
        expect_op(g, "get_response", GET_RESPONSE)
        check(g["value"] is None, "get without model found this run's entry (model ignored?)")
        plain.close()
        self.ok()

        # 9. retention downgrade.
        self.step("retention downgrade: long key set again as short -> accepted=false")
        self.expect_set_rejected(self.set(main, k1, self.value(5, size), retention="short"))
        self.expect_shared_get(main, k1, v1, "long")
        self.ok()

        # 10. ttl 0.
        self.step("set with ttl_seconds 0 -> accepted=false, not stored")
        k4 = self.key(4)
        self.expect_set_rejected(self.set(main, k4, self.value(4, 64), ttl_seconds=0))
        g = self.get(main, k4)
        expect_op(g, "get_response", GET_RESPONSE)
        check(g["value"] is None and g["retention"] is None, f"ttl 0 value was stored: {g!r}")
        self.ok()

        # 11. error replies on a well-formed frame; the connection stays usable.
        self.step("unknown op -> error unknown_op")
        expect_error(main.call({"op": "frobnicate", "key": k1}), "unknown_op")
        self.sync(main)
        self.ok()

        self.step("set retention \"forever\" -> error bad_retention")
        expect_error(self.set(main, self.key(6), b"x" * 64, retention="forever"), "bad_retention")
        self.sync(main)
        self.ok()

        self.step("get with key as str -> error bad_field naming the field")
        e = expect_error(main.call({"op": "get", "key": "not-bytes", "model": self.model}),
                         "bad_field")
        check("key" in e["message"], f"bad_field message does not name 'key': {e['message']!r}")
        self.sync(main)
        self.ok()

        self.step(f"set of MAX_VALUE_BYTES+1 = {self.max_value + 1} B -> error value_too_large")
        expect_error(self.set(main, self.key(7), b"\xab" * (self.max_value + 1)),
                     "value_too_large")
        self.sync(main)
        self.ok()

        self.step("hello with protocol_version 2 -> error protocol_version")
        c = Conn(self.path, "version")
        expect_error(c.call({"op": "hello", "client_id": "kvd-client-v2",
                             "protocol_version": 2}), "protocol_version")
        c.close()
        self.ok()

        # 12. malformed frames, each on its own connection.
        for label, body in (
            ("garbage bytes", b"\xc1\xc1not msgpack at all"),
            ("truncated map", msgpack.packb({"op": "stats", "x": 1}, use_bin_type=True)[:-3]),
            ("not a map", msgpack.packb(["op", "stats"], use_bin_type=True)),
            ("map without op", msgpack.packb({"key": k1}, use_bin_type=True)),
        ):
            self.step(f"malformed frame ({label}) -> error malformed_frame or a clean close")
            c, _ = self.connect("malformed", False)
            c.send_body(body)
            outcome = "closed"
            try:
                expect_error(c.recv("the reply to a malformed frame"), "malformed_frame")
                outcome = "error"
                self.sync(c)
                outcome = "error, connection still usable"
            except Closed:
                pass
            c.close()
            c, _ = self.connect("after-malformed", False)
            self.sync(c)
            c.close()
            self.ok(f"{outcome}; a new connection is accepted")

        # 13. clear this run's model.
        self.step("clear model -> cleared_entries, then get -> miss")
        cl = main.call({"op": "clear", "model": self.model, "compat_key": self.compat})
        expect_op(cl, "clear_ack", ("cleared_entries",))
        check(is_int(cl["cleared_entries"]) and cl["cleared_entries"] >= 5,
              f"cleared_entries {cl['cleared_entries']!r}, expected >= 5 (this run stored 5)")
        for k in (k1, k2, bkeys[1]):
            g = self.get(main, k)
            expect_op(g, "get_response", GET_RESPONSE)
            check(g["value"] is None and g["retention"] is None, f"entry survived clear: {g!r}")
        ex = main.call({"op": "exists", "keys": [k1, bkeys[0]], "model": self.model})
        expect_op(ex, "exists_response", ("present",))
        check(ex["present"] == [False, False], f"exists after clear: {ex['present']!r}")
        self.ok(f"cleared {cl['cleared_entries']}")

        self.step("main connection still in sync at the end")
        self.sync(main)
        main.close()
        if self.inline is not None:
            self.inline.close()
        self.mm.close()
        self.ok()


def main():
    if len(sys.argv) not in (2, 3):
        print("usage: kvd_client.py SOCKET_PATH [MAX_VALUE_BYTES]", file=sys.stderr)
        sys.exit(2)
    path = sys.argv[1]
    try:
        max_value = int(sys.argv[2]) if len(sys.argv) == 3 else 1048576
    except ValueError:
        print(f"MAX_VALUE_BYTES must be an int, got {sys.argv[2]!r}", file=sys.stderr)
        sys.exit(2)
    client = Client(path, max_value)
    client.current = "connect"
    try:
        client.run_all()
    except CannotConnect as e:
        if client.step_no <= 1:  # the daemon is not there at all
            print(f"FAIL: {e}", file=sys.stderr)
            sys.exit(2)
        print(f"FAIL: {client.current}: {e}", file=sys.stderr)
        sys.exit(1)
    except (Failure, Closed) as e:
        print(f"FAIL: {client.current}: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        print(f"FAIL: {client.current}: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print("ALL OK")


if __name__ == "__main__":
    main()
