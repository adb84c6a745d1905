"""``knobtune report``: one self-contained HTML file per study (or per pair of studies), from the
storage alone. It opens with no network: plotly.js is inlined once, every chart is a plotly figure.

The summary is the study's story (search/story/findings.py), the same text as the dashboard's study note;
the charts come from search/story/charts.py; the trials table is pandas (``trials_frame``), which
``--csv`` writes as it is.
"""
from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from knobtune import __version__
from knobtune.search.errors import UserError
from knobtune.search.storage.database import redact
from knobtune.search.storage.record import StudyRecord, TrialRecord
from knobtune.search.story import charts, findings, results
from knobtune.search.story.charts import Chart

# (compare._side: the same checks and figures as `knobtune compare`)
from knobtune.search.story.compare import Side, _side, check_comparable, job, knob_effects, verdict
from knobtune.search.story.compare import rows as compare_rows
from knobtune.search.story.progress import rate

# Measurements first in the table and the CSV, in this order (other attributes follow).
MEASUREMENTS = ("samples_per_second", "effective_samples_per_second", "samples_per_second_cv", "val_accuracy",
                "accuracy_floor", "accuracy_reached", "warmup_seconds", "trial_seconds", "effective_batch_size",
                "peak_memory_mb", "final_loss")
# What the HTML table shows besides the knobs that varied (the CSV has every column).
TABLE_COLUMNS = {"number": "#", "role": "role", "outcome": "outcome", "reason": "reason",
                 "samples_per_second": "samples/s", "val_accuracy": "val_accuracy",
                 "warmup_seconds": "warm-up s", "trial_seconds": "trial s"}


# ----------------------------------------------------------------------------- the trials

def outcome(study: optuna.Study, trial: FrozenTrial) -> tuple[str, str]:
    """A trial's outcome as the summary counts it, and the reason in one line ("" when ok)."""
    rec = TrialRecord.of(trial)
    if trial.state == TrialState.FAIL:
        if rec.duplicate_of is not None:
            return "skipped", f"duplicate proposal of trial #{rec.duplicate_of}: not measured again, not counted"
        return "interrupted", (rec.failure or "the run stopped while it ran").splitlines()[0]
    if not trial.state.is_finished():
        return trial.state.name.lower(), ""
    found = rec.outcome or "?"
    if found == "ok" and not results.is_feasible(trial):
        if results.mode(study) == "time-to-accuracy" and rec.accuracy_reached is not None:
            return "target not reached", f"accuracy reached {rec.accuracy_reached:.3f}"
        accuracy, floor = rec.val_accuracy, rec.accuracy_floor
        if accuracy is not None and floor is not None and accuracy < floor:
            return "below accuracy guard", f"val_accuracy {accuracy:.3f} < floor {floor:.3f}"
        if rec.memory_fraction is not None:
            return "over memory headroom", results.infeasible_why(rec)
        return "below accuracy guard", ""
    if found == "ok":
        cv = rec.samples_per_second_cv
        return "ok", (f"noisy: its windows varied by {cv:.0%}" if rec.noisy and cv else "")
    first = (rec.failure or "").strip().splitlines()
    return found, first[0] if first else findings.OUTCOME_MEANING.get(found, "no reason recorded")


def _cell(value: Any) -> Any:
    """A scalar for a DataFrame cell: lists and leftover dicts as JSON text."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def _flat(trial: FrozenTrial) -> dict[str, Any]:
    """A trial's user attributes as flat columns: ``knob_<name>`` for each knob's effective value,
    ``<attr>_<key>`` for the other dicts' entries, the rest as they are."""
    rec = TrialRecord.of(trial)
    out: dict[str, Any] = {}
    for key, value in rec.attrs().items():
        if key == "knobs":
            out.update({f"knob_{name}": _cell(entry.value) for name, entry in rec.knobs.items()})
            out["knobs_not_applied"] = ", ".join(sorted(n for n, e in rec.knobs.items() if not e.applied))
        elif isinstance(value, dict):
            out.update({f"{key}_{sub}": _cell(v) for sub, v in value.items()})
        else:
            out[key] = _cell(value)
    return out


