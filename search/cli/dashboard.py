"""knobtune dashboard"""
from __future__ import annotations

import argparse

from knobtune.search.storage.database import resolve_url
from knobtune.search.story.dashboard import serve


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("dashboard", help="open optuna-dashboard on a storage",
                              description="Serve optuna-dashboard for the studies in a storage.")
    p.add_argument("--storage", metavar="URL", help="Optuna storage URL (default: sqlite:///knobtune.db)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    p.add_argument("--artifacts", metavar="DIR",
                   help="the trials' artifact directory (default: beside the SQLite file, e.g. knobtune-artifacts/)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    return serve(resolve_url(args.storage), host=args.host, port=args.port, artifacts_option=args.artifacts)
