"""Helpers the benchmark scripts share: measure configurations through the engine's own path."""
from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from knobtune.search.launch.partition import Partition  # noqa: E402
from knobtune.search.launch.probe import probe  # noqa: E402
from knobtune.search.study import definition  # noqa: E402
from knobtune.search.study.objective import Measurement, Plan, measure  # noqa: E402
from knobtune.spaces import for_framework  # noqa: E402

STUDY_HEAD = """
[study]
name = "{name}"
framework = "{framework}"
workload = "digits-mlp"
trials = {trials}
seed = {seed}

[burst]
train_samples = {train_samples}
warmup_samples = 1000
windows = 5
timeout_s = 300

[baseline]
batch_size = 64

[space]
"""


TRAIN_SAMPLES = 16000


def study_text(name: str, framework: str, trials: int, seed: int, space: str,
               train_samples: int = TRAIN_SAMPLES) -> str:
    """A digits-mlp study file: the benchmarks' common burst (``train_samples`` long) and baseline,
    then ``space`` lines."""
    return STUDY_HEAD.format(name=name, framework=framework, trials=trials, seed=seed,
                             train_samples=train_samples) + space


def space_lines(framework: str, searched: dict[str, list[Any]]) -> str:
    """``[space]`` lines: ``searched``'s choices, every other knob held at its default (knobs added
    to the framework later do not grow a benchmark's grid)."""
    import json

    lines = [f"{name} = {json.dumps(values)}" for name, values in searched.items()]
    lines += [f"{k.name} = [{json.dumps(k.default)}]" for k in for_framework(framework).knobs
              if k.name not in searched and k.name != "batch_size"]
    return "\n".join(lines) + "\n"


def run_study(text: str, url: str, confirm: bool = False, diagnose: bool = False,
              jobs: str | None = None) -> tuple[Any, float]:
    """Run the study in ``text`` on storage ``url`` (its trial lines to stdout); the study, wall s.
    Confirmation and diagnosis are off unless asked for: the benchmarks re-measure side by side."""
    import io
    import time

    import optuna

    from knobtune.search.study import study as study_mod

    d = definition.parse(text, default_name="benchmark")
    start = time.monotonic()
    study_mod.run(d, storage_url=url, out=io.StringIO(), err=sys.stdout, confirm_winners=confirm, diagnose=diagnose,
                  jobs=jobs)
    return optuna.load_study(study_name=d.study.name, storage=url), time.monotonic() - start


def plan_for(study_text: str, placement: Partition | None = None) -> Plan:
    """A Plan (what every trial shares) for a study file's text, probed on this machine (on
    ``placement``, a partition of it, when given: every measurement then runs there)."""
    d = definition.parse(study_text, source="<benchmark>", default_name="benchmark")
    info = probe(d.study.framework, d.study.workload, d.workload, placement=placement)
    ctx = {"hardware": info["fingerprint"]["hardware"], "workload": info["workload"]}
    space = for_framework(d.study.framework)
    return Plan(d, space, space.offer(ctx, d.space, d.baseline), ctx, os.getcwd(), placement)


def run_params(plan: Plan, params: dict[str, Any], label: str = "", seed_offset: int = 0) -> Measurement:
    """Measure one configuration (Optuna-style params) in a child, exactly as a trial does
    (``seed_offset`` re-seeds its initialisation, data order and augmentation)."""
    values = {**plan.space.defaults(plan.ctx, plan.definition.baseline), **params}
    resolved = plan.space.resolve(values, plan.offer, plan.ctx)
    report = measure(plan, resolved, is_baseline=False, seed_offset=seed_offset)
    sps = report.samples_per_second
    acc = report.val_accuracy
    print(f"  {label:<10} {report.outcome:<7} {sps or 0:>9,.0f} samples/s  acc {acc or 0:.3f}  {params}", flush=True)
    return report


