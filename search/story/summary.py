"""Human-readable lines about a study: one per trial during a run, the table at the end."""
from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial

from knobtune.search.storage.database import DEFAULT_URL, redact
from knobtune.search.storage.record import StudyRecord, TrialRecord
from knobtune.search.story import results
from knobtune.search.story.findings import disqualified
from knobtune.search.story.progress import rate


def scaling_line(label: str, scaling: dict[str, Any], nproc: int, members: str = "ranks") -> str:
    """A data-parallel study's scaling figure for one configuration (search/study/scaling.py)."""
    one = members[:-1]
    if "error" in scaling:
        return f"  {label}: no scaling figure ({scaling['error']})"
    return (f"  {label}: {nproc} {members} run {scaling['speedup']:.2f}x one {one} alone, back to back "
            f"({100 * scaling['efficiency']:.0f}% scaling efficiency; one {one} {rate(scaling['one_rank'])} samples/s)")


def diagnosis_line(label: str, diagnosis: dict[str, Any], samples_per_second: float | None) -> str:
    """``bottleneck: input`` for one config, and how close it gets to its lower ceiling."""
    if "error" in diagnosis:
        return f"  {label}: diagnosis failed ({diagnosis['error']})"
    limit = diagnosis["bottleneck"]
    ceiling = diagnosis[limit]
    text = (f"  {label}: bottleneck: {limit} (input ceiling {rate(diagnosis['input'])} samples/s, "
            f"compute ceiling {rate(diagnosis['compute'])})")
    if samples_per_second:
        text += f"; it runs at {samples_per_second / ceiling:.0%} of its {limit} ceiling"
    return text


