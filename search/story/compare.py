"""``knobtune compare``: two studies of one workload side by side, typically one per framework."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from knobtune.search.errors import UserError
from knobtune.search.storage.record import StudyRecord, TrialRecord
from knobtune.search.story import results
from knobtune.search.story.progress import rate

MACHINE_KEYS = ("cpu_model", "usable_cores", "memory_mb", "gpus")


@dataclass
class Side:
    """What one study contributes to the comparison."""

    study: optuna.Study
    framework: str
    workload: str
    baseline: FrozenTrial
    best: FrozenTrial

    @property
    def confirmed(self) -> dict[str, Any] | None:
        """The study's confirmation of this winner against its baseline (interleaved rounds), if any."""
        found = results.confirmation(self.study)
        if not found or found.get("winner") != self.best.number or found.get("minimize"):
            return None
        medians = found.get("medians") or {}
        return found if str(self.best.number) in medians and str(found.get("baseline")) in medians else None

    @property
    def figures(self) -> str:
        c = self.confirmed
        return f"median of {c['repeats']} rounds" if c else "one trial"

    @property
    def base_sps(self) -> float:
        c = self.confirmed
        return float(c["medians"][str(c["baseline"])]) if c else TrialRecord.of(self.baseline).samples_per_second

    @property
    def best_sps(self) -> float:
        c = self.confirmed
        return float(c["medians"][str(self.best.number)]) if c else TrialRecord.of(self.best).samples_per_second

    @property
    def speedup(self) -> results.Speedup:
        """The study's own speedup figure for its winner (results.speedup: what every presenter shows)."""
        found = results.speedup(self.study, self.best)
        return found if found is not None else results.Speedup(self.best_sps / self.base_sps)


def _side(study: optuna.Study) -> Side:
    definition = StudyRecord.of(study).definition
    if not definition:
        raise UserError(f"study {study.study_name!r} was not made by knobtune")
    base, best = results.baseline(study), results.best(study)
    if base is None or not TrialRecord.of(base).ok or best is None:
        raise UserError(f"study {study.study_name!r} has no successful baseline and feasible best yet; run it first")
    return Side(study, definition["study"]["framework"], job(definition), base, best)


def _machine(study: optuna.Study) -> dict[str, Any]:
    fingerprint = StudyRecord.of(study).fingerprint
    machine = {k: fingerprint.get(k) for k in MACHINE_KEYS}
    machine["gpus"] = [g.get("name") for g in machine.get("gpus") or []]
    return machine


def job(definition: dict[str, Any]) -> str:
    """What a stored study definition trains: its workload, or its script and arguments."""
    study = definition.get("study", {})
    if study.get("script"):
        return " ".join(["script", study["script"], *study.get("args", [])])
    return study.get("workload", "")


def check_comparable(a: optuna.Study, b: optuna.Study, force: bool) -> list[str]:
    """Refuse (UserError) studies of different workloads or machines unless ``force``; return notes."""
    sa, sb = StudyRecord.of(a).definition, StudyRecord.of(b).definition
    wa, wb = job(sa), job(sb)
    problems = []
    if wa != wb:
        problems.append(f"{a.study_name!r} trains {wa!r} but {b.study_name!r} trains {wb!r}")
    ma, mb = _machine(a), _machine(b)
    diffs = [f"{k}: {ma[k]!r} vs {mb[k]!r}" for k in MACHINE_KEYS if ma[k] != mb[k]]
    if diffs:
        problems.append("they ran on different hardware (" + "; ".join(diffs) + ")")
    if problems and not force:
        raise UserError("; ".join(problems) + ": the comparison would not be like for like (--force compares anyway)")
    notes = [f"note: {p} (compared anyway, --force)" for p in problems]
    ba, bb = sa.get("burst", {}), sb.get("burst", {})
    if {k: v for k, v in ba.items() if k != "timeout_s"} != {k: v for k, v in bb.items() if k != "timeout_s"}:
        notes.append(f"note: their [burst] settings differ ({ba} vs {bb}); accuracies are not strictly comparable")
    return notes


def knob_effects(side: Side) -> list[tuple[str, Any, Any, float | None]]:
    """For each knob the winner changed from the baseline: (knob, from, to, effect), where the effect
    is the median samples/s of the study's ok trials with the winner's value over those with the
    baseline's value (None when one side has no trial). Largest effect first."""
    base_knobs, best_knobs = results.knob_values(side.baseline), results.knob_values(side.best)
    applied = TrialRecord.of(side.best).applied_knobs
    ok = [r for r in map(TrialRecord.of, results.finished(side.study)) if r.ok]
    effects = []
    for knob in sorted(applied):
        old, new = base_knobs.get(knob), best_knobs.get(knob)
        if old == new:
            continue
        with_new = [r.samples_per_second for r in ok if r.knob_values.get(knob) == new]
        with_old = [r.samples_per_second for r in ok if r.knob_values.get(knob) == old]
        effect = statistics.median(with_new) / statistics.median(with_old) if with_new and with_old else None
        effects.append((knob, old, new, effect))
    return sorted(effects, key=lambda e: -(e[3] or 0))


def _effects_text(side: Side, top: int = 3) -> str:
    parts = []
    for knob, old, new, effect in knob_effects(side)[:top]:
        if effect is None:
            measured = ""
        elif effect >= 1.02:
            measured = f" (trials with it ran {effect:.2f}x faster)"
        else:
            measured = f" (no gain on its own: {effect:.2f}x)"
        parts.append(f"{knob} {old}->{new}{measured}")
    return "; ".join(parts) if parts else "no knob changed from the baseline"


