"""The trial record (search/storage/record.py) reads every stored study as it was written, and
each derived figure has one definition that every presenter shows."""
from __future__ import annotations

import json
import re

import optuna
import pytest

from knobtune.search.storage import record
from knobtune.search.storage.record import KnobEntry, StudyRecord, TrialRecord
from knobtune.search.story import compare, export, findings, results, summary

from recorded import DATA, rebuild


@pytest.mark.parametrize("name", sorted(p.stem for p in DATA.glob("*.json")))
def test_every_recorded_trial_reads_and_writes_back_unchanged(name: str):
    doc = json.loads((DATA / f"{name}.json").read_text())
    for entry in doc["trials"]:
        rec = TrialRecord.from_attrs(entry["user_attrs"])
        assert rec.attrs() == entry["user_attrs"]
        if entry["user_attrs"].get("samples_per_second") is not None:
            assert rec.samples_per_second == entry["user_attrs"]["samples_per_second"]
    assert StudyRecord.from_attrs(doc["user_attrs"]).definition == doc["user_attrs"]["definition"]


def test_attributes_this_version_does_not_name_are_kept():
    rec = TrialRecord.from_attrs({"outcome": "ok", "from_a_newer_knobtune": [1, 2],
                                  "knobs": {"amp": {"value": "bf16", "applied": False, "why": "no bf16"}}})
    assert rec.extra == {"from_a_newer_knobtune": [1, 2]}
    assert rec.knobs["amp"] == KnobEntry("bf16", False, "no bf16") and rec.applied_knobs == {}
    assert rec.attrs()["from_a_newer_knobtune"] == [1, 2]


def test_writing_a_name_the_record_does_not_have_is_refused(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'r.db'}")
    trial = study.ask()
    record.mark(trial, worker="host:1", failure="why")
    assert study.trials[0].user_attrs == {"worker": "host:1", "failure": "why"}
    with pytest.raises(TypeError, match="not trial record fields: \\['samples_per_sec'\\]"):
        record.mark(trial, samples_per_sec=1.0)
    with pytest.raises(TypeError, match="not study record fields"):
        record.mark_study(study, definitoin={})


def test_every_presenter_shows_the_confirmed_paired_median(tmp_path):
    """The confirmed winner's speedup is the median of per-round paired ratios; the note, the run
    summary, the export and compare all show that figure and say which it is."""
    study = rebuild("mlp-pytorch", f"sqlite:///{tmp_path / 'r.db'}")
    confirmed = results.confirmation(study)
    assert confirmed is not None and confirmed["winner"] != confirmed["baseline"]
    figure = results.speedup(study)
    assert figure is not None and figure.value == confirmed["speedup"] and figure.rounds == confirmed["repeats"]
    shown = f"{figure.value:.2f}x"
    medians = confirmed["medians"]
    ratio_of_medians = medians[str(confirmed["winner"])] / medians[str(confirmed["baseline"])]
    assert f"{ratio_of_medians:.2f}x" != shown  # (else this test could not tell the two apart)

    story = findings.to_markdown(findings.study_story(study, "sqlite:///x.db"))
    assert f"**{shown}**" in story
    assert f"confirmed: trial #{confirmed['winner']} is {shown} the baseline" in summary.study_summary(study, "x")
    doc = export.best_config(study)
    assert doc["speedup"]["value"] == figure.value and doc["speedup"]["figure"] == figure.label
    side = compare._side(study)
    assert side.speedup == figure
    table = compare.table(side, side)
    assert re.search(rf"speedup over own baseline\s+{re.escape(shown)}", table)
    assert figure.label in table


def test_before_a_confirmation_the_figure_is_the_search_trials_and_says_so(tmp_path):
    study = rebuild("mlp-pytorch", f"sqlite:///{tmp_path / 'r.db'}")
    study.set_user_attr("confirmed", None)
    best, base = results.best(study), results.baseline(study)
    figure = results.speedup(study)
    assert figure is not None and figure.rounds is None and figure.label == "one search trial each"
    assert figure.value == pytest.approx(results.rate(best) / results.rate(base))
    doc = export.best_config(study)
    assert doc["speedup"]["value"] == doc["metrics"]["speedup"] == pytest.approx(figure.value)
