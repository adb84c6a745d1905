"""knobtune compare STUDY_A STUDY_B"""
from __future__ import annotations

import argparse
import sys
import textwrap

from knobtune.search.storage.database import open_storage, resolve_url
from knobtune.search.story.compare import compare
from knobtune.search.story.export import load_existing


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare", help="compare two studies of one workload (e.g. PyTorch vs TensorFlow)",
        description="Baseline and best of two studies side by side, with a plain-language verdict. "
                    "Refuses studies of different workloads or machines unless --force.",
    )
    p.add_argument("study_a", metavar="STUDY_A", help="study name")
    p.add_argument("study_b", metavar="STUDY_B", help="study name")
    p.add_argument("--storage", metavar="URL", help="Optuna storage URL (default: sqlite:///knobtune.db)")
    p.add_argument("--force", action="store_true", help="compare even across workloads or machines")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    storage = open_storage(resolve_url(args.storage))
    text = compare(load_existing(storage, args.study_a), load_existing(storage, args.study_b), force=args.force)
    table, _, paragraph = text.rpartition("\n\n")
    sys.stdout.write(table + "\n\n" + textwrap.fill(paragraph, width=100) + "\n")
    return 0