def interleaved(configs: dict[str, tuple[Plan, dict[str, Any]]], repeats: int) -> dict[str, list[float]]:
    """Re-measure each named (plan, params) ``repeats`` times, interleaved (A B C A B C ...), so
    that drift of the machine hits every config alike."""
    rates: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(repeats):
        for name, (plan, params) in configs.items():
            report = run_params(plan, params, f"{name}[{r}]")
            if report.samples_per_second:
                rates[name].append(report.samples_per_second)
    return rates


def overhead(plan: Plan, configs: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Each configuration measured twice, as a child forked from the warm server and as a fresh
    process, alternately (so drift hits both alike); per way, the overhead (trial wall time minus
    the burst's own) as a fraction of the trial wall time, and in seconds per trial."""
    from knobtune.search.launch import forkserver

    ways = {"warm server": "1", "fresh process": "0"}
    spent: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
    before = os.environ.get(forkserver.ENV_SWITCH)
    try:
        for i, params in enumerate(configs):
            for way in (list(ways) if i % 2 == 0 else list(reversed(ways))):
                os.environ[forkserver.ENV_SWITCH] = ways[way]
                report = run_params(plan, params, way.split()[0])
                trial, burst = report.record.trial_seconds, report.record.burst_seconds
                if report.outcome == "ok" and trial and burst:
                    spent[way].append((trial, burst))
    finally:
        if before is None:
            os.environ.pop(forkserver.ENV_SWITCH, None)
        else:
            os.environ[forkserver.ENV_SWITCH] = before
    out = {}
    for way, pairs in spent.items():
        trial_s, burst_s = sum(t for t, _ in pairs), sum(b for _, b in pairs)
        out[way] = ((trial_s - burst_s) / trial_s if trial_s else float("nan"),
                    (trial_s - burst_s) / len(pairs) if pairs else float("nan"))
    return out


def arguments(doc: str, trials: int, frameworks: tuple[str, ...] = ()) -> argparse.Namespace:
    """--trials, --repeats and --seed, the options every benchmark takes (and --framework, the
    first of ``frameworks`` by default, for a benchmark of several)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=trials, help=f"trials per search (default {trials})")
    parser.add_argument("--repeats", type=int, default=3, help="side-by-side repeats of each config (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    if frameworks:
        parser.add_argument("--framework", choices=frameworks, default=frameworks[0],
                            help=f"the framework measured (default {frameworks[0]})")
    return parser.parse_args()


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def grid_table(runs: dict[tuple, list[tuple[float, float]]]) -> dict[tuple, tuple[float, float]]:
    """Per configuration, its (samples/s, accuracy) runs as the grid scores them: the median rate
    and the mean accuracy."""
    return {k: (median(r for r, _ in v), statistics.fmean(a for _, a in v)) for k, v in runs.items()}


def grid_runs(entries: list) -> dict[tuple, list[tuple[float, float]]]:
    """A grid file's ``runs`` or ``top`` entries (search_quality.py's --grid-file): per configuration
    (its knob pairs), its (samples/s, accuracy) runs."""
    return {tuple(tuple(pair) for pair in k): [tuple(r) for r in v] for k, v in entries}


def grid_baseline(framework: str, runs: dict[tuple, list[tuple[float, float]]]) -> tuple:
    """The grid's configuration that is the benchmarks' baseline: batch 64 (``STUDY_HEAD``), every
    other knob at the framework's default."""
    defaults = {k.name: k.default for k in for_framework(framework).knobs}
    defaults["batch_size"] = 64
    found = [c for c in runs if all(defaults.get(k) == v for k, v in c)]
    if len(found) != 1:
        raise ValueError(f"expected one {framework} grid configuration at the defaults with batch 64, found {found}")
    return found[0]


def settled(table: dict[tuple, tuple[float, float]], top: dict[tuple, list[tuple[float, float]]],
            measured: dict[tuple, list[tuple[float, float]]]) -> dict[tuple, tuple[float, float]]:
    """``table`` with the top configurations' rates from their paired rounds: in each round every
    one of them ran within a minute, so a configuration's median ratio to the round's geometric
    mean ranks it free of the machine's drift between passes; the group keeps its level (the
    geometric mean of its grid medians). Their accuracies are the mean over passes and rounds."""
    if not top:
        return dict(table)
    rounds = min(len(v) for v in top.values())
    ratios: dict[tuple, list[float]] = {k: [] for k in top}
    for r in range(rounds):
        rates = {k: v[r][0] for k, v in top.items() if v[r][0] > 0}
        if len(rates) < 2:
            continue
        level = math.exp(statistics.fmean(math.log(x) for x in rates.values()))
        for k, x in rates.items():
            ratios[k].append(x / level)
    level = math.exp(statistics.fmean(math.log(table[k][0]) for k in top))
    out = dict(table)
    for k, got in ratios.items():
        accuracies = [a for _, a in measured[k]] + [a for x, a in top[k] if x > 0]
        out[k] = (statistics.median(got) * level if got else table[k][0], statistics.fmean(accuracies))
    return out


def reference_spread(measured: dict[tuple, list[tuple[float, float]]], top: dict[tuple, list[tuple[float, float]]],
                     floor: float, resamples: int = 1000, seed: int = 0) -> dict[tuple, tuple[float, float, float]]:
    """How sure the grid is of its own ranking: the reference (medians of the passes, settled by
    the top's paired rounds) recomputed ``resamples`` times from passes and rounds drawn with
    replacement. Per configuration that passes ``floor``: the 5th and 95th percentiles of its rate
    over the best's, and the share of resamples in which it is within 95 % of the best (a
    configuration the grid cannot tell from its best has a 95th percentile of 0.95 or more)."""
    rng = random.Random(seed)

    def ratios(runs: dict[tuple, list[tuple[float, float]]], rounds: dict[tuple, list[tuple[float, float]]]) \
            -> dict[tuple, float]:
        settled_table = settled(grid_table(runs), rounds, runs)
        ref = {k: rate for k, (rate, acc) in settled_table.items() if acc >= floor and rate > 0}
        best = max(ref.values(), default=0.0)
        return {k: rate / best for k, rate in ref.items()} if best else {}

    drawn: dict[tuple, list[float]] = {k: [] for k in measured}
    n = min((len(v) for v in top.values()), default=0)
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]  # the same rounds for every top configuration: still paired
        got = ratios({k: [rng.choice(v) for _ in v] for k, v in measured.items()},
                     {k: [v[i] for i in picks] for k, v in top.items()})
        for k in measured:
            drawn[k].append(got.get(k, 0.0))
    out = {}
    for k in ratios(measured, top):
        values = sorted(drawn[k])
        out[k] = (values[int(0.05 * resamples)], values[int(0.95 * resamples) - 1],
                  sum(v >= 0.95 for v in values) / resamples)
    return out


