"""The charts of ``knobtune report``, from the storage alone. Optuna's own visualisation module
draws what it has (history, slices, importances, the Pareto front); plotly, by hand, the rest
(accuracy against speed with the guard, the confirmation rounds, the diagnosis ceilings, two
studies side by side).

A chart that cannot be drawn is not an error: it comes back with ``figure=None`` and the reason,
which the report prints in its place.
"""
from __future__ import annotations

import statistics
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from knobtune.search.storage.record import StudyRecord, TrialRecord
from knobtune.search.story import findings, results
from knobtune.search.story.compare import Side

BASELINE_COLOUR = "#7f7f7f"
WINNER_COLOUR = "#d62728"
GUARD_COLOUR = "#ff7f0e"
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


@dataclass
class Chart:
    """One chart of the report: a plotly figure, or the reason there is none."""

    key: str
    title: str
    caption: str
    figure: Any = None  # plotly.graph_objects.Figure
    missing: str | None = None


def _objective(study: optuna.Study) -> tuple[Callable[[FrozenTrial], float] | None, str]:
    """The target the Optuna plots draw (the first objective of a pareto study) and its name."""
    name = findings.metric_names(results.mode(study))[0]
    if len(study.directions) > 1:
        return (lambda t: t.values[0]), name
    return None, name


def _complete(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def _quiet(draw: Callable[[], Any]) -> Any:
    """Optuna's plots warn (ExperimentalWarning, "no trials"); the report says it in words instead."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return draw()


def _style(fig: Any, title: str) -> Any:
    fig.update_layout(title=None, template="plotly_white", margin={"l": 60, "r": 20, "t": 30, "b": 50},
                      legend={"orientation": "h", "y": -0.2}, height=420)
    fig.layout.meta = {"title": title}
    return fig


def _floor(study: optuna.Study) -> float | None:
    """The accuracy guard's floor as the story states it (None when the guard is off)."""
    if StudyRecord.of(study).section("guard").get("accuracy") is False:
        return None
    trial = results.best(study) or results.baseline(study)
    return TrialRecord.of(trial).accuracy_floor if trial is not None else None


def _mark(fig: Any, trial: FrozenTrial, x: float, y: float, label: str, colour: str, **where: Any) -> None:
    import plotly.graph_objects as go

    fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers", name=f"{label} (#{trial.number})",
                             marker={"symbol": "star", "size": 16, "color": colour,
                                     "line": {"width": 1, "color": "black"}},
                             hovertext=[f"{label}: trial #{trial.number}"], hoverinfo="text+x+y"), **where)


def _highlights(study: optuna.Study) -> list[tuple[FrozenTrial, str, str]]:
    """The trials the charts mark: the baseline and the winner (the story's roles), with a label."""
    out = []
    kept = (results.confirmation(study) or {}).get("winner")
    for number, role in sorted(findings.roles(study).items()):
        if role == findings.ROLE_BASELINE:
            label = "baseline, kept: no candidate beat it" if kept == number else "baseline"
            out.append((study.trials[number], label, WINNER_COLOUR if kept == number else BASELINE_COLOUR))
        else:
            out.append((study.trials[number], role, WINNER_COLOUR))
    return out


def history(study: optuna.Study) -> Chart:
    """Optuna's optimisation history, with the baseline's level and the winner marked."""
    title = "Optimisation history"
    caption = ("Every trial's objective in the order it ran; Optuna's \"Best Value\" line follows the best single "
               "measurement, the star is the winner knobtune chose (confirmed side by side when the study has a "
               "confirmation), the dotted line the baseline.")
    target, name = _objective(study)
    if not _complete(study):
        return Chart("history", title, caption, missing="no trial completed, so there is no objective value to plot")
    fig = _quiet(lambda: optuna.visualization.plot_optimization_history(study, target=target, target_name=name))
    base = results.baseline(study)
    value = target or (lambda t: t.value)
    if base is not None and base.state == TrialState.COMPLETE:
        fig.add_hline(y=value(base), line={"dash": "dot", "color": BASELINE_COLOUR},
                      annotation_text=f"baseline #{base.number}", annotation_position="bottom right")
    for trial, label, colour in _highlights(study):
        if trial.state == TrialState.COMPLETE:
            _mark(fig, trial, trial.number, value(trial), label, colour)
    fig.update_xaxes(title="trial")
    fig.update_yaxes(title=name)
    return Chart("history", title, caption, _style(fig, title))


def _speed_label(study: optuna.Study) -> str:
    base = results.baseline(study)
    return "job samples/s" if base is not None and TrialRecord.of(base).effective_samples_per_second is not None else "samples/s"


