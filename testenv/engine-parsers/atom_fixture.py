#!/usr/bin/env python3
"""Writes the ATOM argument-parser fixture from ATOM's own source.

ATOM is not on PyPI, so the test suite cannot import its parser: this reads the
`add_argument` calls of the parser ATOM's OpenAI server builds (`EngineArgs.add_cli_args`
in atom/model_engine/arg_utils.py, then the server's own flags in
atom/entrypoints/openai/api_server.py) with Python's `ast`, keeps what argparse needs to
accept or refuse a command line (option strings, action, type, choices, nargs), and
writes them as JSON with the tag and commit they came from. `check.py` rebuilds the
parser from it.

Usage: atom_fixture.py ATOM_CHECKOUT TAG > atom-<version>.json
"""

import ast
import json
import subprocess
import sys

FILES = [
    ("atom/model_engine/arg_utils.py", "add_cli_args"),
    ("atom/entrypoints/openai/api_server.py", "main"),
]


def literal(node):
    """A keyword's value as JSON-able data, or the name of a callable (type=int)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{ast.unparse(node.value)}.{node.attr}"
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def arguments(source, function):
    tree = ast.parse(source)
    fn = next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function
    )
    out = []
    for call in ast.walk(fn):
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "add_argument"
        ):
            continue
        flags = [ast.literal_eval(a) for a in call.args]
        spec = {"flags": flags}
        for kw in call.keywords:
            if kw.arg in ("action", "type", "choices", "nargs", "const"):
                spec[kw.arg] = literal(kw.value)
        out.append(spec)
    return out


def main():
    checkout, tag = sys.argv[1], sys.argv[2]
    commit = subprocess.check_output(
        ["git", "-C", checkout, "rev-parse", f"{tag}^{{commit}}"], text=True
    ).strip()
    args = []
    for path, function in FILES:
        source = subprocess.check_output(
            ["git", "-C", checkout, "show", f"{tag}:{path}"], text=True
        )
        args.extend(arguments(source, function))
    json.dump(
        {
            "engine": "atom",
            "source": "https://github.com/ROCm/ATOM",
            "tag": tag,
            "commit": commit,
            "files": [path for path, _ in FILES],
            "arguments": args,
        },
        sys.stdout,
        indent=1,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