def trials_frame(study: optuna.Study) -> Any:
    """Every trial as a pandas DataFrame: Optuna's ``trials_dataframe()`` (number, values, times,
    params_*, state) with the user attributes flattened into columns (measurements, ``knob_*``),
    the trial's role, outcome and reason, and each constraint as ``constraint_<name>``."""
    import pandas as pd

    frame = study.trials_dataframe(attrs=("number", "value", "datetime_start", "datetime_complete", "duration",
                                          "params", "state"))
    if frame.empty:
        return frame
    roles = findings.roles(study)
    rows = []
    for trial in study.get_trials(deepcopy=False):
        what, why = outcome(study, trial)
        row = _flat(trial)  # its recorded "outcome" and "role" give way to the ones the summary uses
        row.update({"number": trial.number, "role": roles.get(trial.number, ""), "outcome": what, "reason": why})
        row.update({f"constraint_{k}": v for k, v in trial.constraints.items()})
        rows.append(row)
    extra = pd.DataFrame(rows).convert_dtypes()  # nullable dtypes: a batch size stays 32, not 32.0, beside gaps
    first = ["role", "outcome", "reason", *[c for c in MEASUREMENTS if c in extra.columns]]
    knobs = sorted(c for c in extra.columns if c.startswith("knob_"))
    rest = sorted(c for c in extra.columns if c not in ("number", *first, *knobs))
    extra = extra[["number", *first, *knobs, *rest]]
    merged = frame.merge(extra, on="number", how="left")
    lead = [c for c in frame.columns if c in ("number", "state") or c.startswith("value")]
    order = [*lead, *first, *knobs, *[c for c in frame.columns if c not in lead], *rest]
    return merged[order]


def _varied_knobs(frame: Any) -> list[str]:
    return [c for c in frame.columns if c.startswith("knob_") and frame[c].astype(str).nunique() > 1]


