"""``knobtune env``: the hardware and software fingerprint, for bug reports."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from knobtune.search.launch.probe import framework_installed, probe
from knobtune.spaces import FRAMEWORKS
from knobtune.trainers.common import hostinfo


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("env", help="print the hardware and software fingerprint",
                              description="Print CPU, memory, GPUs, CUDA/cuDNN and package versions.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a list")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    report = collect()
    sys.stdout.write((json.dumps(report, indent=2) if args.json else render(report)) + "\n")
    return 0


def collect() -> dict[str, Any]:
    """Host facts, then each installed framework's report from its own child process."""
    report: dict[str, Any] = {"host": hostinfo.host(), "frameworks": {}}
    for framework in FRAMEWORKS:
        if not framework_installed(framework):
            report["frameworks"][framework] = "not installed"
            continue
        fingerprint = probe(framework)["fingerprint"]
        report["frameworks"][framework] = {k: v for k, v in fingerprint.items() if k not in report["host"]}
    return report


def _value(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return "-" if value is None else str(value)


def render(report: dict[str, Any]) -> str:
    lines = ["Copy-and-paste this into a bug report:", ""]
    for key, value in report["host"].items():
        lines.append(f"- {key}: {_value(value)}")
    for framework, info in report["frameworks"].items():
        if isinstance(info, str):
            lines.append(f"- {framework}: {info}")
            continue
        for key, value in info.items():
            if key in ("framework", "hardware"):
                continue
            lines.append(f"- {framework} {key}: {_value(value)}")
    return "\n".join(lines)
