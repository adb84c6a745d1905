"""What a study found, told from the storage alone: the study's story (the verdict, baseline
against the confirmed winner, what made the difference, the accuracy guard, the diagnosis,
the outcomes, the export command) and a note per trial that needs one (the baseline, the
winner, every trial that did not end ``ok``).

Both are lists of blocks, rendered as Markdown for optuna-dashboard's notes and as HTML for
``knobtune report``, so the dashboard and the report say the same thing.
"""
from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any, Union

import optuna
from optuna.trial import FrozenTrial, TrialState

from knobtune.search.storage.database import DEFAULT_URL, redact
from knobtune.search.storage.record import StudyRecord, TrialRecord
from knobtune.search.story import results
from knobtune.search.story.progress import rate

# ("h", text) | ("p", text) | ("ul", [text, ...]) | ("table", [header, ...], [[cell, ...], ...]) | ("code", text)
# Text may hold **bold** and `code` spans; nothing else is markup.
Block = Union[tuple[str, str], tuple[str, list[str]], tuple[str, list[str], list[list[str]]]]

ROLE_BASELINE = "baseline"
ROLE_WINNER = "confirmed winner"
ROLE_SEARCHED = "searched best"


def metric_names(mode: str) -> list[str]:
    """The study's objectives as optuna-dashboard names them (``study.set_metric_names``)."""
    return {"pareto": ["samples/s", "val_accuracy"], "time-to-accuracy": ["seconds to target"]}.get(
        mode, ["samples/s"])


