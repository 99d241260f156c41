#!/usr/bin/env python3
"""Parses engine command lines with the engines' own argument parsers.

    python check.py vllm|sglang|atom [--fixture atom-0.1.4.json] < cases.json

cases.json: [{"name": ..., "argv": [...]}, ...], argv being what follows `vllm serve`,
`python3 -m sglang.launch_server` or `python3 -m atom.entrypoints.openai_server`.
Prints one JSON object per case: name, ok, error (the parser's message), and what the
parser made of the settings Infera relies on.

vLLM and SGLang are the installed wheels (`pip install --no-deps` at the pinned version,
with their light dependencies real); the heavy modules their parsers import but never
call are stubbed (STUBS, see stubs.py). ATOM is not on PyPI: its parser is rebuilt from
the fixture atom_fixture.py generated from its source at the pinned tag.
"""

import argparse
import contextlib
import io
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stubs  # noqa: E402

# Modules the parsers import but never call, by engine.
STUBS = {
    "vllm": ["torch", "torchvision", "torchaudio", "xgrammar", "llguidance", "triton"],
    "sglang": ["torch", "torchvision", "triton"],
}


class ParseError(Exception):
    pass


def _raise(self, message):
    raise ParseError(f"{self.prog}: error: {message}")


def vllm_parser():
    """`vllm serve`'s parser: vLLM's FlexibleArgumentParser with the serve subparser
    make_arg_parser fills, then the checks `vllm serve` runs before starting."""
    stubs.install(STUBS["vllm"])
    import vllm.platforms
    from vllm.platforms.rocm import RocmPlatform

    # What vLLM detects on an MI355X node (through amdsmi, which is not here).
    vllm.platforms._current_platform = RocmPlatform()
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers(dest="subparser")
    make_arg_parser(sub.add_parser("serve", prog="vllm serve"))

    def parse(argv):
        ns = top.parse_args(["serve", *argv])
        validate_parsed_serve_args(ns)
        events = ns.kv_events_config
        transfer = ns.kv_transfer_config
        return {
            "kv_events_enabled": bool(events and events.enable_kv_cache_events),
            "kv_events_endpoint": events.endpoint if events else None,
            "kv_connector": transfer.kv_connector if transfer else None,
            "kv_role": transfer.kv_role if transfer else None,
            "served_model_name": ns.served_model_name,
            "port": ns.port,
        }

    return parse


def sglang_parser():
    """`python -m sglang.launch_server`'s parser: ServerArgs.add_cli_args (from_cli_args
    is not run: it probes GPUs and the model); the KV-event config as SGLang reads it."""
    stubs.install(STUBS["sglang"])
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)

    def parse(argv):
        ns = parser.parse_args(argv)
        endpoint = None
        if ns.kv_events_config:
            from sglang.srt.disaggregation.kv_events import KVEventsConfig

            endpoint = KVEventsConfig.from_cli(ns.kv_events_config).endpoint
        return {
            "kv_events_endpoint": endpoint,
            "disaggregation_mode": ns.disaggregation_mode,
            "served_model_name": ns.served_model_name,
            "port": ns.port,
        }

    return parse


def atom_parser(fixture):
    """ATOM's server parser, rebuilt from the fixture of its add_argument calls."""
    spec = json.load(open(fixture))
    types = {"int": int, "float": float, "str": str, "json.loads": json.loads}
    actions = {"argparse.BooleanOptionalAction": argparse.BooleanOptionalAction}
    parser = argparse.ArgumentParser(prog="atom.entrypoints.openai_server")
    for a in spec["arguments"]:
        kwargs = {}
        for key in ("choices", "nargs", "const"):
            if key in a:
                kwargs[key] = a[key]
        if "type" in a:
            kwargs["type"] = types[a["type"]]
        if "action" in a:
            kwargs["action"] = actions.get(a["action"], a["action"])
        parser.add_argument(*a["flags"], **kwargs)

    def parse(argv):
        ns = parser.parse_args(argv)
        return {
            "model": ns.model,
            "server_port": ns.server_port,
            "kv_transfer_config": json.loads(ns.kv_transfer_config or "{}"),
        }

    return parse


def main():
    engine = sys.argv[1]
    argparse.ArgumentParser.error = _raise
    # The engines log to stdout while importing: stdout carries the results alone.
    with contextlib.redirect_stdout(sys.stderr):
        if engine == "atom":
            parse = atom_parser(sys.argv[sys.argv.index("--fixture") + 1])
        else:
            parse = {"vllm": vllm_parser, "sglang": sglang_parser}[engine]()
    for case in json.load(sys.stdin):
        out = {"name": case["name"], "ok": True, "error": None}
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                out["parsed"] = parse(case["argv"])
        except (ParseError, SystemExit, ValueError, TypeError) as e:
            out.update(ok=False, error=f"{type(e).__name__}: {e}"[:600])
        print(json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
