"""knobtune diagnose STUDY.toml"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import optuna

from knobtune.search.errors import UserError
from knobtune.search.launch import partition
from knobtune.search.launch.partition import Partition
from knobtune.search.launch.probe import probe_study
from knobtune.search.storage.database import open_storage, resolve_url
from knobtune.search.storage.record import StudyRecord, TrialRecord
from knobtune.search.story import results
from knobtune.search.story.export import load_existing, study_names
from knobtune.search.story.summary import diagnosis_line
from knobtune.search.study import definition
from knobtune.search.study.diagnose import diagnose_study, undiagnosable
from knobtune.search.study.study import make_plan


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


def share_of(study: optuna.Study | None) -> Partition | None:
    """The share of this machine the study's trials ran on (``--jobs``), for a diagnosis that
    compares with them; None for the whole machine."""
    kept = StudyRecord.of(study) if study is not None else StudyRecord()
    jobs = (kept.partition or {}).get("jobs", 1)
    if jobs <= 1:
        return None
    gpus = partition.visible_gpus(len(kept.fingerprint.get("gpus") or []))
    cores = partition.machine_cores()
    return partition.plan(jobs, cores, gpus, partition.physical_groups(cores))[0]


def main(args: argparse.Namespace) -> int:
    parsed = definition.load(args.study_file)
    cfg = parsed.study
    storage = open_storage(resolve_url(args.storage, cfg.storage))
    name = args.name or cfg.name
    study = load_existing(storage, name) if name in study_names(storage) else None
    placement = share_of(study)
    if placement is not None:
        sys.stderr.write(f"knobtune: the study's trials ran with --jobs {StudyRecord.of(study).partition['jobs']}: "
                         f"diagnosing on one such share ({len(placement.cores)} core(s)"
                         f"{', GPU ' + placement.gpu if placement.gpu else ''})\n")
    plan = replace(make_plan(parsed, probe_study(parsed, sys.stderr, placement)), placement=placement)
    skip = undiagnosable(plan)
    if skip:
        raise UserError(skip)
    winner = results.best(study) if study is not None else None
    baseline = plan.space.baseline_params(plan.offer, plan.ctx, parsed.baseline)
    record = diagnose_study(study, plan, baseline, winner, sys.stderr)
    base_trial = results.baseline(study) if study is not None else None
    sys.stdout.write(diagnosis_line("baseline", record["baseline"],
                          TrialRecord.of(base_trial).samples_per_second if base_trial else None) + "\n")
    if winner is not None:
        sys.stdout.write(diagnosis_line(f"winner (trial #{winner.number})", record["winner"],
                              TrialRecord.of(winner).samples_per_second) + "\n")
    else:
        sys.stdout.write(f"  (no study {name!r} with a winner in this storage: only the baseline was diagnosed)\n")
    return 0
