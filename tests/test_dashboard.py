"""What optuna-dashboard shows of a knobtune study: metric names, the study note (the story),
trial notes, roles, and per-trial artifacts; on a recorded study, on a real run, and in a real
headless Chromium against `knobtune dashboard`."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import optuna
import pytest
from test_tuned import STUDY as OWN_STUDY

from knobtune.search.storage import artifacts
from knobtune.search.story import findings, notes

from conftest import FAST, knobtune, script_study, stored
from recorded import rebuild

WORKLOADS = Path(__file__).resolve().parent / "workloads"

# the Tuned API tests' study of the test script, under its own name
SCRIPT_STUDY = OWN_STUDY.replace('name = "own"', 'name = "watched"')


def note_of(study: optuna.Study, trial: optuna.trial.FrozenTrial | None = None) -> tuple[str, int]:
    from optuna_dashboard._note import get_note_from_system_attrs

    attrs = study._storage.get_study_system_attrs(study._study_id)
    note = get_note_from_system_attrs(attrs, None if trial is None else trial._trial_id)
    return note["body"], note["version"]


def test_recorded_study_gets_its_story_trial_notes_and_metric_name(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'knobtune.db'}"
    study = rebuild("story", url)
    notes.name_metrics(study)
    notes.publish(study, url, "after the diagnosis")
    study = optuna.load_study(study_name="story", storage=url)
    assert study.metric_names == ["samples/s"]
    body, version = note_of(study)
    # the recorded confirmation kept the baseline; Optuna's "Best Trial" is another trial: both said
    assert "No configuration beat your current settings" in body
    badge = study.best_trial.number
    assert badge != 0 and f"\"Best Trial\" badge marks trial #{badge}" in body
    assert "| baseline | #0 |" in body and "knobtune export story" in body
    assert "Bottleneck diagnosis" in body and "after the diagnosis" in body
    assert "3 duplicate proposal(s) skipped" in body and "they are not failures" in body
    assert study.user_attrs["roles"] == {"0": "baseline"}
    for trial in study.trials:
        text, _ = note_of(study, trial)
        outcome = trial.user_attrs.get("outcome")
        if trial.user_attrs.get("duplicate_of") is not None:
            assert "a duplicate proposal, not a failure" in text
            assert f"trial #{trial.user_attrs['duplicate_of']}" in text
        elif outcome == "nan":
            assert "the loss became non-finite" in text and trial.user_attrs["failure"].splitlines()[0] in text
        elif trial.number == 0:
            assert "the baseline" in text and "**Kept**" in text
        else:  # an ok trial with no role needs no note
            assert text == ""
    # publishing again with nothing changed writes nothing
    notes.publish(study, url, "after the diagnosis")
    assert note_of(study) == (body, version)


def test_a_failed_trials_note_has_its_outcome_reason_and_output_tail(tmp_path: Path):
    from optuna.trial import TrialState, create_trial

    url = f"sqlite:///{tmp_path / 'knobtune.db'}"
    study = rebuild("story", url)
    base = study.trials[0]
    study.add_trial(create_trial(
        state=TrialState.PRUNED, params=base.params, distributions=base.distributions,
        user_attrs={"outcome": "timeout", "failure": "no result within timeout_s=120 s; its process group was killed",
                    "output_tail": "loading shard 7 of 9\nwaiting for <the NFS mount>"}))
    trial = study.trials[-1]
    note = findings.to_markdown(findings.trial_story(study, trial, url) or [])
    assert f"# Trial #{trial.number}: timeout" in note
    assert "**no result within the trial's timeout**: no result within timeout_s=120 s" in note
    assert "```\nloading shard 7 of 9\nwaiting for <the NFS mount>\n```" in note
    assert "&lt;the NFS mount&gt;" in findings.to_html(findings.trial_story(study, trial, url) or [])


def test_the_story_says_why_faster_candidates_lost_to_the_baseline(tmp_path: Path):
    """The recorded demo run: the confirmation's candidates measured faster than the baseline but
    lost the accuracy they had; "no configuration beat your settings" must say so."""
    url = f"sqlite:///{tmp_path / 'knobtune.db'}"
    study = rebuild("demo-pytorch", url)
    confirmed = study.user_attrs["confirmed"]
    out = [n for n, median in confirmed["medians"].items() if median is None]
    assert out and confirmed["winner"] == confirmed["baseline"]
    body = findings.to_markdown(findings.study_story(study, url))
    for number in out:
        accuracy = confirmed["mean_accuracies"][number]
        assert f"Trial #{number} was out: its mean val_accuracy over the rounds' seeds, {accuracy:.3f}" in body
    assert "pruning stopped" in body and "duplicate proposal(s) skipped" in body


def test_markdown_and_html_escape_what_trials_report():
    blocks: list[findings.Block] = [
        ("h", "Trial #3: crash"),
        ("p", "**the trial's process failed**: <script>alert(1)</script> at `step 5`"),
        ("table", ["a|b", "c"], [["x|y", "<b>"]]),
        ("code", "Traceback <most recent>"),
    ]
    md = findings.to_markdown(blocks)
    assert md.startswith("# Trial #3: crash") and "| a\\|b | c |" in md and "```\nTraceback <most recent>\n```" in md
    page = findings.to_html(blocks)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<strong>the trial&#x27;s process failed</strong>" in page and "<code>step 5</code>" in page
    assert "<td>&lt;b&gt;</td>" in page and "<pre>Traceback &lt;most recent&gt;</pre>" in page


def test_window_chart_is_an_svg_with_a_bar_per_window():
    svg = artifacts.window_chart([900.0, 1000.0, 1100.0], "trial #2: window rates")
    root = ET.fromstring(svg)
    bars = root.findall("{http://www.w3.org/2000/svg}rect")
    assert len(bars) == 3
    heights = [float(b.get("height")) for b in bars]
    assert heights == sorted(heights) and heights[0] > 0  # drawn to scale
    assert "1,000" in svg  # the median, labelled
    empty = ET.fromstring(artifacts.window_chart([], "trial #4"))
    assert "no window measured" in "".join(empty.itertext())


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of a user's script (3 trials) with its artifacts beside the SQLite file."""
    directory = tmp_path_factory.mktemp("watched")
    path = script_study(directory, SCRIPT_STUDY, WORKLOADS / "kt_script.py", ["--epochs", "2"], trials=3)
    knobtune("run", str(path), *FAST, cwd=directory, check=0)
    return directory


