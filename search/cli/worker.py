"""knobtune worker STUDY.toml --storage postgresql://..."""
from __future__ import annotations

import argparse

from knobtune.search.cli.run import _positive_float, _positive_int, checked, search_args, warm_started
from knobtune.search.errors import UserError
from knobtune.search.storage.database import open_storage, redact, resolve_url
from knobtune.search.storage.record import StudyRecord
from knobtune.search.storage.workers import Sharing
from knobtune.search.story.export import load_existing, study_names
from knobtune.search.study import definition, study


def add(subparsers: argparse._SubParsersAction) -> None:
    defaults = Sharing()
    p = subparsers.add_parser(
        "worker", help="join a study on a database server from this machine (several machines search together)",
        description="Join the study (creating it if no worker has yet) on a database server that every machine "
                    "reaches, and run its trials beside the other workers until the study has --trials finished "
                    "ones; then one worker confirms and diagnoses the winner. Each machine must match the study's "
                    "hardware fingerprint. See docs/workers.md.",
    )
    search_args(p, file_help="the study definition; without it, --name joins a study that exists on the storage, "
                             "with the definition stored there", optional_file=True)
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
    parsed = checked(args) if args.study_file else warm_started(stored(args), args)
    return study.run(parsed, storage_url=args.storage, trials=args.trials, timeout=args.timeout,
                     name=args.name, confirm_winners=not args.no_confirm, diagnose=not args.no_diagnose,
                     artifacts_option=args.artifacts, jobs=args.jobs, sharing=sharing, worker_command=True)


def stored(args: argparse.Namespace) -> definition.Definition:
    """The definition of the existing study ``--name``, as its first worker stored it."""
    if not args.name:
        raise UserError("knobtune worker needs STUDY.toml, or --name NAME of a study that exists on the storage")
    url = resolve_url(args.storage)
    study.refuse_sqlite_worker(url)
    storage = open_storage(url)
    names = study_names(storage)
    if args.name not in names:
        raise UserError(f"study {args.name!r} does not exist on {redact(url)} and no study file was given to create "
                        f"it: pass STUDY.toml (studies there: {', '.join(names) or 'none'})")
    found = load_existing(storage, args.name)
    stored = StudyRecord.of(found).definition
    if not stored:
        raise UserError(f"study {args.name!r} on {redact(url)} was not made by knobtune; pick another --name")
    return definition.from_dict(stored)
