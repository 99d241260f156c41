#!/usr/bin/env python3
"""Writes crd.yaml: the earlier Go operator's InferaDeployment CRD, descriptions removed
(the schema is what `infera convert`'s coverage test walks; the prose stays upstream).

Usage: make_crd_fixture.py CHECKOUT   (github.com/AMD-AGI/Infera at COMMIT, never committed here)
"""
import pathlib
import sys

import yaml

COMMIT = "5890f7f"
SOURCE = "deploy/operator/config/crd/bases/infera.amd.com_inferadeployments.yaml"


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main():
    checkout = pathlib.Path(sys.argv[1])
    crd = yaml.safe_load((checkout / SOURCE).read_text())
    out = pathlib.Path(__file__).with_name("crd.yaml")
    header = (
        f"# github.com/AMD-AGI/Infera@{COMMIT}:{SOURCE}\n"
        "# (last changed in 89c86fb), descriptions removed by make_crd_fixture.py.\n"
    )
    out.write_text(header + yaml.safe_dump(strip(crd), sort_keys=True))


if __name__ == "__main__":
    main()
