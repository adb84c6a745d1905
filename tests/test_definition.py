"""Study files: valid ones parse, bad ones give one clear line and exit 2."""
from __future__ import annotations

from pathlib import Path

import pytest

from knobtune.search.errors import UserError
from knobtune.search.study import definition

from conftest import ROOT, knobtune, study_file

HEAD = '[study]\nframework = "pytorch"\nworkload = "digits-mlp"\n'


def parse(text: str):
    return definition.parse(text, source="s.toml", default_name="s")


def error(text: str) -> str:
    with pytest.raises(UserError) as info:
        parse(text)
    return str(info.value)


def test_shipped_studies_parse():
    files = sorted((ROOT / "studies").glob("*.toml"))
    assert files
    for path in files:
        d = definition.load(path)
        assert d.study.name and d.study.framework in ("pytorch", "tensorflow")


def test_defaults_and_name_from_file():
    d = parse(HEAD)
    assert d.study.name == "s"
    assert (d.burst.train_samples, d.burst.warmup_samples, d.burst.windows) == (12000, 2000, 5)
    assert d.guard.max_accuracy_drop == 0.02
    assert d.study.trials == 20


def test_not_toml_says_the_line():
    msg = error(HEAD + "[burst\ntrain_samples = 1\n")
    assert "not valid TOML" in msg and "line 4" in msg


def test_unknown_key_names_the_allowed_ones():
    msg = error(HEAD + "[burst]\ntrain_sample = 100\n")
    assert "'train_sample'" in msg and "train_samples, warmup_samples, windows, timeout_s" in msg


def test_unknown_section():
    msg = error(HEAD + "[bursts]\n")
    assert "[bursts]" in msg and "allowed: study, burst, guard" in msg


def test_unknown_knob_names_the_knobs():
    msg = error(HEAD + "[space]\nnum_worker = [0, 1]\n")
    assert "'num_worker'" in msg and "num_workers" in msg and "batch_size" in msg


@pytest.mark.parametrize(
    "body, expected",
    [
        ("[space]\nbatch_size = [0]\n", "batch_size: must be >= 1, got 0"),
        ("[space]\nnum_workers = [-1]\n", "num_workers: must be >= 0, got -1"),
        ("[space]\nbatch_size = 64\n", "must be a non-empty array"),
        ("[space]\nbatch_size = []\n", "must be a non-empty array"),
        ("[space]\npin_memory = [1]\n", "expected true or false, got 1"),
        ("[space]\namp = ['fp8']\n", "expected one of 'off', 'bf16', 'fp16'"),
        ("[baseline]\nbatch_size = 'big'\n", "expected an integer, got 'big'"),
        ("[burst]\ntrain_samples = 'many'\n", "train_samples must be an integer >= 1, got string"),
        ("[burst]\ntrain_samples = 100\nwarmup_samples = 100\n", "warmup_samples must be"),
        ("[burst]\nwindows = 0\n", "windows must be an integer >= 1"),
        ("[guard]\nmax_accuracy_drop = 2\n", "between 0 and 1"),
    ],
)
def test_wrong_types_and_impossible_ranges(body: str, expected: str):
    assert expected in error(HEAD + body)


def test_unknown_framework_and_workload_list_the_builtins():
    assert "expected one of pytorch, tensorflow" in error('[study]\nframework = "jax"\nworkload = "x"\n')
    msg = error('[study]\nframework = "pytorch"\nworkload = "digits"\n')
    assert "charlm, digits-cnn, digits-mlp, digits-resnet, mnist-mlp" in msg and "package.module:factory" in msg


def test_builtin_names_match_the_trainer_registry():
    from knobtune.trainers.common.names import BUILTIN_WORKLOADS
    from knobtune.trainers.pytorch.builtin import WORKLOADS

    assert sorted(WORKLOADS) == sorted(BUILTIN_WORKLOADS["pytorch"])


