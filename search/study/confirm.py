"""Confirmation of winners: re-measure the top candidates and the baseline, interleaved
(A B C base A B C base ...), so that drift of the machine hits all alike; a candidate wins only
when it beats the baseline side by side, round after round (``choose_winner``), else the
baseline is kept. A search over noisy measurements otherwise crowns whichever config got lucky once. Each
round uses a seed no trial used, so the rounds' accuracies are new samples of each configuration's
accuracy, and the final guard judges the candidates' mean accuracy against every baseline
accuracy measured."""
from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Hashable, TextIO, TypeVar

import optuna
from optuna.trial import FrozenTrial

from knobtune.search.storage import record
from knobtune.search.storage.record import TrialRecord
from knobtune.search.story import results
from knobtune.search.story.progress import rate as fmt
from knobtune.search.study.effects import ACCURACY_PENALTY, Effects, accuracies
from knobtune.search.study.objective import Measurement, Plan, final_floor, measure, objective_values, verdict_floor

ProgressLine = Callable[[str], None]
T = TypeVar("T")


def candidates(study: optuna.Study, top_k: int, floor: float | None = None,
               learning: tuple[str, ...] = ()) -> tuple[list[FrozenTrial], str | None]:
    """The trials to confirm, and the pick their winner stands for (pareto: the front's picks).
    With ``floor`` (the final verdict's accuracy floor), trials expected to meet it come first: one
    that passed only the search's allowance for noise would, with several seeds, most likely fail
    the verdict, and a confirmation of nothing but those keeps the baseline. Expected by
    ``expected_accuracy``: every trial's accuracy pooled per knob value, not one trial's seed; and
    the line-up is ``hedge``d over ``learning``, the knobs that change what is learnt."""
    if results.mode(study) == "pareto":
        points = results.front(study)
        picked = [results.pick_from_front(points, p) for p in results.PICKS]
        # the baseline is measured in every round anyway: as a candidate too, it would run twice a round
        unique = list({t.number: t for t in picked if t is not None and not TrialRecord.of(t).is_baseline}.values())
        return unique, "fastest-feasible"
    feasible = results.feasible(study)
    reverse = results.mode(study) != "time-to-accuracy"
    ranked = sorted(feasible, key=lambda t: t.value, reverse=reverse)
    seen, out = set(), []
    for t in ranked:
        key = tuple(sorted(t.params.items()))
        if key not in seen and not TrialRecord.of(t).is_baseline:
            seen.add(key)
            out.append(t)
    if floor is None:
        return out[:top_k], None
    expected = expected_accuracy(study.get_trials(deepcopy=False))
    return line_up(out, top_k, lambda t: expected(t) >= floor, lambda t: tuple(t.params.get(k) for k in learning)), None


def line_up(ranked: list[T], top_k: int, at_floor: Callable[[T], bool], trains_as: Callable[[T], Hashable]) -> list[T]:
    """The ``top_k`` of ``ranked`` to confirm: those expected at the floor first (in their order),
    ``hedge``d among them when there are enough (it never trades one for one under the floor)."""
    ordered = sorted(ranked, key=lambda c: not at_floor(c))  # (stable: the order by objective holds)
    expected_ok = [c for c in ordered if at_floor(c)]
    return hedge(expected_ok, top_k, trains_as) if len(expected_ok) >= top_k else ordered[:top_k]


def hedge(ranked: list[T], top_k: int, trains_as: Callable[[T], Hashable]) -> list[T]:
    """The first ``top_k`` of ``ranked``, but when they all train alike (``trains_as``: their values
    of the knobs that change what is learnt) and a later one does not, the last place is its.

    The search measured every trial with one seed, so its accuracies share that seed's luck: a
    fast batch size at the verdict's floor looked safe in every trial of it, took every place,
    failed the floor in the rounds' seeds together, and kept the baseline (2 of 5 TensorFlow
    searches here); a line-up that also holds the fastest configuration training otherwise has a
    winner left when they fail."""
    first = ranked[:top_k]
    if top_k < 2 or len({trains_as(c) for c in first}) != 1:
        return first
    alike = trains_as(first[0])
    other = next((c for c in ranked[top_k:] if trains_as(c) != alike), None)
    return first if other is None else first[:-1] + [other]


