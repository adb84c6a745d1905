"""knobtune diagnose STUDY.toml"""
from __future__ import annotations

import argparse
import sys

from search import definition, results
from search.diagnose import diagnose_study, line
from search.export import load_existing, study_names
from search.probe import probe_study
from search.storage import open_storage, resolve_url
from search.study import make_plan


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "diagnose", help="is the job input-bound or compute-bound?",
        description="Measure the input ceiling (the data pipeline alone) and the compute ceiling (the train "
                    "step on a resident batch) for the baseline, and for the study's winner when the study "
                    "exists in the storage.",
    )
    p.add_argument("study_file", metavar="STUDY.toml")
    p.add_argument("--storage", metavar="URL", help="where to look for the study's winner (default: as for run)")
    p.add_argument("--name", help="study name (default: [study] name)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    parsed = definition.load(args.study_file)
    cfg = parsed.study
    plan = make_plan(parsed, probe_study(parsed, sys.stderr))
    storage = open_storage(resolve_url(args.storage, cfg.storage))
    name = args.name or cfg.name
    study = load_existing(storage, name) if name in study_names(storage) else None
    winner = results.best(study) if study is not None else None
    baseline = plan.space.baseline_params(plan.offer, plan.ctx, parsed.baseline)
    record = diagnose_study(study, plan, baseline, winner, sys.stderr)
    base_trial = results.baseline(study) if study is not None else None
    sys.stdout.write(line("baseline", record["baseline"],
                          base_trial.user_attrs.get("samples_per_second") if base_trial else None) + "\n")
    if winner is not None:
        sys.stdout.write(line(f"winner (trial #{winner.number})", record["winner"],
                              winner.user_attrs.get("samples_per_second")) + "\n")
    else:
        sys.stdout.write(f"  (no study {name!r} with a winner in this storage: only the baseline was diagnosed)\n")
    return 0