def precision(trial: FrozenTrial) -> str:
    """The arithmetic a trial trained in: mixed precision, or fp32 with IEEE or TF32 matmuls."""
    rec = TrialRecord.of(trial)

    def value(name: str) -> Any:
        return rec.applied_knobs.get(name)

    amp, policy = value("amp"), value("mixed_precision")
    if amp and amp != "off":
        return f"{amp} autocast"
    if policy and policy != "float32":
        return policy.replace("mixed_", "") + " mixed precision"
    matmul, tf32 = value("matmul_precision"), value("tf32")
    convs = (rec.applied or {}).get("cudnn_allow_tf32")  # PyTorch: cuDNN's own flag
    conv_note = "" if convs is None else (", TF32 convolutions" if convs else ", IEEE convolutions")
    if matmul in ("high", "medium") or tf32 is True:
        return "fp32, TF32 matmuls" + ("" if tf32 is True else conv_note)
    if matmul == "highest" or tf32 is False:
        return "fp32, IEEE matmuls" + ("" if tf32 is False else conv_note)
    return "fp32"


def _acc(trial: FrozenTrial) -> str:
    value = TrialRecord.of(trial).val_accuracy
    return "-" if value is None else f"{value:.3f}"


def rows(a: Side, b: Side) -> list[tuple[str, str, str]]:
    """The comparison's rows (label, a, b): ``knobtune compare``'s table and the report's."""
    return [
        ("framework", a.framework, b.framework),
        ("study", a.study.study_name, b.study.study_name),
        ("samples/s figures", a.figures, b.figures),
        ("baseline samples/s", rate(a.base_sps), rate(b.base_sps)),
        ("baseline val_accuracy", _acc(a.baseline), _acc(b.baseline)),
        ("best samples/s", rate(a.best_sps), rate(b.best_sps)),
        ("best val_accuracy", _acc(a.best), _acc(b.best)),
        ("baseline precision", precision(a.baseline), precision(b.baseline)),
        ("best precision", precision(a.best), precision(b.best)),
        ("best warm-up s", *(f"{TrialRecord.of(s.best).warmup_seconds or 0:.1f}" for s in (a, b))),  # type: ignore[list-item]
        ("speedup over own baseline", f"{a.speedup.value:.2f}x", f"{b.speedup.value:.2f}x"),
        ("speedup figure", a.speedup.label, b.speedup.label),
        ("best trial", f"#{a.best.number}", f"#{b.best.number}"),
    ]


def table(a: Side, b: Side) -> str:
    rows_ = rows(a, b)
    width = max(len(r[0]) for r in rows_)
    col = max(12, *(len(str(r[1])) for r in rows_))
    lines = [f"  {label:<{width}}  {str(x):>{col}}  {str(y):>{col}}" for label, x, y in rows_]
    for side in (a, b):
        changed = [f"{k}={v}" for k, _, v, _ in knob_effects(side)]
        lines.append(f"  {side.framework} best knobs: {' '.join(changed) or '(the baseline settings)'}")
    return "\n".join(lines)


def verdict(a: Side, b: Side) -> str:
    """One plain-language paragraph: who is faster here, by how much, and what made the difference."""
    fast, slow = (a, b) if a.best_sps >= b.best_sps else (b, a)
    machine = _machine(a.study)
    where = (f"{', '.join(machine['gpus'])}" if machine["gpus"]
             else f"{machine['cpu_model']}, {machine['usable_cores']} usable cores, no GPU")
    same = fast.framework == slow.framework
    who = (f"{fast.study.study_name!r} is faster" if same else f"{fast.framework} trains {fast.workload} faster")
    text = (f"On this machine ({where}) {who}: tuned, {rate(fast.best_sps)} samples/s against "
            f"{rate(slow.best_sps)} ({fast.best_sps / slow.best_sps:.2f}x). ")
    base_fast, base_slow = (a, b) if a.base_sps >= b.base_sps else (b, a)
    text += (f"Out of the box {base_fast.framework if not same else repr(base_fast.study.study_name)} led by "
             f"{base_fast.base_sps / base_slow.base_sps:.2f}x ({rate(base_fast.base_sps)} vs {rate(base_slow.base_sps)}); "
             f"tuning gave {a.framework} {a.speedup.value:.2f}x and {b.framework} {b.speedup.value:.2f}x. ")
    if not (a.confirmed and b.confirmed):
        unconfirmed = " and ".join(repr(s.study.study_name) for s in (a, b) if not s.confirmed)
        text += (f"Caution: {unconfirmed} has no confirmation, so its figures are single trials measured minutes "
                 f"apart on a machine whose speed varies; run it without --no-confirm for medians of interleaved "
                 f"rounds before trusting a gap under about 20 %. ")
    else:
        text += ("Figures: each study's confirmed medians (interleaved rounds); the speedups are the median of "
                 "each round's paired ratio. ")
    text += f"What made the difference: {a.framework}: {_effects_text(a)}; {b.framework}: {_effects_text(b)}."
    pa, pb = precision(a.best), precision(b.best)
    text += f" Precision of the tuned runs: {a.framework} {pa}, {b.framework} {pb}"
    text += "." if pa == pb else " (not the same arithmetic: part of the gap may be precision, not the framework)."
    acc_a, acc_b = TrialRecord.of(a.best).val_accuracy, TrialRecord.of(b.best).val_accuracy
    acc_gap = acc_a - acc_b if acc_a is not None and acc_b is not None else 0.0
    if abs(acc_gap) >= 0.01:
        better = a if acc_gap > 0 else b
        text += (f" The {better.framework} winner is also {abs(acc_gap) * 100:.1f} points more accurate "
                 f"on the held-out split.")
    return text


def compare(a: optuna.Study, b: optuna.Study, force: bool = False) -> str:
    notes = check_comparable(a, b, force)
    sa, sb = _side(a), _side(b)
    return "\n".join([*notes, table(sa, sb), "", verdict(sa, sb)])