def _measured(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in results.finished(study) if (r := TrialRecord.of(t)).ok
            and r.val_accuracy is not None and r.samples_per_second]


def accuracy_vs_speed(study: optuna.Study) -> Chart:
    """samples/s against val_accuracy for every measured trial, the guard's floor as a line, and in
    pareto mode Optuna's Pareto front."""
    title = "Speed against accuracy"
    floor = _floor(study)
    guard = (f"the dashed line is the accuracy guard's floor ({floor:.3f}): a trial below it is never a candidate"
             if floor is not None else "the accuracy guard is off")
    pareto = results.mode(study) == "pareto"
    caption = (f"Each trial that finished its burst: its throughput and the accuracy it reached on the held-out "
               f"split; {guard}." + (" Optuna's Pareto front is highlighted." if pareto else ""))
    trials = _measured(study)
    if not trials:
        return Chart("accuracy", title, caption, missing="no trial finished with a throughput and an accuracy")
    import plotly.graph_objects as go

    speed = _speed_label(study)
    if pareto:
        fig = _quiet(lambda: optuna.visualization.plot_pareto_front(study, target_names=[speed, "val_accuracy"]))
        _name_pareto_traces(fig)
    else:
        groups: dict[str, list[FrozenTrial]] = {}
        for t in trials:
            groups.setdefault("feasible" if results.is_feasible(t) else "below the accuracy guard", []).append(t)
        fig = go.Figure()
        for label, members in groups.items():
            fig.add_trace(go.Scatter(
                x=[results.rate(t) for t in members], y=[results.accuracy(t) for t in members],
                mode="markers", name=label, text=[f"trial #{t.number}" for t in members],
                hoverinfo="text+x+y", marker={"size": 10, "color": PALETTE[0] if label == "feasible" else "#cccccc",
                                               "line": {"width": 1, "color": "#444"}}))
    measured = {t.number for t in trials}
    for trial, label, colour in _highlights(study):
        if trial.number in measured:
            _mark(fig, trial, results.rate(trial), results.accuracy(trial), label, colour)
    if floor is not None:
        fig.add_hline(y=floor, line={"dash": "dash", "color": GUARD_COLOUR},
                      annotation_text=f"accuracy guard {floor:.3f}", annotation_position="bottom left")
    fig.update_xaxes(title=speed)
    fig.update_yaxes(title="val_accuracy")
    return Chart("accuracy", title, caption, _style(fig, title))


def _name_pareto_traces(fig: Any) -> None:
    """Optuna's Pareto plot names its traces only by their colour bars; give them legend names."""
    names = {"Best Trial": "Pareto front (feasible, not dominated)", "Trial": "dominated"}
    for trace in fig.data:
        bar = trace.marker.colorbar.title.text if trace.marker.colorbar else None
        if bar in names:
            trace.update(name=names[bar], showlegend=True)
        elif trace.name is None and len(trace.x or ()):
            trace.update(name="infeasible", showlegend=True)


def _varied(study: optuna.Study) -> list[str]:
    """The searched knobs (Optuna params) that took more than one value among complete trials."""
    values: dict[str, set[str]] = {}
    for t in _complete(study):
        for name, value in t.params.items():
            values.setdefault(name, set()).add(repr(value))
    return sorted(name for name, seen in values.items() if len(seen) > 1)


def knob_slices(study: optuna.Study) -> Chart:
    """Optuna's slice plot: the objective against each searched knob's values."""
    title = "Per-knob effects"
    caption = ("The objective of every complete trial against the value of each searched knob (Optuna's slice "
               "plot; colour: trial number). A knob whose values separate the points matters here.")
    target, name = _objective(study)
    params = _varied(study)
    if not params:
        return Chart("slices", title, caption,
                     missing="no searched knob took two values among the complete trials, so there is nothing to "
                             "set side by side")
    fig = _quiet(lambda: optuna.visualization.plot_slice(study, params=params, target=target, target_name=name))
    return Chart("slices", title, caption, _style(fig, title))


def importances(study: optuna.Study) -> Chart:
    """Optuna's parameter importances (fANOVA, seeded so the report is reproducible)."""
    title = "Parameter importances"
    caption = ("How much of the objective's variation each searched knob explains (Optuna's fANOVA evaluator over "
               "the complete trials). With few trials this is a rough guide.")
    complete = _complete(study)
    if len(complete) < 2:
        return Chart("importances", title, caption,
                     missing=f"needs at least 2 complete trials; the study has {len(complete)}")
    params = _varied(study)
    if not params:
        return Chart("importances", title, caption,
                     missing="every complete trial searched the same knob values, so no knob explains anything")
    target, name = _objective(study)
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
    try:
        fig = _quiet(lambda: optuna.visualization.plot_param_importances(
            study, evaluator=evaluator, params=params, target=target, target_name=name))
    except (ValueError, RuntimeError) as exc:
        return Chart("importances", title, caption, missing=f"Optuna could not compute them: {exc}")
    return Chart("importances", title, caption, _style(fig, title))


