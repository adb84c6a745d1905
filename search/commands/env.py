"""knobtune env"""
from __future__ import annotations

import argparse
import json
import sys

from knobtune.search.envreport import collect, render


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("env", help="print the hardware and software fingerprint",
                              description="Print CPU, memory, GPUs, CUDA/cuDNN and package versions.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a list")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    report = collect()
    sys.stdout.write((json.dumps(report, indent=2) if args.json else render(report)) + "\n")
    return 0
