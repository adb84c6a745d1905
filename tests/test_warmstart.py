"""Warm start from earlier studies, end to end through the real CLI on tiny bursts: the sources'
winners and top trials queued right after the baseline, clipped to this space, deduplicated,
never queued twice; and each refusal (exit 2, one line)."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import FrozenTrial

from knobtune.search.story import results
from knobtune.search.study.warmstart import clip
from knobtune.spaces import for_framework

from conftest import FAST, TINY_BURST, knobtune, stored, study_file
from recorded import rebuild

# Two knobs searched, the rest fixed: the sources' configurations are batch_size x intra_op_threads.
SOURCE = """
[study]
name = "first"
framework = "pytorch"
workload = "kt_test_workloads:tiny"
trials = 3
seed = 1
prune_below = 0
{burst}
[confirm]
top_k = 1
repeats = 1
noisy_repeats = 1
[space]
batch_size = [16, 32]
intra_op_threads = [0, 1]
num_workers = [0]
amp = ["off"]
accumulation_steps = [1]
compile = ["off"]
"""

# The second model: other batch sizes (16 -> 20, 32 -> 40 when clipped), a baseline of 40 with
# torch's default threads, which is the first study's baseline once clipped (a duplicate to drop).
SECOND = """
[study]
name = "second"
framework = "pytorch"
workload = "kt_test_workloads:tiny"
trials = {trials}
seed = 1
prune_below = 0
{warm}
{burst}
[baseline]
batch_size = 40
[space]
batch_size = [8, 20, 40]
intra_op_threads = [0, 1]
num_workers = [0]
amp = ["off"]
accumulation_steps = [1]
compile = ["off"]
"""
CLIPPED = {16: 20, 32: 40}


def second(tmp: Path, warm: str = 'warm_start = ["first", "again"]', trials: int = 4) -> Path:
    return study_file(tmp, SECOND.format(trials=trials, warm=warm, burst=TINY_BURST), "second.toml")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two finished sources in one storage: "first" (confirmed) and "again" (the same study file
    under another name, unconfirmed: the same configurations, its own measurements)."""
    tmp = tmp_path_factory.mktemp("warm")
    path = study_file(tmp, SOURCE.format(burst=TINY_BURST), "first.toml")
    knobtune("run", str(path), "--no-diagnose", cwd=tmp, check=0)
    knobtune("run", str(path), "--name", "again", *FAST, cwd=tmp, check=0)
    return tmp


