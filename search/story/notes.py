"""Writing a study's story into the storage, where optuna-dashboard shows it: the objectives'
names, the study note, and the notes of the trials that need one (search/story/findings.py says what).

Written after each trial, after the confirmation and after the diagnosis, so a dashboard open
during the run is current. Only notes whose text changed are written again.
"""
from __future__ import annotations

import warnings
from typing import Any

import optuna

from knobtune.search.storage.record import mark_study
from knobtune.search.story import findings, results

# optuna-dashboard's note format (optuna_dashboard/_note.py, 0.20 and later): a version and the
# body in chunks, as study system attributes. Written here rather than through the dashboard's
# functions, whose import costs every run a second (it imports scikit-learn, which also sets
# KMP_* variables in this process's environment that every later trial child would inherit).
# tests/test_dashboard.py reads these notes back through the installed optuna-dashboard.
_CHUNK = 2045


def _version_key(trial_id: int | None) -> str:
    return "dashboard:note_ver" if trial_id is None else f"dashboard:{trial_id}:note_ver"


def _chunk_prefix(trial_id: int | None) -> str:
    return "dashboard:note_str:" if trial_id is None else f"dashboard:{trial_id}:note_str:"


def read_note(attrs: dict[str, Any], trial_id: int | None) -> tuple[int, str]:
    """The note of the study (``trial_id`` None) or of a trial: its version and body."""
    if _version_key(trial_id) not in attrs:
        return 0, ""
    prefix = _chunk_prefix(trial_id)
    count = sum(1 for key in attrs if key.startswith(prefix))
    return int(attrs[_version_key(trial_id)]), "".join(attrs[f"{prefix}{i}"] for i in range(count))


def _notes_of(attrs: dict[str, Any]) -> dict[int | None, str]:
    ids = {int(key.split(":")[1]) for key in attrs if key.startswith("dashboard:") and key.endswith(":note_ver")
           and key.count(":") == 2}
    return {trial_id: read_note(attrs, trial_id)[1] for trial_id in [None, *ids]}


def _save(storage: Any, study_id: int, trial_id: int | None, body: str, version: int, attrs: dict[str, Any]) -> None:
    storage.set_study_system_attr(study_id, _version_key(trial_id), version)
    prefix = _chunk_prefix(trial_id)
    chunks = [body[i:i + _CHUNK] for i in range(0, len(body), _CHUNK)]
    for i, chunk in enumerate(chunks):
        storage.set_study_system_attr(study_id, f"{prefix}{i}", chunk)
    for i in range(len(chunks), sum(1 for key in attrs if key.startswith(prefix))):
        storage.set_study_system_attr(study_id, f"{prefix}{i}", "")  # a shorter note: the old tail emptied


def name_metrics(study: optuna.Study) -> None:
    """Name the objectives (samples/s, val_accuracy, seconds to target) unless already named."""
    names = findings.metric_names(results.mode(study))
    if study.metric_names != names and len(names) == len(study.directions):
        with warnings.catch_warnings():  # experimental since Optuna 3.2, and what the dashboard reads
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)


def publish(study: optuna.Study, url: str, stage: str | None = None) -> None:
    """Write the study note and every trial note that changed (a trial that no longer needs
    one, a former "best so far", gets an empty note)."""
    storage, study_id = study._storage, study._study_id
    attrs = storage.get_study_system_attrs(study_id)
    current = _notes_of(attrs)
    wanted: dict[int | None, str] = {None: findings.to_markdown(findings.study_story(study, url, stage))}
    for trial in study.get_trials(deepcopy=False):
        if not trial.state.is_finished():
            continue
        blocks = findings.trial_story(study, trial, url)
        if blocks is not None or current.get(trial._trial_id):
            wanted[trial._trial_id] = findings.to_markdown(blocks) if blocks else ""
    for trial_id, body in wanted.items():
        if current.get(trial_id, "") != body:
            _save(storage, study_id, trial_id, body, read_note(attrs, trial_id)[0] + 1, attrs)
    mark_study(study, roles={str(n): role for n, role in findings.roles(study).items()})


_warned: set[str] = set()


def publish_safely(study: optuna.Study, url: str, stage: str | None, err: Any) -> None:
    """``publish``, in the middle of a search: a note that cannot be written is said once and
    the search goes on (the measurements matter more than their story)."""
    try:
        publish(study, url, stage)
    except Exception as exc:  # noqa: BLE001 - whatever the dashboard's note format or the storage raise
        text = f"{type(exc).__name__}: {exc}"
        if text not in _warned:
            _warned.add(text)
            err.write(f"knobtune: warning: the study's dashboard notes could not be written ({text}); the search "
                      f"goes on\n")