def test_a_run_stores_each_trials_output_request_and_chart(watched: Path):
    from optuna.artifacts import get_all_artifact_meta

    study = stored(watched, "watched")
    store = artifacts.store(watched / "knobtune-artifacts")
    measured = [t for t in study.trials if t.state.is_finished() and t.user_attrs.get("outcome")
                and t.user_attrs.get("duplicate_of") is None]
    assert len(measured) >= 3
    for trial in measured:
        metas = {m.filename: m for m in get_all_artifact_meta(trial, storage=study._storage)}
        n = trial.number
        assert set(metas) == {f"trial-{n}-output.log", f"trial-{n}-request.json", f"trial-{n}-window-rates.svg"}
        with store.open_reader(metas[f"trial-{n}-request.json"].artifact_id) as f:
            request = json.load(f)
        assert request["knobs"] == {k: v["value"] for k, v in trial.user_attrs["knobs"].items()}
        with store.open_reader(metas[f"trial-{n}-output.log"].artifact_id) as f:
            assert b"epoch 1 done" in f.read()  # the script's own output, whole
        with store.open_reader(metas[f"trial-{n}-window-rates.svg"].artifact_id) as f:
            bars = ET.fromstring(f.read()).findall("{http://www.w3.org/2000/svg}rect")
        assert len(bars) == len(trial.user_attrs["window_rates"])
    assert study.metric_names == ["samples/s"]
    body, version = note_of(study)
    assert version >= len(measured) + 1  # rewritten after each trial and at the end of the run
    assert "Best so far" in body and "Written by knobtune at the end of the run" in body
    assert "watched: pytorch, kt_script.py, objective throughput" in body
    baseline = next(t for t in study.trials if t.user_attrs.get("is_baseline"))
    assert baseline.user_attrs["role"] == "baseline"
    assert "the baseline (your current settings)" in note_of(study, baseline)[0]