def expected_accuracy(trials: list[FrozenTrial]) -> Callable[[FrozenTrial], float]:
    """A trial's expected accuracy: the accuracy model's (effects.Effects over every trial's
    accuracy, the sampler's), fitted once there are two; its own accuracy before that. (The
    TensorFlow grid's best, in one search, measured 0.931 against a verdict floor of 0.932: by its
    own seed it went behind slower candidates and was not confirmed.)"""
    known = accuracies(trials)
    if len(known) < 2:
        return lambda t: TrialRecord.of(t).val_accuracy or 0.0
    model = Effects.fit(known, ACCURACY_PENALTY)
    return lambda t: model.estimate(dict(t.params))


def _score(plan: Plan, measured: Measurement, base_acc: list[float] | None) -> tuple[float | None, bool]:
    """A confirmation run's objective number (samples/s, effective samples/s or seconds to
    target) and whether it passed the guard."""
    if measured.outcome != "ok" or (measured.val_accuracy is None and plan.definition.guard.accuracy):
        return None, False
    values, constraint, _ = objective_values(measured, plan.definition, base_acc)
    return values[0], constraint <= 0


def _paired(runs: list[dict[str, Any]], base_runs: list[dict[str, Any]], minimize: bool) -> dict[str, Any]:
    """The median speedup over the baseline, paired by round (the same moment of the machine)."""
    ratios = [b["value"] / r["value"] if minimize else r["value"] / b["value"]
              for r, b in zip(runs, base_runs) if r["value"] and b["value"]]
    return {"speedup": statistics.median(ratios) if ratios else None,
            "speedup_range": [min(ratios), max(ratios)] if ratios else None, "ratios": ratios}


def choose_winner(runs: dict[str, list[dict[str, Any]]], base: int, challengers: list[int], minimize: bool,
                  min_speedup: float) -> tuple[int, dict[str, dict[str, Any]]]:
    """The confirmed winner, by the rounds' paired ratios (each round measures everyone at the same
    moment of the machine). A challenger beats the baseline only when its median ratio over it is
    at least ``1 + min_speedup`` and it was faster in more than half of the rounds; otherwise the
    baseline is kept: a change must earn its place. Among several that beat it (the finalists),
    the winner is the one fastest against the others (``standings``). Returns the winner and each
    challenger's figures (a finalist's ``standing`` among them)."""
    paired: dict[str, dict[str, Any]] = {}
    beaters = []
    for number in challengers:
        mine, theirs = runs[str(number)], runs[str(base)]
        figures = _paired(mine, theirs, minimize)
        ratios = figures.pop("ratios")
        faster = sum(r > 1 for r in ratios)
        # a round the challenger (or the baseline) failed counts as not faster
        beats = bool(ratios) and figures["speedup"] >= 1 + min_speedup and faster * 2 > len(mine)
        paired[str(number)] = {**figures, "faster_rounds": faster, "rounds": len(mine), "beats_baseline": beats}
        if beats:
            beaters.append(number)
    if not beaters:
        return base, paired
    standing = standings({str(n): runs[str(n)] for n in beaters}, minimize)
    for name, figure in standing.items():
        paired[name]["standing"] = figure
    return max(beaters, key=lambda n: (standing.get(str(n)) or 0.0, paired[str(n)]["speedup"])), paired


def standings(runs: dict[str, list[dict[str, Any]]], minimize: bool) -> dict[str, float]:
    """Each of ``runs``' median, over the rounds all of them finished, of its value over the round's
    level (the geometric mean of theirs; inverted when ``minimize``): the finalists compared with
    each other, round by round. Their ratios over the baseline would also compare them, but each
    carries that round's one baseline run, and a TensorFlow process on a small CPU runs in a fast
    or a slow mode for its whole life: the median of those ratios then picked the
    finalist the baseline's modes favoured (a search here confirmed batch 512 with map AUTOTUNE,
    third of three against the others in the same rounds)."""
    names = list(runs)
    count = min((len(v) for v in runs.values()), default=0)
    full = [r for r in range(count) if all(runs[n][r]["value"] for n in names)]
    if len(names) < 2 or not full:
        return {}
    out = {}
    for n in names:
        ratios = []
        for r in full:
            level = math.exp(statistics.fmean(math.log(runs[m][r]["value"]) for m in names))
            ratios.append(level / runs[n][r]["value"] if minimize else runs[n][r]["value"] / level)
        out[n] = statistics.median(ratios)
    return out


