"""knobtune run STUDY.toml"""
from __future__ import annotations

import argparse
from dataclasses import replace

from knobtune.search.errors import UserError
from knobtune.search.study import definition, study


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {value}")
    return value


def search_args(p: argparse.ArgumentParser, file_help: str = "the study definition (see studies/)",
                optional_file: bool = False) -> None:
    """The arguments ``run`` and ``worker`` share."""
    p.add_argument("study_file", metavar="STUDY.toml", help=file_help, nargs="?" if optional_file else None)
    p.add_argument("--trials", type=_positive_int, help="total finished trials wanted (default: [study] trials)")
    p.add_argument("--timeout", type=_positive_float, metavar="SECONDS",
                   help="start no new trial after this many seconds")
    p.add_argument("--name", help="study name (default: [study] name)")
    p.add_argument("--no-confirm", action="store_true",
                   help="skip re-measuring the top candidates against the baseline after the trials")
    p.add_argument("--no-diagnose", action="store_true", help="skip the bottleneck diagnosis after the trials")
    p.add_argument("--artifacts", metavar="DIR",
                   help="where each trial's output, request and window chart go, for the dashboard (default: "
                        "beside the SQLite file, e.g. knobtune-artifacts/; none for a server database; "
                        "'none' turns them off)")
    p.add_argument("--jobs", metavar="N|auto",
                   help="trials at once, each pinned to its own share of the machine: one GPU each (auto: one "
                        "per GPU) and an equal share of the CPU cores; the winner is exported for that share "
                        "(default: 1, the whole machine)")
    p.add_argument("--warm-start", metavar="STUDY", action="append",
                   help="queue the confirmed winner and top trials of this earlier study of the same framework in "
                        "the same storage first, clipped to this space (repeat it or separate names with commas; "
                        "replaces [study] warm_start)")


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run", help="create or resume a study and run its trials",
        description="Create the study (or resume it) and run trials until it has --trials finished ones. "
                    "On a server database (postgresql://...) this process is one worker of the study, "
                    "as with knobtune worker.",
    )
    search_args(p)
    p.add_argument("--storage", metavar="URL", help="Optuna storage URL (default: $KNOBTUNE_STORAGE, else [study] "
                                                    "storage, else sqlite:///knobtune.db)")
    p.set_defaults(func=main)


def checked(args: argparse.Namespace) -> definition.Definition:
    """The study file, parsed; the arguments checked."""
    parsed = definition.load(args.study_file)
    if args.name is not None and not args.name.strip():
        raise UserError("--name must not be empty")
    return warm_started(parsed, args)


def warm_started(parsed: definition.Definition, args: argparse.Namespace) -> definition.Definition:
    """The definition with --warm-start's studies in place of [study] warm_start, when given."""
    if args.warm_start is None:
        return parsed
    names = [n for given in args.warm_start for n in given.split(",") if n.strip()]  # ('' : none)
    return replace(parsed, study=replace(parsed.study, warm_start=definition.warm_start_names(names, "--warm-start")))


def main(args: argparse.Namespace) -> int:
    return study.run(checked(args), storage_url=args.storage, trials=args.trials, timeout=args.timeout,
                     name=args.name, confirm_winners=not args.no_confirm, diagnose=not args.no_diagnose,
                     artifacts_option=args.artifacts, jobs=args.jobs)