def test_measurement_key_ignores_trials_and_timeout():
    a = parse(HEAD + "trials = 3\n[burst]\ntimeout_s = 10\n")
    b = parse(HEAD + "trials = 9\n[burst]\ntimeout_s = 99\n")
    c = parse(HEAD + "[burst]\ntrain_samples = 9999\n")
    assert a.measurement_key() == b.measurement_key() != c.measurement_key()
    assert definition.from_dict(a.as_dict()).measurement_key() == a.measurement_key()


@pytest.mark.parametrize(
    "body, expected",
    [
        ("[study\n", "is not valid TOML"),
        (HEAD + "colour = 'red'\n", "unknown key 'colour' in [study]"),
        (HEAD + "[space]\nbatch_size = [0]\n", "batch_size: must be >= 1, got 0"),
    ],
)
def test_cli_bad_study_file_is_one_line_exit_2(tmp_path: Path, body: str, expected: str):
    path = study_file(tmp_path, body)
    proc = knobtune("run", str(path), cwd=tmp_path, check=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "knobtune.db").exists()


def test_cli_missing_study_file(tmp_path: Path):
    proc = knobtune("run", "nope.toml", cwd=tmp_path, check=2)
    assert "study file nope.toml does not exist" in proc.stderr


def test_script_studies(tmp_path: Path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = study_file(tmp_path, '[study]\nframework = "pytorch"\nscript = "train.py"\nargs = ["--epochs", 3]\n')
    d = definition.load(path)
    assert d.study.script == str((tmp_path / "train.py").resolve()) and d.study.args == ("--epochs", "3")
    assert d.study.job == "script train.py --epochs 3" and d.measurement_key()["args"] == ["--epochs", "3"]
    assert definition.from_dict(d.as_dict()).as_dict() == d.as_dict()  # as stored in the study's attributes, and back
    missing = study_file(tmp_path, '[study]\nframework = "pytorch"\nscript = "nope.py"\n', "m.toml")
    with pytest.raises(UserError, match=r"\[study\] script 'nope.py': no such file"):
        definition.load(missing)


@pytest.mark.parametrize("body, expected", [
    ('[study]\nframework = "pytorch"\n', "needs exactly one of 'workload'"),
    (HEAD + 'script = "x.py"\n', "needs exactly one of 'workload'"),
    (HEAD + 'args = ["a"]\n', "args are a script's arguments; this study has no 'script'"),
    (HEAD + 'objective = "pareto"\n[guard]\naccuracy = false\n', "accuracy = false leaves nothing to judge"),
    (HEAD + '[guard]\naccuracy = 1\n', "[guard] accuracy must be true or false"),
    (HEAD + '[confirm]\nmin_speedup = -0.1\n', "[confirm] min_speedup must be a number >= 0"),
])
def test_script_and_guard_errors(body: str, expected: str):
    assert expected in error(body)


def test_nproc_is_a_number_of_ranks_or_auto_and_says_what_it_cannot_do():
    assert parse(HEAD + "nproc = 2\n").study.nproc == 2
    assert parse(HEAD + 'nproc = "auto"\n').study.nproc == "auto"
    assert parse(HEAD).study.nproc == 1 and "nproc" not in parse(HEAD).measurement_key()
    assert parse(HEAD + "nproc = 2\n").measurement_key()["nproc"] == 2  # a resume with another nproc is refused
    assert error(HEAD + "nproc = 0\n") == ('s.toml: [study] nproc must be an integer >= 1 (ranks or replicas per '
                                           'trial) or "auto" (one per visible GPU), got 0')
    assert "got 'many'" in error(HEAD + 'nproc = "many"\n')
    assert "[study] nproc must be an integer >= 1" in error(HEAD + "nproc = true\n")
    assert "evaluates between windows in one process" in error(
        HEAD + 'nproc = 2\nobjective = "time-to-accuracy"\ntarget_accuracy = 0.9\n')
    tf = parse('[study]\nframework = "tensorflow"\nworkload = "digits-mlp"\nnproc = 2\n').study
    assert tf.nproc == 2 and tf.members == "replicas"  # MirroredStrategy's, in one process
