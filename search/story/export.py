"""``knobtune export``: a study's winner in the versioned ``knobtune.best/1`` format."""
from __future__ import annotations

import statistics
from datetime import datetime, timezone
from typing import Any

import optuna

from knobtune.search.errors import UserError
from knobtune.search.storage.record import StudyRecord, TrialRecord
from knobtune.search.story import results

FORMAT = "knobtune.best/1"


def study_names(storage: Any) -> list[str]:
    return sorted(s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False))


def load_existing(storage: Any, name: str) -> optuna.Study:
    """The study called ``name``, or a UserError that lists the studies this storage has."""
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = study_names(storage)
        listing = f"it has: {', '.join(names)}" if names else "it has no studies"
        raise UserError(f"no study named {name!r} in this storage ({listing})") from None


def best_config(study: optuna.Study, pick: str | None = None) -> dict[str, Any]:
    """The export document for the study's winner: the confirmed one when there is a current
    confirmation, else the best feasible trial (pareto studies: ``pick`` from the front)."""
    if pick is not None and results.mode(study) != "pareto":
        raise UserError(f"--pick chooses from a pareto front; study {study.study_name!r} has objective "
                        f"{results.mode(study)!r}")
    best = results.best(study, pick)
    if best is None:
        counts = results.outcome_counts(study)
        detail = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no finished trials"
        raise UserError(f"study {study.study_name!r} has no feasible trial to export ({detail})")
    base = results.baseline(study)
    kept = StudyRecord.of(study)
    section = kept.section("study")
    w = TrialRecord.of(best)
    b = TrialRecord.of(base) if base else TrialRecord()
    sps, base_sps = w.samples_per_second, b.samples_per_second
    confirmed = results.confirmation(study)
    headline = results.speedup(study, best)
    confirmed_block = None
    if confirmed and confirmed.get("winner") == best.number:
        confirmed_block = {
            "median": confirmed["medians"][str(best.number)],
            "baseline_median": confirmed["medians"][str(confirmed["baseline"])],
            "speedup": confirmed.get("speedup"), "speedup_range": confirmed.get("speedup_range"),
            "rounds": confirmed["repeats"], "baseline_won": best.number == confirmed["baseline"],
            "mean_accuracy": (confirmed.get("mean_accuracies") or {}).get(str(best.number)),
            "accuracy_floor": confirmed.get("accuracy_floor"),
            "unit": "seconds to target" if confirmed.get("minimize") else "samples/s",
            **_round_rates(confirmed, best.number),
        }
    return {
        "format": FORMAT,
        "study": study.study_name,
        "framework": section.get("framework"),
        "workload": section.get("workload") or None,
        "script": section.get("script"),
        "args": section.get("args") or [],
        "trial": best.number,
        # the trainer library the script trains with ("transformers.Trainer"), when not its own loop
        "integration": (w.applied or {}).get("integration"),
        "knobs": w.knob_values,
        "not_applied": {name: entry.why or "" for name, entry in w.knobs.items() if not entry.applied},
        # the speedup to quote: the confirmation's median of paired per-round ratios when it crowned
        # this trial, else the search trial over the search baseline (metrics.speedup)
        "speedup": {"value": headline.value, "figure": headline.label,
                    "range": list(headline.range) if headline.range else None} if headline else None,
        "metrics": {  # the search trial's own measurements
            "samples_per_second": sps,
            "samples_per_second_cv": w.samples_per_second_cv,
            "baseline_samples_per_second": base_sps,
            "speedup": sps / base_sps if sps and base_sps else None,
            "val_accuracy": w.val_accuracy,
            "baseline_val_accuracy": b.val_accuracy,
            "baseline_accuracies": b.baseline_accuracies,
            "accuracy_floor": (confirmed or {}).get("accuracy_floor") or w.accuracy_floor,
            "effective_batch_size": w.effective_batch_size,
            "warmup_seconds": w.warmup_seconds,
            "peak_memory_mb": w.peak_memory_mb,
            "memory_limit_mb": w.memory_limit_mb,
            "memory_fraction": w.memory_fraction,
            "effective_samples_per_second": w.effective_samples_per_second,
            "time_to_accuracy": w.time_to_accuracy,
        },
        # production must run the winner's batch size with the learning rate it was measured with
        "lr_scaling": section.get("lr_scaling", "none"),
        "lr_scale": w.lr_scale if w.lr_scale is not None else 1.0,
        "learning_rate": (w.applied or {}).get("learning_rate"),
        "objective": results.mode(study),
        "pick": pick or ("fastest-feasible" if results.mode(study) == "pareto" else None),
        "confirmed": confirmed_block,
        "burst": kept.definition.get("burst"),
        "fingerprint": kept.fingerprint,
        # what each trial measured: the whole machine, or one share of it (--jobs): run the winner
        # on that share (one GPU and its cores: one rank of a data-parallel job)
        "partition": kept.partition or {"jobs": 1, "share": "the whole machine"},
        **_group(w, kept),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _group(w: TrialRecord, kept: StudyRecord) -> dict[str, Any]:
    """A data-parallel winner's ``group`` block: its ranks and backend (TensorFlow: its strategy and
    replicas' devices), how to launch it in production, and its scaling figure; nothing for a
    one-process study."""
    group = w.group or {}
    if not group.get("nproc"):
        return {}
    n = group["nproc"]
    scaling = (kept.scaling or {}).get("winner")
    if group.get("strategy"):  # TensorFlow: one process, its MirroredStrategy over every visible GPU
        how = {"strategy": group["strategy"], "devices": group.get("devices"),
               "launch": "KNOBTUNE_CONFIG=best.json python train.py"}
    else:
        how = {"backend": group.get("backend"),
               "launch": f"KNOBTUNE_CONFIG=best.json torchrun --nproc_per_node {n} train.py"}
    return {"group": {"nproc": n, **how, **({"scaling": scaling} if scaling else {})}}


def _round_rates(confirmed: dict[str, Any], number: int) -> dict[str, Any]:
    """The winner's steady-state samples/s over its confirmation rounds (median and range): what
    production's watchdog expects, whatever the objective's unit (seconds to target, or an effective
    rate under ``job_samples``), and the spread that tells production's figure from the machine's noise."""
    rates = [e["samples_per_second"] for e in (confirmed.get("runs") or {}).get(str(number), [])
             if e.get("outcome") == "ok" and e.get("samples_per_second")]
    if not rates:
        return {}
    return {"samples_per_second": statistics.median(rates), "samples_per_second_range": [min(rates), max(rates)]}