def _verdict(runs: dict[str, list[dict[str, Any]]], base: FrozenTrial, base_acc: list[float], plan: Plan,
             judged: bool) -> tuple[float | None, dict[str, float | None], dict[str, float | None]]:
    """The final floor (None when the guard does not judge accuracy), each lineup member's median
    objective (None when it failed the verdict) and mean accuracy over its rounds."""
    all_base = base_acc + [e["val_accuracy"] for e in runs[str(base.number)] if e["val_accuracy"] is not None]
    floor = final_floor(all_base, plan.definition.guard.max_accuracy_drop) if judged and all_base else None
    medians: dict[str, float | None] = {}
    accuracies: dict[str, float | None] = {}
    for number, entries in runs.items():
        values = [e["value"] for e in entries if e["value"] is not None]
        accs = [e["val_accuracy"] for e in entries if e["val_accuracy"] is not None and e["value"] is not None]
        accuracies[number] = statistics.fmean(accs) if accs else None
        if floor is None:
            passed = sum(e["passed"] for e in entries) * 2 > len(entries)  # most runs reach the target
        else:
            passed = number == str(base.number) or (accuracies[number] is not None and accuracies[number] >= floor)
        medians[number] = statistics.median(values) if values and passed else None
    return floor, medians, accuracies


def _close_calls(runs: dict[str, list[dict[str, Any]]], base: int, challengers: list[int], floor: float,
                 minimize: bool, min_speedup: float, width: float = 1.0) -> list[int]:
    """The challengers that beat the baseline on speed (``choose_winner``'s rule, accuracy aside)
    and whose mean accuracy is within ``width`` standard errors of ``floor``: the standard error of
    their mean minus the baseline's (each over its rounds; 0 with a single round)."""
    def mean_se(values: list[float]) -> tuple[float, float]:
        se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
        return statistics.fmean(values), se

    base_accs = [e["val_accuracy"] for e in runs[str(base)] if e["val_accuracy"] is not None]
    if not base_accs:
        return []
    _, base_se = mean_se(base_accs)
    _, paired = choose_winner(runs, base, challengers, minimize, min_speedup)
    close = []
    for number in challengers:
        accs = [e["val_accuracy"] for e in runs[str(number)]
                if e["val_accuracy"] is not None and e["value"] is not None]
        if not accs or not paired[str(number)]["beats_baseline"]:
            continue
        mean, se = mean_se(accs)
        if abs(mean - floor) <= width * (se ** 2 + base_se ** 2) ** 0.5:
            close.append(number)
    return close