def expected_queue(tmp: Path, names: list[str]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(params, origin) the second study should queue: every source's winner, then each one's
    other feasible trials by samples/s, their batch sizes clipped, each configuration once, the
    second study's own baseline left out (both spaces are the same but for batch_size)."""
    ranked = []
    for name in names:
        src = stored(tmp, name)
        winner = results.best(src)
        role = "confirmed winner" if results.confirmation(src) else "best"
        others = sorted((t for t in results.feasible(src) if t.number != winner.number), key=results.rate, reverse=True)
        ranked.append([(winner, role, name)] + [(t, "top", name) for t in others[:3]])
    order = [r[0] for r in ranked] + [c for r in ranked for c in r[1:]]
    seen = [stored(tmp, "second").trials[0].params]
    out = []
    for trial, role, name in order:
        batch = trial.params["batch_size"]
        params = {**trial.params, "batch_size": CLIPPED[batch]}
        if params in seen:
            continue
        seen.append(params)
        out.append((params, {"study": name, "trial": trial.number, "role": role,
                             "clipped": {"batch_size": [batch, CLIPPED[batch]]}}))
    return out


def config(trial: FrozenTrial) -> dict[str, Any]:
    """What a trial measures or was queued to measure."""
    return dict(trial.system_attrs.get("fixed_params") or trial.params)


@pytest.fixture(scope="module")
def warmed(sources: Path) -> tuple[Path, subprocess.CompletedProcess]:
    proc = knobtune("run", str(second(sources)), *FAST, cwd=sources, check=0)
    return sources, proc


def test_sources_winners_then_top_trials_come_first_clipped_and_deduplicated(warmed):
    tmp, proc = warmed
    expected = expected_queue(tmp, ["first", "again"])
    assert expected, "the sources have feasible trials besides the clipped baseline"
    trials = stored(tmp, "second").trials
    assert trials[0].user_attrs["is_baseline"] and "warm_start_from" not in trials[0].user_attrs
    warm = trials[1:1 + len(expected)]
    assert [t.params for t in warm] == [p for p, _ in expected]
    assert [t.user_attrs["warm_start_from"] for t in warm] == [o for _, o in expected]
    assert all(t.user_attrs["source"] == "warm-start" for t in warm)
    # the first study's winner leads unless it is the baseline's configuration (a duplicate here)
    winner = results.best(stored(tmp, "first"))
    if winner.number != results.baseline(stored(tmp, "first")).number:
        assert warm[0].user_attrs["warm_start_from"] == {"study": "first", "trial": winner.number,
                                                         "role": "confirmed winner",
                                                         "clipped": {"batch_size": [32, 40]} if winner.params[
                                                             "batch_size"] == 32 else {"batch_size": [16, 20]}}
    # the baseline of both sources clips to this study's baseline: never queued; "again" repeats "first"
    assert all(t.params != trials[0].params for t in warm)
    assert all("warm_start_from" not in t.user_attrs for t in trials[1 + len(expected):])
    candidates = 2 + sum(min(3, len(results.feasible(stored(tmp, n))) - 1) for n in ("first", "again"))
    line = f"warm start: {len(expected)} configuration(s) queued from first, again ({candidates - len(expected)} " \
           f"duplicate(s) dropped)"
    assert line in proc.stderr
    assert "[warm start: " in proc.stderr  # the trial lines say where a configuration came from
    assert stored(tmp, "second").user_attrs["warm_start"] == {"sources": ["first", "again"]}


def test_warm_start_from_is_not_part_of_the_measurement_key(warmed):
    tmp, _ = warmed
    attrs = stored(tmp, "second").user_attrs
    assert attrs["definition"]["study"]["warm_start"] == ["first", "again"]
    assert "warm_start" not in str(attrs["measurement"])


def test_a_resumed_study_does_not_queue_its_sources_again(warmed):
    tmp, _ = warmed
    before = [t.number for t in stored(tmp, "second").trials if "warm_start_from" in t.user_attrs]
    # the flag replaces the file's list: a source named again and one already used add nothing
    proc = knobtune("run", str(second(tmp, trials=5)), "--warm-start", "again,first", *FAST, cwd=tmp, check=0)
    study = stored(tmp, "second")
    assert [t.number for t in study.trials if "warm_start_from" in t.user_attrs] == before
    assert "warm start:" not in proc.stderr
    assert len(results.finished(study)) == 5


def test_a_new_source_on_resume_is_deduplicated_against_the_trials_measured(sources: Path, warmed):
    tmp = sources
    copy = study_file(tmp, SOURCE.format(burst=TINY_BURST).replace('name = "first"', 'name = "third"'), "third.toml")
    knobtune("run", str(copy), *FAST, cwd=tmp, check=0)  # (the same configurations as "first" again)
    study = stored(tmp, "second")
    known = [t.params for t in results.finished(study)]
    fresh = [p for p, _ in expected_queue(tmp, ["third"]) if p not in known]
    proc = knobtune("run", str(second(tmp, trials=len(known) + max(1, len(fresh)))), "--warm-start", "third", *FAST,
                    cwd=tmp, check=0)
    queued = [t for t in stored(tmp, "second").trials if (t.user_attrs.get("warm_start_from") or {}).get("study") == "third"]
    assert [config(t) for t in queued] == fresh  # (each measured: the count leaves room)
    assert f"warm start: {len(fresh)} configuration(s) queued from third" in proc.stderr


def test_refusals_say_what_was_given_and_expected(warmed):
    tmp, _ = warmed  # (the storage holds "second" too: the listing below names it)
    rebuild("mlp-tensorflow", f"sqlite:///{tmp / 'knobtune.db'}", as_name="tf-study")
    diverging = study_file(tmp, SOURCE.format(burst=TINY_BURST).replace('name = "first"', 'name = "nan-study"')
                           .replace('"kt_test_workloads:tiny"', '"kt_test_workloads:diverge"') + "[workload]\nafter = 0\n",
                           "nan.toml")
    knobtune("run", str(diverging), *FAST, cwd=tmp, check=1)  # its baseline's loss is not finite
    cases = {
        "nope": "warm start from 'nope': no such study in this storage; expected one of its studies: ",
        "tf-study": "warm start from 'tf-study': it is a tensorflow study, this one is pytorch; expected a pytorch study",
        "nan-study": "warm start from 'nan-study': it has no finished trial that passed its guards (1 nan); expected "
                     "a study with at least one feasible trial",
        "fresh": "warm start from 'fresh': that is this study itself; expected the name of another, finished study",
    }
    for source, message in cases.items():
        path = second(tmp, warm=f'warm_start = ["first", "{source}"]')
        proc = knobtune("run", str(path), "--name", "fresh", *FAST, cwd=tmp, check=2)
        assert proc.stderr.startswith(f"knobtune: error: {message}"), proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert "probing" not in proc.stderr  # refused before anything runs
    listing = knobtune("run", str(second(tmp)), "--name", "fresh", "--warm-start", "nope", *FAST, cwd=tmp, check=2)
    listed = listing.stderr.split("expected one of its studies: ")[1].strip().split(", ")
    assert {"first", "again", "second", "tf-study", "nan-study"} <= set(listed)


def test_study_file_errors():
    from knobtune.search.errors import UserError
    from knobtune.search.study import definition

    base = '[study]\nframework = "pytorch"\nworkload = "digits-mlp"\nname = "x"\n'
    assert definition.parse(base + 'warm_start = ["a", "b", "a"]\n').study.warm_start == ("a", "b")
    assert definition.parse(base).study.warm_start_top_k == 3
    for line, expected in (('warm_start = "a"', "[study] warm_start must be an array of names of earlier studies"),
                           ('warm_start = ["a", 3]', "[study] warm_start must be study names (non-empty strings)"),
                           ("warm_start_top_k = -1", "[study] warm_start_top_k must be an integer >= 0, got -1")):
        with pytest.raises(UserError) as caught:
            definition.parse(base + line + "\n")
        assert expected in str(caught.value)


def test_clip_maps_numbers_to_the_nearest_choice_and_leaves_other_values_to_the_sampler():
    space = for_framework("pytorch")
    cpu = {"hardware": {"device": "cpu", "cuda": False, "bf16": True, "usable_cores": 2},
           "workload": {"batch_size": 64, "conv": False}}
    offer = space.offer(cpu, {"batch_size": [32, 64, 128], "compile": ["off", "default"]}, {})
    params, changed = clip(space, offer, {"batch_size": 96, "num_workers": 8, "compile": "reduce-overhead",
                                          "amp": "bf16", "intra_op_threads": 1, "prefetch_factor": 4,
                                          "persistent_workers": True})
    assert params["batch_size"] == 64  # a tie between 64 and 128: the smaller
    assert params["num_workers"] == 2 and params["prefetch_factor"] == 4 and params["persistent_workers"] is True
    assert "compile" not in params and changed["compile"] == ["reduce-overhead", None]  # left to the sampler
    assert changed["batch_size"] == [96, 64] and changed["num_workers"] == [8, 2]
    assert params["amp"] == "bf16" and "amp" not in changed
    # a knob inactive once clipped (no workers: no prefetch) is not queued
    params, _ = clip(space, offer, {"num_workers": 0, "prefetch_factor": 4})
    assert "prefetch_factor" not in params and params["num_workers"] == 0
