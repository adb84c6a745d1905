"""knobtune worker STUDY.toml --storage postgresql://..."""
from __future__ import annotations

import argparse

from search import study
from search.commands.run import _positive_float, _positive_int, checked, search_args
from search.errors import UserError
from search.workers import Sharing


def add(subparsers: argparse._SubParsersAction) -> None:
    defaults = Sharing()
    p = subparsers.add_parser(
        "worker", help="join a study on a database server from this machine (several machines search together)",
        description="Join the study (creating it if no worker has yet) on a database server that every machine "
                    "reaches, and run its trials beside the other workers until the study has --trials finished "
                    "ones; then one worker confirms and diagnoses the winner. Each machine must match the study's "
                    "hardware fingerprint. See docs/workers.md.",
    )
    search_args(p)
    p.add_argument("--storage", metavar="URL",
                   help="the database server's URL, e.g. postgresql://user:password@host/db (default: "
                        "$KNOBTUNE_STORAGE, else [study] storage)")
    p.add_argument("--heartbeat", type=_positive_int, metavar="SECONDS", default=defaults.heartbeat_s,
                   help=f"record that this worker's trials are alive this often (default: {defaults.heartbeat_s})")
    p.add_argument("--grace", type=_positive_int, metavar="SECONDS", default=defaults.grace_s,
                   help="fail and re-queue another worker's trial once its heartbeat is this old "
                        f"(default: {defaults.grace_s})")
    p.add_argument("--db-retry", type=_positive_float, metavar="SECONDS", default=defaults.db_retry_s,
                   help=f"wait this long for a database that went away before stopping (default: {defaults.db_retry_s:g})")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.grace <= args.heartbeat:
        raise UserError(f"--grace must be longer than --heartbeat (a live worker's trial would be taken for dead), "
                        f"got --grace {args.grace} and --heartbeat {args.heartbeat}")
    sharing = Sharing(heartbeat_s=args.heartbeat, grace_s=args.grace, db_retry_s=args.db_retry)
    return study.run(checked(args), storage_url=args.storage, trials=args.trials, timeout=args.timeout,
                     name=args.name, confirm_winners=not args.no_confirm, diagnose=not args.no_diagnose,
                     artifacts_option=args.artifacts, jobs=args.jobs, sharing=sharing, worker_command=True)