def _missing(value: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def trials_table(frame: Any) -> str:
    """The HTML table of every trial: outcome and reason, the main measurements, the knobs that varied."""
    if frame.empty:
        return "<p>No trials.</p>"
    columns = [c for c in TABLE_COLUMNS if c in frame.columns]
    if "state" in frame.columns:
        columns.insert(1, "state")
    knobs = _varied_knobs(frame)
    shown = frame[columns + knobs].astype(object).rename(columns={**TABLE_COLUMNS, **{k: k[len("knob_"):] for k in knobs}})
    formats = {"samples/s": rate, "val_accuracy": "{:.3f}".format, "warm-up s": "{:.2f}".format,
               "trial s": "{:.1f}".format}
    for column in shown.columns:
        form = formats.get(column, str)
        shown[column] = [("" if _missing(v) else form(v)) for v in shown[column]]
    return '<div class="wide">' + shown.to_html(index=False, escape=True, border=0, classes="trials") + "</div>"


# ----------------------------------------------------------------------------- sections

def _figure_html(chart: Chart, prefix: str) -> str:
    if chart.figure is None:
        return f'<p class="missing">Not drawn: {html.escape(chart.missing or "no data")}.</p>'
    # (a chart wider than the page, Optuna's slice plot of many knobs, scrolls rather than squeezes)
    return '<div class="wide">' + chart.figure.to_html(
        full_html=False, include_plotlyjs=False, div_id=f"{prefix}{chart.key}",
        config={"displaylogo": False, "responsive": True}, default_height="420px") + "</div>"


def chart_section(chart: Chart, prefix: str = "", extra: str = "") -> str:
    """A chart with its heading and caption (or the reason it is missing)."""
    caption = f'<p class="caption">{html.escape(chart.caption)}</p>' if chart.caption else ""
    return (f'<section id="{prefix}section-{chart.key}" class="chart"><h3>{html.escape(chart.title)}</h3>'
            f"{caption}{_figure_html(chart, prefix)}{extra}</section>")


def _paired_table(study: optuna.Study) -> str:
    """The paired speedups of the confirmation, per candidate (beside the rounds chart)."""
    confirmed = results.confirmation(study)
    paired = (confirmed or {}).get("paired") or {}
    if not paired:
        return ""
    rows = []
    for number, entry in sorted(paired.items(), key=lambda kv: int(kv[0])):
        lo, hi = entry.get("speedup_range") or (None, None)
        rows.append([f"#{number}", f"{entry['speedup']:.2f}x" if entry.get("speedup") else "-",
                     f"{lo:.2f}x-{hi:.2f}x" if lo is not None else "-",
                     f"{entry.get('faster_rounds', 0)}/{entry.get('rounds', 0)}",
                     "yes" if entry.get("beats_baseline") else "no",
                     f"{entry['standing']:.2f}x" if entry.get("standing") else "-"])
    return findings.to_html([("table", ["candidate", "median paired speedup", "range", "faster rounds",
                                     "beats the baseline", "against the other finalists"], rows)])


def _effects_table(study: optuna.Study) -> str:
    """For each knob the winner changed: the measured effect (compare's definition)."""
    base, best = results.baseline(study), results.best(study)
    if base is None or best is None or base.number == best.number or not TrialRecord.of(base).ok:
        return ""
    kept = StudyRecord.of(study)
    side = Side(study, kept.framework or "?", job(kept.definition), base, best)
    rows = [[f"`{knob}`", repr(old), repr(new), f"{effect:.2f}x" if effect is not None else "-"]
            for knob, old, new, effect in knob_effects(side)]
    if not rows:
        return ""
    return ('<p class="caption">The knobs the winner changed; effect: the median samples/s of the ok trials with '
            "the winner's value over those with the baseline's.</p>"
            + findings.to_html([("table", ["knob", "baseline", "winner", "effect"], rows)]))


def study_sections(study: optuna.Study, url: str, prefix: str = "", level: int = 2) -> str:
    """One study's part of the report: the summary, the charts, the table of every trial."""
    parts = [f'<section id="{prefix}summary" class="summary">{findings.to_html(findings.study_story(study, url), level)}'
             "</section>"]
    extras = {"slices": _effects_table(study), "confirmation": _paired_table(study)}
    for chart in charts.study_charts(study):
        parts.append(chart_section(chart, prefix, extras.get(chart.key, "")))
    frame = trials_frame(study)
    parts.append(f'<section id="{prefix}section-trials"><h3>Every trial</h3>'
                 '<p class="caption">Outcome and reason of each trial, its measurements and the knobs that varied '
                 f"(<code>knobtune report {html.escape(study.study_name)} --csv trials.csv</code> writes every "
                 f"column).</p>{trials_table(frame)}</section>")
    return "\n".join(parts)


def comparison_sections(a: Side, b: Side, notes: list[str]) -> str:
    """The part of ``report A B`` about both: the table, the verdict, two charts."""
    rows = [list(row) for row in compare_rows(a, b)]
    rows.append(["knobs changed", *(", ".join(f"`{k}`={v!r}" for k, _, v, _ in knob_effects(s))
                                    or "(the baseline settings)" for s in (a, b))])
    blocks: list[findings.Block] = [("h", f"{a.study.study_name} vs {b.study.study_name}")]
    blocks += [("p", note) for note in notes]
    blocks += [("table", ["", a.framework, b.framework], rows), ("p", verdict(a, b))]
    parts = [f'<section id="comparison" class="summary">{findings.to_html(blocks)}</section>',
             chart_section(charts.frameworks_bars(a, b)), chart_section(charts.frameworks_accuracy(a, b))]
    return "\n".join(parts)


# ----------------------------------------------------------------------------- the page

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 1em 2em 4em; color: #222; }
header { border-bottom: 1px solid #ddd; margin-bottom: 1em; }
header p, .caption { color: #555; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 14px; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
thead th { background: #f4f4f4; }
.wide { overflow-x: auto; }
table.trials td:nth-child(5) { min-width: 16em; }
pre { background: #f6f6f6; padding: .6em 1em; overflow-x: auto; }
code { background: #f2f2f2; padding: 0 .2em; }
section.chart { margin: 2em 0; }
.missing { background: #fff8e1; border-left: 4px solid #ffb300; padding: .5em 1em; }
h2 { margin-top: 1.6em; }
"""


def check_finished(study: optuna.Study) -> None:
    if not results.finished(study):
        states = [t.state.name.lower() for t in study.get_trials(deepcopy=False)]
        listing = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states))) or "no trials at all"
        raise UserError(f"study {study.study_name!r} has no finished trials yet ({listing}): nothing to report; "
                        f"run it first (knobtune run STUDY.toml)")


def page(title: str, body: str, url: str, toc: list[tuple[str, str]]) -> str:
    """The whole HTML document: plotly.js inlined once in the head, no external resource."""
    from plotly.offline import get_plotlyjs

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nav = " ".join(f'<a href="#{anchor}">{html.escape(text)}</a>' for anchor, text in toc)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{STYLE}</style>\n"
            f'<script type="text/javascript">{get_plotlyjs()}</script>\n</head><body>\n'
            f"<header><h1>{html.escape(title)}</h1><p>knobtune {__version__} report, written {when} from the "
            f"storage {html.escape(redact(url))}: everything here is read from that storage, so anyone with its "
            f"URL gets the same report.</p><nav>{nav}</nav></header>\n{body}\n</body></html>\n")


def _toc(prefix: str, label: str = "") -> list[tuple[str, str]]:
    items = [("summary", "summary"), ("section-history", "history"), ("section-accuracy", "speed vs accuracy"),
             ("section-slices", "knobs"), ("section-importances", "importances"),
             ("section-confirmation", "confirmation"), ("section-ceilings", "diagnosis"), ("section-trials", "trials")]
    return [(prefix + anchor, f"{label}{text}") for anchor, text in items]


def study_report(study: optuna.Study, url: str) -> str:
    """The report of one study, a complete HTML document."""
    check_finished(study)
    return page(f"knobtune report: {study.study_name}", study_sections(study, url), url, _toc(""))


def comparison_report(a: optuna.Study, b: optuna.Study, url: str, force: bool = False) -> str:
    """The report of two studies of one workload (typically one per framework), a complete HTML
    document: what ``knobtune compare`` says, with charts, then each study's own report."""
    check_finished(a)
    check_finished(b)
    if a.study_name == b.study_name:
        raise UserError(f"report A B compares two studies; got {a.study_name!r} twice")
    notes = check_comparable(a, b, force)
    side_a, side_b = _side(a), _side(b)
    body = [comparison_sections(side_a, side_b, notes)]
    for prefix, study in (("a-", a), ("b-", b)):
        body.append(f'<div id="{prefix}study" class="study">{study_sections(study, url, prefix)}</div>')
    toc = [("comparison", "comparison"), ("section-frameworks", "side by side"), ("a-study", a.study_name),
           ("b-study", b.study_name)]
    return page(f"knobtune report: {a.study_name} vs {b.study_name}", "\n".join(body), url, toc)


def comparison_frame(a: optuna.Study, b: optuna.Study) -> Any:
    """Both studies' trials in one DataFrame, with a ``study`` column first (``report A B --csv``)."""
    import pandas as pd

    frames = []
    for study in (a, b):
        frame = trials_frame(study)
        frame.insert(0, "study", study.study_name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True, sort=False)