def test_an_artifact_directory_that_takes_no_files_stops_the_run_before_any_trial(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    path = script_study(tmp_path, SCRIPT_STUDY, WORKLOADS / "kt_script.py", trials=1)
    proc = knobtune("run", str(path), *FAST, "--artifacts", str(blocker / "artifacts"), cwd=tmp_path, check=2)
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert f"artifact directory {blocker / 'artifacts'}: not writable" in proc.stderr
    assert "trial #" not in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_dashboard_shows_the_story_metric_and_artifacts_in_chromium(watched: Path, tmp_path: Path):
    from browser import browser_page, chromium_or_skip

    chromium_or_skip()
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "knobtune", "dashboard", "--port", str(port)], cwd=watched,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.communicate()[0]
                time.sleep(0.2)
        study = stored(watched, "watched")
        sid = study._study_id
        base = f"http://127.0.0.1:{port}/dashboard/studies/{sid}"
        with browser_page() as (page, console_errors):
            page.goto(f"{base}/note")
            page.get_by_text("Written by knobtune").wait_for(timeout=30000)
            text = page.inner_text("body")
            assert "Best so far" in text and "knobtune export watched" in text
            page.screenshot(path=str(tmp_path / "dashboard-note.png"), full_page=True)
            page.goto(base)
            page.get_by_text("samples/s").first.wait_for(timeout=30000)  # the objective's name, not "Objective 0"
            assert "Objective 0" not in page.inner_text("body")
            page.goto(f"{base}/trials")
            page.get_by_text("trial-0-request.json").wait_for(timeout=30000)
            page.screenshot(path=str(tmp_path / "dashboard-trial.png"), full_page=True)
            href = page.eval_on_selector_all(
                "a[href*='/artifacts/']", "els => els.map(e => e.getAttribute('href'))")
            assert len(href) >= 3
            downloaded = [page.request.get(f"http://127.0.0.1:{port}{h}") for h in href]
            assert all(r.ok for r in downloaded)
            requests = [json.loads(r.body()) for r in downloaded if r.headers["content-type"] == "application/json"]
            assert requests and requests[0]["knobs"]["batch_size"] in (16, 32)
            assert not console_errors, console_errors
        assert (tmp_path / "dashboard-note.png").stat().st_size > 0
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_notes_are_in_the_dashboards_own_format_long_short_and_either_way():
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    storage, sid, tid = study._storage, study._study_id, study.trials[0]._trial_id
    long = "".join(f"line {i} of a long note\n" for i in range(400))  # several of the dashboard's chunks
    for trial_id in (None, tid):
        for version, body in enumerate((long, "now short", ""), start=1):
            notes._save(storage, sid, trial_id, body, version, storage.get_study_system_attrs(sid))
            attrs = storage.get_study_system_attrs(sid)
            assert note_of(study, None if trial_id is None else study.trials[0]) == (body, version)
            assert notes.read_note(attrs, trial_id) == (version, body)
    # and what the dashboard itself wrote (a user's note) is read as it reads it
    from optuna_dashboard._note import save_note_with_version

    save_note_with_version(storage, sid, tid, 9, long)
    assert notes.read_note(storage.get_study_system_attrs(sid), tid) == (9, long)


def test_writing_notes_leaves_the_environment_the_trial_children_get_unchanged():
    # optuna-dashboard's import (scikit-learn's) sets KMP_* variables: a run that imported it for its
    # first note passed them to every later child, and its warm server (one per environment) started
    # a second time
    probe = ("import os, sys, optuna; before = dict(os.environ); from knobtune.search.story import notes; "
             "study = optuna.create_study(storage=optuna.storages.InMemoryStorage()); "
             "notes.publish(study, 'sqlite:///x.db'); "
             "print(sorted(set(os.environ.items()) ^ set(before.items())), 'sklearn' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KMP_")}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[] False"