def _round_values(confirmed: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """Trial number (as stored) -> (round, value) of each of its runs that produced a value."""
    out: dict[str, list[tuple[int, float]]] = {}
    for number, runs in (confirmed.get("runs") or {}).items():
        for run in runs:
            value = run.get("value", run.get("samples_per_second"))
            if value is not None and run.get("outcome", "ok") == "ok":
                out.setdefault(number, []).append((int(run["round"]), float(value)))
    return out


def confirmation_rounds(study: optuna.Study) -> Chart:
    """The interleaved confirmation rounds: each candidate's and the baseline's figure per round,
    and each candidate's paired speedup over the baseline per round with the bar it had to clear."""
    title = "Confirmation rounds"
    confirmed = results.confirmation(study)
    if not confirmed:
        stale = StudyRecord.of(study).confirmed
        why = ("the confirmation on record covers fewer trials than the study now has (it is redone when the "
               "run resumes)" if stale else "the study has no confirmation (it ran with --no-confirm, or the run "
                                            "has not finished)")
        return Chart("confirmation", title, "", missing=why)
    minimize = bool(confirmed.get("minimize"))
    unit = "seconds to target" if minimize else "samples/s"
    bar = 1 + float(confirmed.get("min_speedup", 0.03))
    caption = (f"Left: {unit} of each configuration in each interleaved round (every round measures all of them at "
               f"the same moment of the machine). Right: each candidate over the baseline of the same round; a "
               f"candidate wins only with a median at or above {bar:.2f}x (the dotted line) and faster in most "
               f"rounds.")
    values = _round_values(confirmed)
    base_key = str(confirmed.get("baseline"))
    if not values:
        return Chart("confirmation", title, caption, missing="no confirmation run produced a measurement")
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(unit, "speedup over the baseline, same round"))
    winner = str(confirmed.get("winner"))
    base = {}
    for r, value in values.get(base_key, []):
        base.setdefault(r, []).append(value)
    for i, (number, runs) in enumerate(sorted(values.items(), key=lambda kv: kv[0] != base_key)):
        label = f"baseline #{number}" if number == base_key else f"trial #{number}"
        label += " (winner)" if number == winner else ""
        colour = BASELINE_COLOUR if number == base_key else (WINNER_COLOUR if number == winner
                                                              else PALETTE[i % len(PALETTE)])
        fig.add_trace(go.Scatter(x=[r + 1 for r, _ in runs], y=[v for _, v in runs], mode="lines+markers",
                                 name=label, legendgroup=number, line={"color": colour}), row=1, col=1)
        if number == base_key:
            continue
        # paired with the baseline's run of the same round (the median, should it have run twice)
        paired = [(r, v) for r, v in runs if r in base and v > 0]
        ratios = [statistics.median(base[r]) / v if minimize else v / statistics.median(base[r]) for r, v in paired]
        fig.add_trace(go.Scatter(x=[r + 1 for r, _ in paired], y=ratios, mode="lines+markers", name=label,
                                 legendgroup=number, showlegend=False, line={"color": colour}), row=1, col=2)
    fig.add_hline(y=bar, line={"dash": "dot", "color": GUARD_COLOUR}, row=1, col=2,
                  annotation_text=f"{bar:.2f}x", annotation_position="top left")
    fig.add_hline(y=1.0, line={"color": BASELINE_COLOUR, "width": 1}, row=1, col=2)
    fig.update_xaxes(title="round", dtick=1)
    return Chart("confirmation", title, caption, _style(fig, title))


