"""knobtune report: the HTML file, its charts and the trials table, on recorded studies (real runs
saved in tests/data, rebuilt into a fresh storage: no trial is trained here), and once for real
in headless Chromium from a file:// path with the network blocked."""
from __future__ import annotations

import html
from pathlib import Path

import optuna
import pandas as pd
import pytest

from knobtune.search.cli import parser
from knobtune.search.errors import UserError
from knobtune.search.story import charts, compare, findings, htmlreport, results

from browser import browser_page, rendered_plots
from conftest import knobtune
from recorded import rebuild

RECORDED = ("story", "pareto", "mlp-pytorch", "mlp-tensorflow")
STUDY_CHARTS = ("history", "accuracy", "slices", "importances", "confirmation", "ceilings")


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One storage holding every recorded study (the tests only read it)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('recorded') / 'knobtune.db'}"
    for name in RECORDED:
        rebuild(name, url)
    return url


def load(url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=url)


def run_report(*argv: str) -> None:
    """The report command in this process (its errors as exceptions, not exit codes)."""
    args = parser().parse_args(["report", *argv])
    args.func(args)


# ----------------------------------------------------------------------------- the HTML

def test_report_is_one_offline_file_with_the_story_every_chart_and_every_trial(storage: str):
    study = load(storage, "story")
    text = htmlreport.study_report(study, storage)
    from plotly.offline import get_plotlyjs

    assert text.count(get_plotlyjs()) == 1  # plotly.js inlined, once
    assert "<script src" not in text and "<link" not in text  # nothing fetched
    # the summary is the dashboard's study note, rendered as HTML
    assert findings.to_html(findings.study_story(study, storage)) in text
    for key in STUDY_CHARTS:
        assert f'id="{key}"' in text, key
    assert "Not drawn" not in text
    # the trials table: one row per trial, duplicates shown as skipped with the reason
    table = text[text.index('class="dataframe trials"'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr>") == len(study.trials)
    assert table.count("<td>skipped</td>") == 3
    assert "duplicate proposal of trial #2" in table


def test_charts_mark_the_baseline_the_guard_the_rounds_and_the_ceilings(storage: str):
    study = load(storage, "story")
    drawn = {c.key: c for c in charts.study_charts(study)}
    assert [c for c in drawn.values() if c.figure is None] == []
    confirmed = results.confirmation(study)
    base = results.baseline(study)
    # the confirmation kept the baseline: the star is on it, labelled so
    history = drawn["history"].figure
    stars = [t for t in history.data if t.marker.symbol == "star"]
    assert [(list(t.x), t.name) for t in stars] == [([base.number], f"baseline, kept: no candidate beat it (#{base.number})")]
    # the guard's floor is the line the story states
    floor = base.user_attrs["accuracy_floor"]
    accuracy = drawn["accuracy"].figure
    assert [s.y0 for s in accuracy.layout.shapes] == [pytest.approx(floor)]
    assert f"{floor:.3f}" in findings.to_markdown(findings.study_story(study, storage))
    # rounds: one line per configuration measured (left), one ratio line per candidate (right)
    rounds = drawn["confirmation"].figure
    left = [t for t in rounds.data if t.xaxis == "x"]
    right = [t for t in rounds.data if t.xaxis == "x2"]
    assert len(left) == len(confirmed["runs"]) and len(right) == len(confirmed["runs"]) - 1
    assert all(max(t.x) == confirmed["repeats"] for t in left)
    # the ratio of a candidate in a round is its figure over the baseline's in that round
    runs = confirmed["runs"]
    candidate = next(n for n in runs if n != str(confirmed["baseline"]))
    expected = [r["value"] / b["value"] for r, b in zip(runs[candidate], runs[str(confirmed["baseline"])])]
    line = next(t for t in right if t.legendgroup == candidate)
    assert list(line.y) == pytest.approx(expected)
    # the diagnosis: both ceilings and the trial's own figure, for the baseline and the winner
    ceilings = drawn["ceilings"].figure
    diagnosis = study.user_attrs["diagnosis"]
    assert [t.name for t in ceilings.data] == ["input ceiling", "compute ceiling", "trial's samples/s"]
    assert list(ceilings.data[0].y) == [diagnosis["baseline"]["input"], diagnosis["winner"]["input"]]
    assert list(ceilings.data[1].y) == [diagnosis["baseline"]["compute"], diagnosis["winner"]["compute"]]
    assert all("bottleneck: input" in label for label in ceilings.data[0].x)


def test_pareto_report_draws_optunas_front_with_the_guard(storage: str):
    study = load(storage, "pareto")
    chart = charts.accuracy_vs_speed(study)
    front = {(results.rate(t), t.user_attrs["val_accuracy"]) for t in results.front(study)}
    best = next(t for t in chart.figure.data if (t.name or "").startswith("Pareto front"))  # Optuna's front trace
    assert set(zip(best.x, best.y)) == front
    assert [s.y0 for s in chart.figure.layout.shapes] == [pytest.approx(results.baseline(study).user_attrs["accuracy_floor"])]
    history = charts.history(study)  # two objectives: the history plots the first, samples/s
    assert history.figure is not None and history.figure.layout.yaxis.title.text == "samples/s"
    text = htmlreport.study_report(study, storage)  # (it ran with --no-diagnose)
    assert text.count('class="missing"') == 1 and "the study has no diagnosis" in text


def test_charts_that_cannot_be_drawn_say_why(storage: str, tmp_path: Path):
    # one trial, no confirmation, no diagnosis: a study stopped after its baseline
    recorded = load(storage, "story")
    url = f"sqlite:///{tmp_path / 'one.db'}"
    study = optuna.create_study(study_name="one", storage=url, directions=["maximize"])
    for key, value in recorded.user_attrs.items():
        if key not in ("confirmed", "diagnosis"):
            study.set_user_attr(key, value)
    study.add_trial(recorded.trials[0])
    drawn = {c.key: c for c in charts.study_charts(study)}
    assert drawn["history"].figure is not None and drawn["accuracy"].figure is not None
    assert "at least 2 complete trials; the study has 1" in drawn["importances"].missing
    assert "two values" in drawn["slices"].missing
    assert "no confirmation" in drawn["confirmation"].missing
    assert "--no-diagnose" in drawn["ceilings"].missing
    text = htmlreport.study_report(study, url)
    assert text.count('class="missing"') == 4
    assert html.escape(drawn["importances"].missing) in text


def test_comparison_report_says_what_compare_says_then_each_study(storage: str):
    a, b = load(storage, "mlp-pytorch"), load(storage, "mlp-tensorflow")
    text = htmlreport.comparison_report(a, b, storage)
    side_a, side_b = compare._side(a), compare._side(b)
    assert findings.to_html([("p", compare.verdict(side_a, side_b))]) in text
    for prefix, study in (("a-", a), ("b-", b)):
        assert findings.to_html(findings.study_story(study, storage)) in text
        for key in STUDY_CHARTS[:5]:  # (the TensorFlow study ran with --no-diagnose)
            assert f'id="{prefix}{key}"' in text, prefix + key
    assert 'id="frameworks"' in text and 'id="frameworks-accuracy"' in text
    bars = charts.frameworks_bars(side_a, side_b).figure
    assert list(bars.data[0].y) == [side_a.base_sps, side_b.base_sps]
    assert list(bars.data[1].y) == [side_a.best_sps, side_b.best_sps]
    frame = htmlreport.comparison_frame(a, b)
    assert list(frame["study"].unique()) == ["mlp-pytorch", "mlp-tensorflow"]
    assert len(frame) == len(a.trials) + len(b.trials)


def test_comparison_refuses_other_workloads_unless_forced(storage: str):
    a, b = load(storage, "story"), load(storage, "mlp-tensorflow")
    with pytest.raises(UserError, match="--force"):
        htmlreport.comparison_report(a, b, storage)
    assert "compared anyway, --force" in htmlreport.comparison_report(a, b, storage, force=True)


# ----------------------------------------------------------------------------- the trials table

def test_trials_frame_flattens_knobs_and_measurements(storage: str, tmp_path: Path):
    study = load(storage, "mlp-pytorch")
    frame = htmlreport.trials_frame(study)
    assert list(frame["number"]) == [t.number for t in study.trials]
    for column in ("state", "role", "outcome", "reason", "samples_per_second", "val_accuracy",
                   "knob_batch_size", "knob_amp", "params_batch_size", "constraint_accuracy"):
        assert column in frame.columns, column
    assert not any(isinstance(v, (dict, list)) for v in frame.to_numpy().ravel())
    for trial in study.trials:
        row = frame.set_index("number").loc[trial.number]
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert row["knob_batch_size"] == trial.user_attrs["knobs"]["batch_size"]["value"]
            assert row["samples_per_second"] == trial.user_attrs["samples_per_second"]
        if results.is_feasible(trial) or trial.state != optuna.trial.TrialState.COMPLETE:
            continue
        assert row["outcome"] == "below accuracy guard"
        assert f"< floor {trial.user_attrs['accuracy_floor']:.3f}" in row["reason"]
    assert (frame["role"] == "baseline").sum() == 1
    # the CSV reads back as the same table (outcome "nan" is a word, not a missing value)
    path = tmp_path / "trials.csv"
    run_report("mlp-pytorch", "--storage", storage, "--csv", str(path))
    back = pd.read_csv(path, keep_default_na=False, na_values=[""])
    assert list(back.columns) == list(frame.columns) and len(back) == len(frame)
    assert not (tmp_path / "report.html").exists()  # --csv alone writes only the CSV
    nan = htmlreport.trials_frame(load(storage, "story"))
    assert "nan" in set(nan["outcome"])


# ----------------------------------------------------------------------------- bad input

def test_bad_input_is_one_line_that_says_what_to_do(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'knobtune.db'}"
    rebuild("story", url)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UserError, match=r"no study named 'nope' in this storage \(it has: story\)"):
        run_report("nope", "--storage", url, "-o", str(out / "r.html"))
    optuna.create_study(study_name="empty", storage=url)
    with pytest.raises(UserError, match="study 'empty' has no finished trials yet .*nothing to report"):
        run_report("empty", "--storage", url, "-o", str(out / "r.html"))
    with pytest.raises(UserError, match="study 'empty' has no finished trials"):
        run_report("story", "empty", "--storage", url, "-o", str(out / "r.html"))
    with pytest.raises(UserError, match="study 'empty' has no finished trials"):
        run_report("empty", "--storage", url, "--csv", str(out / "t.csv"))
    missing = tmp_path / "missing" / "report.html"
    with pytest.raises(UserError, match=f"cannot write -o {missing}: directory {missing.parent} does not exist"):
        run_report("story", "--storage", url, "-o", str(missing))
    with pytest.raises(UserError, match="cannot write --csv"):
        run_report("story", "--storage", url, "--csv", str(missing.with_suffix(".csv")))
    assert not list(out.iterdir())  # nothing half-written


def test_cli_report_opens_offline_in_chromium_with_every_plot_drawn(storage: str, tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    proc = knobtune("report", "story", "--storage", storage, "-o", str(out / "report.html"),
                    "--csv", str(out / "trials.csv"), cwd=tmp_path, check=0)
    assert "wrote" in proc.stderr and "report.html" in proc.stderr
    path = out / "report.html"
    # read from the storage alone, in another process: the same summary as this one computes
    study = load(storage, "story")
    assert findings.to_html(findings.study_story(study, storage)) in path.read_text()
    assert len(pd.read_csv(out / "trials.csv", keep_default_na=False)) == len(study.trials)
    with browser_page(offline=True) as (page, errors):
        page.goto(path.as_uri())
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= "
                               f"{len(STUDY_CHARTS)}", timeout=30_000)
        drawn = rendered_plots(page)
        rows = page.locator("table.trials tbody tr").count()
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert set(drawn) == set(STUDY_CHARTS) and all(n > 0 for n in drawn.values()), drawn
    assert rows == len(study.trials)
    assert errors == []
    assert (tmp_path / "report.png").stat().st_size > 10_000
    missing = knobtune("report", "nope", "--storage", storage, cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "it has:" in missing.stderr