def changed_knobs(values: dict[str, Any], reference: dict[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in values.items() if reference.get(k) != v]
    return " ".join(parts) if parts else "(baseline settings)"


def _acc(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def trial_line(number: int, rec: TrialRecord, best: tuple[str, int] | None,
               baseline_knobs: dict[str, Any] | None) -> str:
    """``trial #3   ok   9,141 samples/s  acc 0.956  cv 5%  11.2 s  | best ... (#2)`` + changed knobs."""
    outcome = rec.outcome or "?"
    tag = f"[{rec.source}]" if rec.source in ("baseline", "advice", "explore") else ""
    origin = rec.warm_start_from
    if origin:
        tag = f"[warm start: {origin['study']} #{origin['trial']}]"
    head = f"trial #{number:<3} {outcome:<7}"
    if outcome == "ok":
        text = (f"{head} {rate(rec.samples_per_second):>9} samples/s  "
                f"acc {_acc(rec.val_accuracy)}  cv {100 * (rec.samples_per_second_cv or 0):>2.0f}%  "
                f"{rec.trial_seconds or 0:>5.1f} s")
        if rec.effective_samples_per_second is not None:
            text += f"  (job: {rate(rec.effective_samples_per_second)} samples/s)"
        if rec.time_to_accuracy is not None:
            text += f"  target in {rec.time_to_accuracy:.2f} s"
        elif rec.accuracy_reached is not None:
            text += f"  target not reached (best {rec.accuracy_reached:.3f})"
        elif rec.feasible is False:
            text += "  " + results.infeasible_why(rec)
        if rec.noisy:
            text += "  noisy"
    else:
        failure = (rec.failure or "").splitlines()
        text = f"{head} {failure[0] if failure else ''}  ({rec.trial_seconds or 0:.1f} s)"
    if best:
        text += f"  | best {best[0]} (#{best[1]})"
    detail = [tag] if tag else []
    if baseline_knobs is not None and not rec.is_baseline:
        detail.append(changed_knobs(rec.applied_knobs, baseline_knobs))
    if detail:
        text += "\n" + " " * 11 + " ".join(detail)
    return text


def _metric(trial: FrozenTrial, minimize: bool) -> str:
    return f"{trial.value:.2f} s" if minimize else rate(results.rate(trial))


def _row(label: str, trial: FrozenTrial, base: FrozenTrial, minimize: bool) -> str:
    speed = results.search_speedup(trial, base, minimize)
    return (f"  {label:<9} #{trial.number:<5} {_metric(trial, minimize):>11} "
            f"{_acc(TrialRecord.of(trial).val_accuracy):>13} {f'{speed:.2f}x' if speed else '-':>8}")


def _confirmed_line(confirmed: dict[str, Any]) -> str:
    """``confirmed: trial #4 is 1.31x the baseline (range ...)``, or that the baseline held."""
    def spread(entry: dict[str, Any]) -> str:
        lo, hi = entry.get("speedup_range") or (None, None)
        return f" (range {lo:.2f}x-{hi:.2f}x over {confirmed['repeats']} interleaved rounds)" if lo else ""

    if confirmed["winner"] == confirmed["baseline"]:
        runner = confirmed.get("runner_up")
        closest = (f"; the closest candidate, trial #{runner['trial']}, ran at {runner['speedup']:.2f}x"
                   f"{spread(runner)}") if runner and runner.get("speedup") else ""
        out = "".join(f"\n    {line}" for line in disqualified(confirmed))
        return (f"  confirmed: no configuration beat your current settings side by side (a candidate must keep the "
                f"accuracy and be {confirmed.get('min_speedup', 0.03):.0%} faster in the median of the paired rounds "
                f"and faster in most of them), so the baseline is kept{closest}{out}")
    changed = "" if confirmed.get("searched_winner") in (None, confirmed["winner"]) else \
        f"; the search's own best was #{confirmed['searched_winner']}"
    speedup = f"{confirmed['speedup']:.2f}x" if confirmed.get("speedup") else "(no paired rounds)"
    line = f"  confirmed: trial #{confirmed['winner']} is {speedup} the baseline{spread(confirmed)}{changed}"
    finalists = [n for n, entry in (confirmed.get("paired") or {}).items() if entry.get("standing") is not None]
    if len(finalists) > 1:
        others = ", ".join(f"#{n}" for n in finalists if n != str(confirmed["winner"]))
        line += f"\n  of the {len(finalists)} that beat the baseline, the fastest against the others round by round ({others})"
    accuracy = (confirmed.get("mean_accuracies") or {}).get(str(confirmed["winner"]))
    if accuracy is not None and confirmed.get("accuracy_floor") is not None:
        line += (f"\n  final guard: its mean val_accuracy over the rounds' seeds {accuracy:.3f} >= "
                 f"{confirmed['accuracy_floor']:.3f} (the mean of {len(confirmed.get('baseline_accuracies', []))} "
                 f"baseline runs minus max_accuracy_drop)")
    return line


def short_windows_note(number: int, short: dict[str, Any]) -> str:
    return (f"note: trial #{number}'s shortest window lasted {short['shortest_seconds'] * 1000:.0f} ms, under "
            f"[burst] min_window_seconds = {short['min_window_seconds']:g}: timing, queue transients and "
            f"allocator effects weigh on such windows; [burst] train_samples = {short['suggested_train_samples']} "
            f"would make them long enough (for a new study: --name)")


def unsettled_note(number: int, unsettled: dict[str, Any]) -> str:
    return (f"note: trial #{number}'s input pipeline held up to {unsettled['read_ahead_batches']} batches ahead, and "
            f"the burst had room to train through {unsettled['settled_batches']} before its windows: batches "
            f"loaded during warm-up may have inflated its rate (marked noisy); [burst] train_samples = "
            f"{unsettled['suggested_train_samples']} would leave room (for a new study: --name)")


BURST_NOTES = {"short_windows": short_windows_note, "unsettled": unsettled_note}


def best_label(study: optuna.Study) -> tuple[str, int] | None:
    """The progress bar's "best so far": samples/s, or seconds to target."""
    best = results.searched_best(study)
    if best is None:
        return None
    if results.mode(study) == "time-to-accuracy":
        return f"{best.value:.2f} s to target", best.number
    return f"{results.rate(best):,.0f} samples/s", best.number


# trial attributes that say the burst was too short for the trial, each with its train_samples fix
BURST_ADVICE = (
    ("short_windows", "short windows", "had windows under [burst] min_window_seconds"),
    ("unsettled", "read-ahead", "could not train through their input pipeline's read-ahead before the windows"),
)


def study_summary(study: optuna.Study, url: str) -> str:
    """The end-of-run table: baseline vs best (confirmed), what changed, outcomes, pruning,
    the bottleneck, and what to do next."""
    m = results.mode(study)
    minimize = m == "time-to-accuracy"
    base, best = results.baseline(study), results.best(study)
    counts = results.outcome_counts(study)
    lines = [f"{study.study_name}: {sum(counts.values())} trials ("
             + ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])) + ")"]
    if base is None or not TrialRecord.of(base).ok:
        lines.append("  no successful baseline trial yet")
        return "\n".join(lines)
    b = TrialRecord.of(base)
    metric = "to target" if minimize else ("job samples/s" if b.effective_samples_per_second is not None
                                           else "samples/s")
    lines += ["", f"  {'':<9} {'trial':<6} {metric:>11} {'val_accuracy':>13} {'speedup':>8}   (the search's trials)",
              _row("baseline", base, base, minimize)]
    confirmed = results.confirmation(study)
    if best is not None:
        lines.append(_row("best", best, base, minimize))
        if m == "pareto":
            front = results.front(study)
            lines.append(f"  pareto front: {len(front)} trial(s): "
                         + ", ".join(f"#{t.number} ({rate(results.rate(t))}, {results.accuracy(t):.3f})"
                                     for t in front))
            for pick in results.PICKS:
                chosen = results.pick_from_front(front, pick)
                lines.append(f"    {pick:<17} #{chosen.number}" if chosen else f"    {pick}: -")
        w = TrialRecord.of(best)
        lines += ["", "  best knobs: " + changed_knobs(w.applied_knobs, b.knob_values)]
        floor = w.accuracy_floor
        if floor is not None:
            runs = len(b.baseline_accuracies or [0])
            how = (f"the baseline's mean over {runs} seeds minus max_accuracy_drop minus their spread" if runs > 1
                   else "baseline minus max_accuracy_drop")
            lines.append(f"  accuracy guard: val_accuracy >= {floor:.3f} ({how})")
        if w.effective_samples_per_second is not None:
            lines.append(f"  job amortisation: {rate(w.samples_per_second)} samples/s steady, "
                         f"{rate(w.effective_samples_per_second)} over the planned job "
                         f"(warm-up {w.warmup_seconds or 0:.1f} s paid once)")
    if confirmed and confirmed.get("winner") is not None:
        lines.append(_confirmed_line(confirmed))
    elif confirmed:
        lines.append("  confirmed: no candidate held up in the confirmation runs; the search's best is shown")
    records = [TrialRecord.of(t) for t in results.finished(study)]
    pruned = [r for r in records if r.outcome == "pruned"]
    if pruned:
        saved = sum(r.time_saved_seconds or 0 for r in pruned)
        lines.append(f"  pruning: {len(pruned)} trial(s) stopped early, saving about {saved:.0f} s")
    for attr, label, what in BURST_ADVICE:
        flagged = [getattr(r, attr) for r in records if getattr(r, attr)]
        if flagged:
            suggested = max(f["suggested_train_samples"] for f in flagged)
            lines.append(f"  {label}: {len(flagged)} trial(s) {what}; train_samples = {suggested} would fix it "
                         f"(a new study: --name)")
    noisy = [r for r in records if r.noisy]
    kept = StudyRecord.of(study)
    if noisy:
        lines.append(f"  noise: {len(noisy)} trial(s) had window rates varying more than "
                     f"{100 * kept.section('confirm').get('noise_cv', 0.05):.0f}%")
    scaled = kept.scaling
    if scaled and best is not None and scaled.get("winner_trial") == best.number:
        members = scaled.get("members", "ranks")
        lines.append(scaling_line("scaling baseline", scaled["baseline"], scaled["nproc"], members))
        lines.append(scaling_line("scaling winner  ", scaled["winner"], scaled["nproc"], members))
    diagnosis = kept.diagnosis
    if diagnosis and best is not None and diagnosis.get("winner_trial") == best.number:
        lines.append(diagnosis_line("baseline", diagnosis["baseline"], b.samples_per_second))
        lines.append(diagnosis_line("winner  ", diagnosis["winner"], TrialRecord.of(best).samples_per_second))
    storage_arg = "" if url == DEFAULT_URL else f" --storage '{redact(url)}'"
    lines += [
        "",
        f"  watch it:   knobtune dashboard{storage_arg}    (then open http://127.0.0.1:8080)",
        f"  export it:  knobtune export {study.study_name}{storage_arg} -o best.json",
    ]
    return "\n".join(lines)