def ceilings(study: optuna.Study) -> Chart:
    """The diagnosis: input and compute ceilings of the baseline and the diagnosed winner, beside
    the samples/s each trained at."""
    title = "Bottleneck diagnosis"
    caption = ("The input ceiling is the data pipeline alone (the faster of as configured and the framework's most "
               "parallel loader), the compute ceiling the train step on a batch already on the device; the "
               "trial's own samples/s sits under the lower of the two, its bottleneck.")
    diagnosis = StudyRecord.of(study).diagnosis
    if not diagnosis:
        return Chart("ceilings", title, caption,
                     missing="the study has no diagnosis (it ran with --no-diagnose; knobtune diagnose STUDY.toml makes one)")
    if diagnosis.get("skipped"):
        return Chart("ceilings", title, caption, missing=diagnosis["skipped"])
    import plotly.graph_objects as go

    labels, inputs, computes, measured, notes = [], [], [], [], []
    for key in ("baseline", "winner"):
        entry = diagnosis.get(key) or {}
        number = diagnosis.get("winner_trial") if key == "winner" else getattr(results.baseline(study), "number", None)
        if "error" in entry:
            notes.append(f"the {key}'s diagnosis failed ({entry['error']})")
            continue
        if "bottleneck" not in entry:
            continue
        trial = study.trials[number] if isinstance(number, int) and number < len(study.trials) else None
        same = key == "winner" and number == getattr(results.baseline(study), "number", None)
        labels.append(f"{key} #{number}{', the baseline' if same else ''} (bottleneck: {entry['bottleneck']})")
        inputs.append(entry.get("input"))
        computes.append(entry.get("compute"))
        measured.append(TrialRecord.of(trial).samples_per_second if trial is not None else None)
        variants = ", ".join(f"{name} {value:,.0f}" for name, value in (entry.get("input_variants") or {}).items())
        if variants:
            notes.append(f"{key} input pipeline: {variants} samples/s")
    current = results.best(study)
    if current is not None and diagnosis.get("winner_trial") not in (None, current.number):
        notes.append(f"diagnosed for trial #{diagnosis['winner_trial']}, which is no longer the winner "
                     f"(#{current.number} is)")
    caption += (" " + "; ".join(notes) + ".") if notes else ""
    if not labels:
        return Chart("ceilings", title, caption, missing="the diagnosis measured no ceiling")
    fig = go.Figure([
        go.Bar(name="input ceiling", x=labels, y=inputs, marker_color=PALETTE[0]),
        go.Bar(name="compute ceiling", x=labels, y=computes, marker_color=PALETTE[1]),
        go.Bar(name="trial's samples/s", x=labels, y=measured, marker_color=WINNER_COLOUR),
    ])
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="samples/s")
    return Chart("ceilings", title, caption, _style(fig, title))


def study_charts(study: optuna.Study) -> list[Chart]:
    """Every chart of one study's report, in the report's order."""
    return [history(study), accuracy_vs_speed(study), knob_slices(study), importances(study),
            confirmation_rounds(study), ceilings(study)]


# ----------------------------------------------------------------------------- two studies

def frameworks_bars(a: Side, b: Side) -> Chart:
    """Baseline and tuned samples/s of both studies side by side (confirmed medians where there are)."""
    title = "Baseline and tuned, side by side"
    caption = (f"samples/s of each study's baseline and winner ({a.study.study_name}: {a.figures}; "
               f"{b.study.study_name}: {b.figures}).")
    import plotly.graph_objects as go

    names = [f"{s.framework} ({s.study.study_name})" for s in (a, b)]
    fig = go.Figure([
        go.Bar(name="baseline", x=names, y=[a.base_sps, b.base_sps], marker_color=BASELINE_COLOUR,
               text=[f"{a.base_sps:,.0f}", f"{b.base_sps:,.0f}"], textposition="outside"),
        go.Bar(name="tuned", x=names, y=[a.best_sps, b.best_sps], marker_color=WINNER_COLOUR,
               text=[f"{a.best_sps:,.0f} ({a.speedup.value:.2f}x)", f"{b.best_sps:,.0f} ({b.speedup.value:.2f}x)"],
               textposition="outside"),
    ])
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="samples/s")
    return Chart("frameworks", title, caption, _style(fig, title))


def frameworks_accuracy(a: Side, b: Side) -> Chart:
    """Both studies' trials, samples/s against val_accuracy, with each study's guard."""
    title = "Speed against accuracy, both studies"
    caption = "Every measured trial of both studies; dashed lines: each study's accuracy guard floor."
    import plotly.graph_objects as go

    fig = go.Figure()
    for side, colour in ((a, PALETTE[0]), (b, PALETTE[1])):
        trials = _measured(side.study)
        fig.add_trace(go.Scatter(
            x=[results.rate(t) for t in trials], y=[results.accuracy(t) for t in trials],
            mode="markers", name=f"{side.framework} ({side.study.study_name})",
            text=[f"{side.study.study_name} #{t.number}" for t in trials], hoverinfo="text+x+y",
            marker={"size": 10, "color": colour, "line": {"width": 1, "color": "#444"}}))
        _mark(fig, side.best, results.rate(side.best), results.accuracy(side.best),
              f"{side.framework} winner", colour)
        floor = _floor(side.study)
        if floor is not None:
            fig.add_hline(y=floor, line={"dash": "dash", "color": colour},
                          annotation_text=f"{side.framework} guard {floor:.3f}", annotation_position="bottom left")
    fig.update_xaxes(title="samples/s")
    fig.update_yaxes(title="val_accuracy")
    return Chart("frameworks-accuracy", title, caption, _style(fig, title))
