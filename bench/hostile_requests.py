#!/usr/bin/env python3
"""Peak gateway memory per hostile request body (README, "Hostile requests").

Starts one infera-sim worker and, for each body, a fresh infera-gateway (static
discovery) in front of it; sends the body once and prints the answer and the gateway's
peak RSS above idle (VmHWM after minus VmRSS before, /proc/<pid>/status).

    cargo build -p infera-gateway -p infera-sim
    bench/hostile_requests.py [--bin target/debug] [--policy round-robin|kv-aware]
"""

import argparse
import json
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) // 1024
    raise RuntimeError(f"no {key} for {pid}")


def post(port: int, path: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read(160).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(160).decode(errors="replace")


def bodies() -> list[tuple[str, str, bytes]]:
    n = 400_000
    chat = '{"model":"m","max_tokens":2,"messages":[{"role":"user","content":%s}]}'
    user = {"role": "user", "content": "x"}
    return [
        ("400,000 nested arrays", "/v1/chat/completions", (chat % ("[" * n + "]" * n)).encode()),
        ("400,000 sibling arrays", "/v1/chat/completions", (chat % ("[" + ",".join(["[[]]"] * n) + "]")).encode()),
        ("100,000 messages", "/v1/chat/completions", json.dumps({"model": "m", "max_tokens": 2, "messages": [user] * 100_000}).encode()),
        ("1,000,000 token ids", "/v1/completions", json.dumps({"model": "m", "max_tokens": 2, "prompt": [1] * 1_000_000}).encode()),
        ("262,000 token ids", "/v1/completions", json.dumps({"model": "m", "max_tokens": 2, "prompt": [1] * 262_000}).encode()),
        ("65,000 text parts", "/v1/chat/completions", (chat % json.dumps([{"type": "text", "text": "a"}] * 65_000)).encode()),
        ("8 MB of text", "/v1/chat/completions", (chat % json.dumps("ab " * 2_700_000)).encode()),
        ("max_tokens 2^64-1", "/v1/chat/completions", b'{"model":"m","max_tokens":18446744073709551615,"messages":[{"role":"user","content":"x"}]}'),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/debug", help="folder holding infera-gateway and infera-sim")
    ap.add_argument("--policy", default="round-robin", choices=["round-robin", "kv-aware"])
    args = ap.parse_args()
    sim_port, gw_port = free_port(), free_port()
    sim = subprocess.Popen(
        [f"{args.bin}/infera-sim", "--listen", f"127.0.0.1:{sim_port}", "--served-model-name", "m", "--speedup", "1000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    with tempfile.TemporaryDirectory() as tmp:
        workers = Path(tmp) / "workers.yaml"
        workers.write_text(
            f'workers:\n  - {{worker_id: "127.0.0.1:{sim_port}", url: "http://127.0.0.1:{sim_port}", model_name: m, engine: vllm}}\n'
        )
        try:
            for name, path, body in bodies():
                gw = subprocess.Popen(
                    [f"{args.bin}/infera-gateway", "--discovery-backend", "static", "--static-workers", str(workers),
                     "--port", str(gw_port), "--router-policy", args.policy],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
                try:
                    probe = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
                    for _ in range(300):
                        try:
                            if post(gw_port, "/v1/chat/completions", probe)[0] == 200:
                                break
                        except OSError:
                            pass
                        time.sleep(0.1)
                    else:
                        raise SystemExit("the gateway did not serve within 30 s")
                    idle = rss_mb(gw.pid, "VmRSS")
                    status, answer = post(gw_port, path, body)
                    peak = rss_mb(gw.pid, "VmHWM") - idle
                    held = rss_mb(gw.pid, "VmRSS") - idle
                    print(f"{name} ({len(body) / 1e6:.1f} MB): {status}, peak +{peak} MB, held +{held} MB: {answer[:100]}")
                finally:
                    gw.kill()
                    gw.wait()
        finally:
            sim.kill()


if __name__ == "__main__":
    main()
