"""Human-readable lines about a study: one per trial during a run, the table at the end."""
from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial

from search import results
from search.progress import rate
from search.storage import DEFAULT_URL, redact


def changed_knobs(values: dict[str, Any], reference: dict[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in values.items() if reference.get(k) != v]
    return " ".join(parts) if parts else "(baseline settings)"


def trial_line(number: int, attrs: dict[str, Any], best: tuple[float, int] | None,
               baseline_knobs: dict[str, Any] | None) -> str:
    """``trial #3   ok   9,141 samples/s  acc 0.956  cv 5%  11.2 s  | best 9,141 (#2)`` + changed knobs."""
    outcome = attrs.get("outcome", "?")
    source = attrs.get("source")
    tag = f" [{source}]" if source in ("baseline", "advice", "explore") else ""
    head = f"trial #{number:<3} {outcome:<7}"
    if outcome == "ok":
        text = (f"{head} {rate(attrs.get('samples_per_second')):>9} samples/s  "
                f"acc {attrs.get('val_accuracy', 0):.3f}  cv {100 * attrs.get('samples_per_second_cv', 0):>2.0f}%  "
                f"{attrs.get('trial_seconds', 0):>5.1f} s")
        if attrs.get("feasible") is False:
            text += f"  below accuracy guard ({attrs.get('accuracy_floor', 0):.3f})"
    else:
        failure = (attrs.get("failure") or "").splitlines()
        text = f"{head} {failure[0] if failure else ''}  ({attrs.get('trial_seconds', 0):.1f} s)"
    if best:
        text += f"  | best {rate(best[0])} (#{best[1]})"
    knobs = {k: v["value"] for k, v in attrs.get("knobs", {}).items() if v.get("applied")}
    detail = [tag.strip()] if tag else []
    if baseline_knobs is not None and not attrs.get("is_baseline"):
        detail.append(changed_knobs(knobs, baseline_knobs))
    if detail:
        text += "\n" + " " * 11 + " ".join(detail)
    return text


def _row(label: str, trial: FrozenTrial, base_sps: float | None) -> str:
    sps = trial.user_attrs.get("samples_per_second")
    speed = f"{sps / base_sps:.2f}x" if sps and base_sps else "-"
    return (f"  {label:<9} #{trial.number:<5} {rate(sps):>11} {trial.user_attrs.get('val_accuracy', float('nan')):>13.3f}"
            f" {speed:>8}")


def study_summary(study: optuna.Study, url: str) -> str:
    """The end-of-run table: baseline vs best, what changed, outcomes, and what to do next."""
    base, best = results.baseline(study), results.best(study)
    counts = results.outcome_counts(study)
    lines = [f"{study.study_name}: {sum(counts.values())} trials ("
             + ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])) + ")"]
    if base is None or base.user_attrs.get("outcome") != "ok":
        lines.append("  no successful baseline trial yet")
        return "\n".join(lines)
    base_sps = base.user_attrs["samples_per_second"]
    lines += ["", f"  {'':<9} {'trial':<6} {'samples/s':>11} {'val_accuracy':>13} {'speedup':>8}",
              _row("baseline", base, base_sps)]
    if best is not None:
        lines.append(_row("best", best, base_sps))
        lines.append("")
        lines.append("  best knobs: " + changed_knobs(
            {k: v for k, v in results.knob_values(best).items() if best.user_attrs["knobs"][k].get("applied")},
            results.knob_values(base)))
        floor = best.user_attrs.get("accuracy_floor")
        if floor is not None:
            lines.append(f"  accuracy guard: val_accuracy >= {floor:.3f} (baseline minus max_accuracy_drop)")
    storage_arg = "" if url == DEFAULT_URL else f" --storage '{redact(url)}'"
    lines += [
        "",
        f"  watch it:   knobtune dashboard{storage_arg}    (then open http://127.0.0.1:8080)",
        f"  export it:  knobtune export {study.study_name}{storage_arg} -o best.json",
    ]
    return "\n".join(lines)
