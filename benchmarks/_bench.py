"""Helpers the benchmark scripts share: measure configurations through the engine's own path."""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from search import definition  # noqa: E402
from search.objective import Plan, Report, measure  # noqa: E402
from search.probe import probe  # noqa: E402
from spaces import for_framework  # noqa: E402


def plan_for(study_text: str) -> Plan:
    """A Plan (what every trial shares) for a study file's text, probed on this machine."""
    d = definition.parse(study_text, source="<benchmark>", default_name="benchmark")
    info = probe(d.study.framework, d.study.workload, d.workload)
    ctx = {"hardware": info["fingerprint"]["hardware"], "workload": info["workload"]}
    space = for_framework(d.study.framework)
    return Plan(d, space, space.offer(ctx, d.space, d.baseline), ctx, os.getcwd())


def run_params(plan: Plan, params: dict[str, Any], label: str = "") -> Report:
    """Measure one configuration (Optuna-style params) in a child, exactly as a trial does."""
    values = {**plan.space.defaults(plan.ctx, plan.definition.baseline), **params}
    resolved = plan.space.resolve(values, plan.offer, plan.ctx)
    report = measure(plan, resolved, is_baseline=False)
    sps = report.samples_per_second
    acc = report.val_accuracy
    print(f"  {label:<10} {report.outcome:<7} {sps or 0:>9,.0f} samples/s  acc {acc or 0:.3f}  {params}", flush=True)
    return report


def interleaved(plan: Plan, configs: dict[str, dict[str, Any]], repeats: int) -> dict[str, list[float]]:
    """Re-measure each named config ``repeats`` times, interleaved (A B C A B C ...)."""
    rates: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(repeats):
        for name, params in configs.items():
            report = run_params(plan, params, f"{name}[{r}]")
            if report.samples_per_second:
                rates[name].append(report.samples_per_second)
    return rates


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")
