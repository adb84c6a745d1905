"""The ``knobtune`` command. Exit 0 ok, 1 the run failed, 2 bad input or usage."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import warnings

from knobtune import __version__
from knobtune.search.cli import compare, dashboard, diagnose, env, export, report, run, worker
from knobtune.search.errors import RunError, UserError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="knobtune",
        description="Find the fastest safe way to train a model on this machine: Optuna studies over "
                    "the training system's knobs, each trial a real, isolated training burst.",
    )
    p.add_argument("--version", action="version", version=f"knobtune {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for module in (run, worker, export, dashboard, env, compare, diagnose, report):
        module.add(sub)
    return p


def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # knobtune's loop is ask/tell and records heartbeats itself (search/storage/workers.py)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    logging.getLogger("sqlalchemy").setLevel(logging.ERROR)


def _interrupt_on_termination() -> None:
    """SIGTERM and SIGHUP clean up like Ctrl-C: the running trial's process group is killed and
    finished trials are kept (trial children run in their own session, so they would not get them)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help(sys.stderr)
        return 2
    _quiet_optuna()
    _interrupt_on_termination()
    try:
        return args.func(args)
    except UserError as exc:
        sys.stderr.write(f"knobtune: error: {exc}\n")
        return 2
    except RunError as exc:
        sys.stderr.write(f"knobtune: run failed: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("knobtune: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