def confirm(study: optuna.Study, plan: Plan, err: TextIO) -> dict[str, Any] | None:
    """Run the confirmation and store it in the study attribute ``confirmed``."""
    cfg = plan.definition.confirm
    base = results.baseline(study)
    chosen, pick = candidates(study, cfg.top_k, verdict_floor(plan.definition, TrialRecord.of(base) if base else None),
                              plan.space.learning_knobs)
    if not chosen or base is None or cfg.top_k == 0:
        return None
    minimize = results.mode(study) == "time-to-accuracy"
    base_acc = TrialRecord.of(base).measured_accuracies
    noisy = any(TrialRecord.of(t).noisy for t in [*chosen, base])
    repeats = cfg.noisy_repeats if noisy else cfg.repeats
    lineup = [*chosen, base]
    err.write(f"knobtune: confirming {len(chosen)} candidate(s) and the baseline, {repeats} interleaved rounds"
              f"{' (more rounds: some trials were noisy)' if noisy else ''} ...\n")
    runs: dict[str, list[dict[str, Any]]] = {str(t.number): [] for t in lineup}
    order: list[int] = []
    # Each round trains everyone with a fresh seed (the same seed within a round, so the pairing is
    # fair): accuracies over rounds are independent measurements, not copies of the trials' runs.
    first_seed = plan.definition.guard.baseline_runs

    def play(rounds: range, total: int) -> None:
        for r in rounds:
            shown = []
            for t in lineup:
                resolved = plan.space.resolve(t.params, plan.offer, plan.ctx)
                report = measure(plan, resolved, is_baseline=t is base, seed_offset=first_seed + r)
                score, ok = _score(plan, report, None if t is base else base_acc)
                runs[str(t.number)].append({
                    "round": r, "seed_offset": first_seed + r, "value": score, "passed": ok,
                    "outcome": report.outcome, "samples_per_second": report.samples_per_second,
                    "val_accuracy": report.val_accuracy, "knobs": report.record.applied_knobs,
                })
                order.append(t.number)
                value = report.samples_per_second if report.outcome == "ok" else None
                shown.append(f"{'baseline' if t is base else f'#{t.number}'} {fmt(value) if value else report.outcome}")
            err.write(f"  round {r + 1}/{total}: " + "   ".join(shown) + "\n")

    play(range(repeats), repeats)
    # The final verdict on accuracy: each candidate's mean accuracy over its rounds (each a fresh
    # seed) against the mean of every baseline accuracy measured (the trial's runs and this
    # confirmation's) minus max_accuracy_drop. During the search the floor also allows for the
    # baseline's spread, so that the sampler does not learn from noise; here both sides are
    # means over several seeds, and the winner must meet the guard as the user stated it.
    judged = not minimize and plan.definition.guard.accuracy
    floor, medians, accuracies = _verdict(runs, base, base_acc, plan, judged)
    # A candidate that beats the baseline on speed and whose mean accuracy is within the rounds'
    # own uncertainty of the floor would be kept or dropped by a few seeds' luck: every one in the
    # lineup runs as many rounds again (once), and the verdict is taken over all of them.
    close = _close_calls(runs, base.number, [t.number for t in chosen], floor, minimize, cfg.min_speedup) \
        if floor is not None else []
    extended = None
    if close:
        err.write(f"knobtune: {', '.join(f'#{n}' for n in close)} within the rounds' uncertainty of the accuracy "
                  f"floor ({floor:.4f}): {repeats} more rounds for everyone ...\n")
        play(range(repeats, 2 * repeats), 2 * repeats)
        extended = {"trials": close, "first_floor": floor}
        repeats *= 2
        floor, medians, accuracies = _verdict(runs, base, base_acc, plan, judged)
    all_base = base_acc + [e["val_accuracy"] for e in runs[str(base.number)] if e["val_accuracy"] is not None]
    confirmed: dict[str, Any] = {"after_trials": len(results.finished(study)), "repeats": repeats, "noisy": noisy,
                              "order": order, "runs": runs, "medians": medians, "baseline": base.number,
                              "pick": pick, "minimize": minimize, "winner": None,
                              "mean_accuracies": accuracies, "accuracy_floor": floor,
                              "baseline_accuracies": all_base, "min_speedup": cfg.min_speedup,
                              "extended": extended}
    if medians[str(base.number)] is not None:
        challengers = [t for t in chosen if medians[str(t.number)] is not None]
        winner, paired = choose_winner(runs, base.number, [t.number for t in challengers], minimize, cfg.min_speedup)
        searched = results.searched_best(study)
        confirmed.update(winner=winner, searched_winner=searched.number if searched else None, paired=paired)
        if winner != base.number:
            confirmed.update({k: paired[str(winner)][k] for k in ("speedup", "speedup_range")})
        elif paired:  # say how close the best candidate came
            closest = max(paired, key=lambda n: paired[n]["speedup"] or 0.0)
            confirmed["runner_up"] = {"trial": int(closest), **paired[closest]}
    else:  # the baseline failed its rounds: nothing to pair with; the best median among the rest
        contenders = [t for t in chosen if medians[str(t.number)] is not None]
        if contenders:
            best_of = min if minimize else max
            confirmed["winner"] = best_of(contenders, key=lambda t: medians[str(t.number)]).number
    record.mark_study(study, confirmed=confirmed)
    return confirmed