def split_best(table: dict[tuple, tuple[float, float]], rounds: dict[tuple, list[tuple[float, float]]],
               runs: dict[tuple, list[tuple[float, float]]], floor: float) -> tuple[float, list[tuple]] | None:
    """The best configuration's rate free of its own luck: the fastest of ``rounds``' configurations
    on the even rounds, as measured on the odd ones, and the fastest on the odd, as measured on the
    even (each half ``settled`` as the whole is); the mean of the two rates, and the two chosen.

    The fastest of several near-equal configurations, by the very rounds that measured it, is the one
    whose noise was kindest: its rate overstates the best (the winner's curse; with eight rounds of
    six configurations within 5 % of each other, by about as much as they differ), and a pick as good
    as the true best would score under it. Chosen on one half and measured on the other, it does
    not. None with fewer than two rounds. Feasibility by the accuracies of the whole (``settled``
    over every round): both halves judge the same configurations feasible."""
    n = min((len(v) for v in rounds.values()), default=0)
    if n < 2:
        return None
    whole = settled(table, rounds, runs)
    feasible = [k for k in rounds if whole[k][1] >= floor]
    if not feasible:
        return None
    halves = [settled(table, {k: v[h:n:2] for k, v in rounds.items()}, runs) for h in (0, 1)]
    chosen = [max(feasible, key=lambda k, ref=ref: ref[k][0]) for ref in halves]
    return statistics.fmean([halves[1][chosen[0]][0], halves[0][chosen[1]][0]]), chosen