def _acc(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _figure(trial: FrozenTrial, minimize: bool) -> str:
    if minimize:
        return f"{trial.value:.2f} s" if trial.value is not None else "-"
    return rate(results.rate(trial))


def _speedup(trial: FrozenTrial, base: FrozenTrial, minimize: bool) -> str:
    value = results.search_speedup(trial, base, minimize)
    return f"{value:.2f}x" if value else "-"


def _storage_arg(url: str) -> str:
    return "" if url == DEFAULT_URL else f" --storage '{redact(url)}'"


def optuna_best(study: optuna.Study) -> FrozenTrial | None:
    """The trial optuna-dashboard badges "Best Trial" (single-objective studies): the single best
    measurement, with no confirmation behind it."""
    if len(study.directions) != 1:
        return None
    try:
        return study.best_trial
    except ValueError:  # no complete (feasible) trial yet
        return None


def roles(study: optuna.Study) -> dict[int, str]:
    """Trial number -> its role: the baseline, the confirmed winner (or the searched best while
    no confirmation covers the trials)."""
    out: dict[int, str] = {}
    base = results.baseline(study)
    if base is not None:
        out[base.number] = ROLE_BASELINE
    confirmed = results.confirmation(study)
    winner = results.best(study)
    if winner is not None and winner.number not in out:
        out[winner.number] = ROLE_WINNER if confirmed and confirmed.get("winner") == winner.number else ROLE_SEARCHED
    return out


def _changed(winner: FrozenTrial, base: FrozenTrial) -> list[str]:
    before = results.knob_values(base)
    return [f"`{name}`: {before.get(name)!r} -> **{value!r}**"
            for name, value in TrialRecord.of(winner).applied_knobs.items() if before.get(name) != value]


def _verdict(study: optuna.Study, base: FrozenTrial, best: FrozenTrial | None, minimize: bool) -> str:
    confirmed = results.confirmation(study)
    if confirmed and confirmed.get("winner") is not None:
        rounds = confirmed.get("repeats")
        if confirmed["winner"] == confirmed["baseline"]:
            runner = confirmed.get("runner_up")
            closest = (f" The closest candidate, trial #{runner['trial']}, ran at {runner['speedup']:.2f}x."
                       if runner and runner.get("speedup") else "")
            out = [f" {line}" for line in disqualified(confirmed)]
            return (f"**No configuration beat your current settings** side by side over {rounds} interleaved "
                    f"rounds (a candidate must keep the accuracy and be {confirmed.get('min_speedup', 0.03):.0%} "
                    f"faster in the median of the paired rounds and faster in most of them), so the baseline, "
                    f"trial #{base.number}, is kept.{closest}{''.join(out)}")
        figure = results.speedup(study, best) if best is not None and best.number == confirmed["winner"] else None
        spread = (f" (range {figure.range[0]:.2f}x-{figure.range[1]:.2f}x over {rounds} interleaved rounds)"
                  if figure and figure.range else "")
        speedup = f"**{figure.value:.2f}x**" if figure and figure.rounds else "(no paired rounds)"
        return (f"**Confirmed winner: trial #{confirmed['winner']}**, {speedup} the baseline "
                f"(trial #{base.number}){spread}.")
    if confirmed:
        return "No candidate held up in the confirmation rounds; the search's best is shown."
    if best is None:
        return f"No trial has passed the guards yet; the baseline is trial #{base.number}."
    if best.number == base.number:
        return (f"Best so far: **the baseline** (trial #{base.number}): no other trial measured faster within the "
                f"accuracy guard.")
    return (f"Best so far: **trial #{best.number}**, {_speedup(best, base, minimize)} the baseline "
            f"(trial #{base.number}), one search trial each; not confirmed side by side yet (knobtune confirms the top candidates against "
            f"the baseline when the search reaches its trial count, unless run with --no-confirm).")


def disqualified(confirmed: dict[str, Any]) -> list[str]:
    """Why candidates of the confirmation were out of the running before their speed counted:
    their mean accuracy over the rounds' seeds under the final guard, or rounds that failed."""
    out = []
    floor = confirmed.get("accuracy_floor")
    for number, median in (confirmed.get("medians") or {}).items():
        if median is not None or number == str(confirmed.get("baseline")):
            continue
        accuracy = (confirmed.get("mean_accuracies") or {}).get(number)
        if accuracy is not None and floor is not None and accuracy < floor:
            out.append(f"Trial #{number} was out: its mean val_accuracy over the rounds' seeds, {accuracy:.3f}, is "
                       f"under the final guard {floor:.3f}.")
        else:
            outcomes = sorted({e.get("outcome", "?") for e in (confirmed.get("runs") or {}).get(number, [])} - {"ok"})
            out.append(f"Trial #{number} was out: its rounds did not succeed ({', '.join(outcomes) or 'no value'}).")
    return out


def _badge_sentence(study: optuna.Study, winner: FrozenTrial | None) -> str | None:
    """Why optuna-dashboard's "Best Trial" is not the trial knobtune confirmed and exports."""
    badge = optuna_best(study)
    confirmed = results.confirmation(study)
    if badge is None or winner is None or badge.number == winner.number or not confirmed:
        return None
    key = str(badge.number)
    paired = (confirmed.get("paired") or {}).get(key)
    if badge.number == confirmed.get("baseline"):
        held = (f" side by side trial #{winner.number} beat it"
                + (f" ({confirmed['speedup']:.2f}x over the rounds)" if confirmed.get("speedup") else ""))
    elif paired and paired.get("speedup"):
        held = f" side by side it ran at {paired['speedup']:.2f}x the baseline"
    elif key in (confirmed.get("runs") or {}):
        accuracy = (confirmed.get("mean_accuracies") or {}).get(key)
        floor = confirmed.get("accuracy_floor")
        held = (f" over the confirmation rounds' seeds its mean val_accuracy {accuracy:.3f} fell under the final "
                f"guard {floor:.3f}" if accuracy is not None and floor is not None and accuracy < floor
                else " its confirmation rounds did not succeed")
    else:
        held = " it was not among the candidates confirmed side by side"
    cv = TrialRecord.of(badge).samples_per_second_cv
    noise = f" (its windows varied by {cv:.0%})" if cv else ""
    best_word = "lowest time" if results.mode(study) == "time-to-accuracy" else "highest"
    return (f"optuna-dashboard's \"Best Trial\" badge marks trial #{badge.number}: its single measurement was the "
            f"{best_word}{noise}, but{held}. Identical configurations vary from minute to minute on a shared machine, "
            f"so knobtune trusts the interleaved rounds: the winner, and what `knobtune export` writes, is "
            f"trial #{winner.number}.")


def _outcomes(study: optuna.Study) -> list[str]:
    counts = results.outcome_counts(study)
    items = [f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    failed = study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    records = [TrialRecord.of(t) for t in failed]
    skipped = [r for r in records if r.duplicate_of is not None]
    interrupted = [r for r in records if r.duplicate_of is None]
    requeued = [r for r in interrupted if "queued again" in (r.failure or "")]
    if skipped:
        items.append(f"{len(skipped)} duplicate proposal(s) skipped: the sampler proposed knobs already measured; "
                     f"they were neither measured again nor counted (Optuna shows them as Fail: it has no "
                     f"\"skipped\" state; they are not failures)")
    if interrupted:
        again = f", {len(requeued)} of them queued again and re-run by another worker" if requeued else ""
        items.append(f"{len(interrupted)} trial(s) interrupted (Ctrl-C, a run that stopped, or a worker that went "
                     f"silent){again}: not counted")
    done = [TrialRecord.of(t) for t in results.finished(study)]
    pruned = [r for r in done if r.outcome == "pruned"]
    if pruned:
        saved = sum(r.time_saved_seconds or 0 for r in pruned)
        items.append(f"pruning stopped {len(pruned)} trial(s) early, saving about {saved:.0f} s")
    noisy = [r for r in done if r.noisy]
    if noisy:
        items.append(f"{len(noisy)} trial(s) were noisy (window rates varying more than "
                     f"{StudyRecord.of(study).section('confirm').get('noise_cv', 0.05):.0%})")
    return items


def diagnosis_items(study: optuna.Study, base: FrozenTrial, winner: FrozenTrial | None) -> list[str]:
    """The bottleneck of the baseline and the winner, both ceilings, and how close each gets."""
    diagnosis = StudyRecord.of(study).diagnosis
    if not diagnosis or winner is None or diagnosis.get("winner_trial") != winner.number:
        return []
    out = []
    pairs = [("baseline", "baseline", base)] + ([("winner", "winner", winner)] if winner.number != base.number else [])
    for label, key, trial in pairs:
        entry = diagnosis.get(key) or {}
        if "error" in entry:
            out.append(f"{label}: the diagnosis failed ({entry['error']})")
            continue
        if "bottleneck" not in entry:
            continue
        limit = entry["bottleneck"]
        sps = TrialRecord.of(trial).samples_per_second
        close = f"; it runs at **{sps / entry[limit]:.0%}** of its {limit} ceiling" if sps and entry[limit] else ""
        out.append(f"{label} (trial #{trial.number}): bottleneck **{limit}** (input ceiling "
                   f"{rate(entry['input'])} samples/s, compute ceiling {rate(entry['compute'])}){close}")
    return out


def study_story(study: optuna.Study, url: str, stage: str | None = None) -> list[Block]:
    """The study's story, from the storage alone. ``stage`` says when it was written ("after
    trial #7", "after confirmation"): the note is kept current as the run goes on."""
    kept = StudyRecord.of(study)
    section = kept.section("study")
    m = results.mode(study)
    minimize = m == "time-to-accuracy"
    job = section.get("workload") or (Path(section["script"]).name if section.get("script") else "?")
    blocks: list[Block] = [("h", f"{study.study_name}: {section.get('framework', '?')}, {job}, objective {m}")]
    base, best = results.baseline(study), results.best(study)
    if base is None or not TrialRecord.of(base).ok:
        blocks.append(("p", "No successful baseline trial yet: every trial is judged against it."))
        blocks.append(("ul", _outcomes(study)))
        return blocks
    blocks.append(("p", _verdict(study, base, best, minimize)))
    b = TrialRecord.of(base)
    metric = "seconds to target" if minimize else ("job samples/s" if b.effective_samples_per_second is not None
                                                   else "samples/s")
    rows = [["baseline", f"#{base.number}", _figure(base, minimize), _acc(b.val_accuracy), "1.00x"]]
    role = roles(study)
    if best is not None and best.number != base.number:
        rows.append([role.get(best.number, ROLE_SEARCHED), f"#{best.number}", _figure(best, minimize),
                     _acc(results.accuracy(best)), _speedup(best, base, minimize)])
    badge = optuna_best(study)
    if badge is not None and badge.number not in (base.number, best.number if best else None):
        rows.append(["Optuna's \"Best Trial\"", f"#{badge.number}", _figure(badge, minimize),
                     _acc(results.accuracy(badge)), _speedup(badge, base, minimize)])
    blocks.append(("table", ["", "trial", metric, "val_accuracy", "speedup (one search trial each)"], rows))
    if best is not None and best.number != base.number:
        changed = _changed(best, base)
        blocks += [("h", "What made the difference"),
                   ("ul", changed or ["the same knobs as the baseline"])]
    sentence = _badge_sentence(study, best)
    if sentence:
        blocks.append(("p", sentence))
    guard = []
    floor = TrialRecord.of(best or base).accuracy_floor
    if floor is not None:
        runs = len(b.baseline_accuracies or [0])
        how = (f"the baseline's mean over {runs} seeds minus max_accuracy_drop minus their spread" if runs > 1
               else "the baseline minus max_accuracy_drop")
        guard.append(f"during the search: val_accuracy >= {floor:.3f} ({how})")
    confirmed = results.confirmation(study)
    if confirmed and best is not None:
        accuracy = (confirmed.get("mean_accuracies") or {}).get(str(best.number))
        if accuracy is not None and confirmed.get("accuracy_floor") is not None and best.number != base.number:
            guard.append(f"final: the winner's mean val_accuracy over the rounds' seeds {accuracy:.3f} >= "
                         f"{confirmed['accuracy_floor']:.3f} (the mean of "
                         f"{len(confirmed.get('baseline_accuracies', []))} baseline runs minus max_accuracy_drop)")
    if kept.section("guard").get("accuracy") is False:
        guard.append("off ([guard] accuracy = false): throughput alone")
    if guard:
        blocks += [("h", "Accuracy guard"), ("ul", guard)]
    diagnosis = diagnosis_items(study, base, best)
    if diagnosis:
        blocks += [("h", "Bottleneck diagnosis"), ("ul", diagnosis)]
    blocks += [("h", "Trials"), ("ul", _outcomes(study))]
    arg = _storage_arg(url)
    blocks += [("h", "Next"),
               ("code", f"knobtune export {study.study_name}{arg} -o best.json\n"
                        f"knobtune report {study.study_name}{arg} -o report.html")]
    if stage:
        blocks.append(("p", f"Written by knobtune {stage}."))
    return blocks


def trial_story(study: optuna.Study, trial: FrozenTrial, url: str) -> list[Block] | None:
    """The note of a trial that needs one: the baseline, the winner, and every trial that did
    not end ``ok`` (the outcome, the reason, the output's tail); None for the rest."""
    rec = TrialRecord.of(trial)
    role = roles(study).get(trial.number)
    twin = rec.duplicate_of
    if trial.state == TrialState.FAIL and twin is not None:
        return [("h", f"Trial #{trial.number}: skipped (a duplicate proposal, not a failure)"),
                ("p", f"The sampler proposed the same knobs as trial #{twin}, which was measured (or being "
                      f"measured) already. knobtune did not measure them again and did not count this trial; the "
                      f"search went on with a configuration not yet measured. Optuna has no \"skipped\" state, "
                      f"so it lists this trial as Fail.")]
    if trial.state == TrialState.FAIL:
        return [("h", f"Trial #{trial.number}: interrupted"),
                ("p", f"{rec.failure or 'The run stopped while this trial was running.'} It was not "
                      f"counted, and its measurement, if any, was not kept; the sampler may propose its "
                      f"configuration again.")]
    outcome = rec.outcome
    if outcome == "ok" and role is None:
        return None
    blocks: list[Block] = []
    base = results.baseline(study)
    minimize = results.mode(study) == "time-to-accuracy"
    if role == ROLE_BASELINE:
        blocks += [("h", f"Trial #{trial.number}: the baseline (your current settings)"),
                   ("p", "Every other trial is judged against it: its speed for the speedup, its accuracy for "
                         "the guard.")]
        confirmed = results.confirmation(study)
        if confirmed and confirmed.get("winner") == trial.number:
            blocks.append(("p", "**Kept**: no configuration beat it side by side in the confirmation rounds, so "
                                "`knobtune export` writes it (`baseline_won`)."))
    elif role in (ROLE_WINNER, ROLE_SEARCHED):
        confirmed = results.confirmation(study)
        title = "the confirmed winner" if role == ROLE_WINNER else "the best so far (not confirmed yet)"
        blocks.append(("h", f"Trial #{trial.number}: {title}"))
        figure = results.speedup(study, trial)
        if role == ROLE_WINNER and figure is not None and figure.rounds:
            spread = f" (range {figure.range[0]:.2f}x-{figure.range[1]:.2f}x)" if figure.range else ""
            blocks.append(("p", f"{figure.value:.2f}x the baseline, the {figure.label}{spread}. This is what "
                                f"`knobtune export` writes."))
        if base is not None and base.number != trial.number:
            blocks.append(("ul", _changed(trial, base) or ["the same knobs as the baseline"]))
    if outcome == "ok":
        blocks.append(("p", f"{_figure(trial, minimize)}{'' if minimize else ' samples/s'}, val_accuracy "
                            f"{_acc(rec.val_accuracy)}."))
        if rec.feasible is False:
            why = results.infeasible_why(rec)
            blocks.append(("p", f"{why[0].upper()}{why[1:]}: not a candidate."))
        return blocks
    failure = (rec.failure or "").strip()
    first, _, rest = failure.partition("\n")
    blocks += [("h", f"Trial #{trial.number}: {outcome or 'no result'}"),
               ("p", f"**{OUTCOME_MEANING.get(outcome or '', 'no result')}**: {first or 'no reason recorded'}")]
    if rest.strip():
        blocks.append(("code", rest.strip()))
    if rec.output_tail:
        blocks += [("p", "Its output ended with (the whole of it is the trial's `output.log` artifact):"),
                   ("code", rec.output_tail)]
    return blocks


OUTCOME_MEANING = {
    "pruned": "stopped early, too slow to win",
    "nan": "the loss became non-finite",
    "oom": "out of memory",
    "timeout": "no result within the trial's timeout",
    "crash": "the trial's process failed",
    "invalid": "this configuration cannot run here",
    "error": "the training job itself failed",
}


# ----------------------------------------------------------------------------- rendering

def _md_inline(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(blocks: list[Block]) -> str:
    """The blocks as Markdown (optuna-dashboard's notes)."""
    out: list[str] = []
    for block in blocks:
        kind = block[0]
        if kind == "h":
            out.append(f"{'#' if not out else '###'} {block[1]}")
        elif kind == "p":
            out.append(str(block[1]))
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in block[1]))
        elif kind == "table":
            header, rows = block[1], block[2]  # type: ignore[misc]
            lines = ["| " + " | ".join(_md_inline(h) for h in header) + " |",
                     "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(_md_inline(c) for c in row) + " |" for row in rows]
            out.append("\n".join(lines))
        elif kind == "code":
            out.append(f"```\n{block[1]}\n```")
    return "\n\n".join(out) + "\n"


_SPANS = re.compile(r"\*\*(.+?)\*\*|`([^`]+)`")


def _html_inline(text: str) -> str:
    out, last = [], 0
    for match in _SPANS.finditer(text):
        out.append(html.escape(text[last:match.start()]))
        bold, code = match.groups()
        out.append(f"<strong>{html.escape(bold)}</strong>" if bold is not None else f"<code>{html.escape(code)}</code>")
        last = match.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


def to_html(blocks: list[Block], level: int = 2) -> str:
    """The blocks as an HTML fragment (``knobtune report``); the first heading at ``level``."""
    out: list[str] = []
    for i, block in enumerate(blocks):
        kind = block[0]
        if kind == "h":
            h = level if i == 0 else level + 1
            out.append(f"<h{h}>{_html_inline(str(block[1]))}</h{h}>")
        elif kind == "p":
            out.append(f"<p>{_html_inline(str(block[1]))}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_html_inline(item)}</li>" for item in block[1]) + "</ul>")
        elif kind == "table":
            header, rows = block[1], block[2]  # type: ignore[misc]
            head = "".join(f"<th>{_html_inline(h)}</th>" for h in header)
            body = "".join("<tr>" + "".join(f"<td>{_html_inline(c)}</td>" for c in row) + "</tr>" for row in rows)
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif kind == "code":
            out.append(f"<pre>{html.escape(str(block[1]))}</pre>")
    return "\n".join(out)


def as_dict(blocks: list[Block]) -> list[Any]:
    """The blocks as JSON-ready lists (tests and other renderers)."""
    return [list(b) for b in blocks]
