"""Writing a study's story into the storage, where optuna-dashboard shows it: the objectives'
names, the study note, and the notes of the trials that need one (search/story/findings.py says what).

Written after each trial, after the confirmation and after the diagnosis, so a dashboard open
during the run is current. Only notes whose text changed are written again.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import optuna

from knobtune.search.story import findings, results


def _note_api() -> Any:
    """optuna-dashboard's note functions. Importing them imports scikit-learn, which sets
    KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK in this process's environment for itself: they are
    put back as they were, or every later trial child would inherit them (and the warm server,
    started per environment, would be started a second time for the study's second trial)."""
    before = dict(os.environ)
    import optuna_dashboard._note as note

    for name in set(os.environ) - set(before):
        del os.environ[name]
    for name, value in before.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    return note


def _notes_of(storage: Any, study_id: int) -> dict[int | None, str]:
    get_note_from_system_attrs = _note_api().get_note_from_system_attrs

    attrs = storage.get_study_system_attrs(study_id)
    ids = {int(key.split(":")[1]) for key in attrs if key.startswith("dashboard:") and key.endswith(":note_ver")
           and key.count(":") == 2}
    out: dict[int | None, str] = {None: get_note_from_system_attrs(attrs, None)["body"]}
    for trial_id in ids:
        out[trial_id] = get_note_from_system_attrs(attrs, trial_id)["body"]
    return out


def _save(storage: Any, study_id: int, trial_id: int | None, body: str, version: int) -> None:
    _note_api().save_note_with_version(storage, study_id, trial_id, version, body)


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
    note = _note_api()
    get_note_from_system_attrs, note_ver_key = note.get_note_from_system_attrs, note.note_ver_key
    storage, study_id = study._storage, study._study_id
    current = _notes_of(storage, study_id)
    attrs = storage.get_study_system_attrs(study_id)
    wanted: dict[int | None, str] = {None: findings.to_markdown(findings.study_story(study, url, stage))}
    for trial in study.get_trials(deepcopy=False):
        if not trial.state.is_finished():
            continue
        blocks = findings.trial_story(study, trial, url)
        if blocks is not None or current.get(trial._trial_id):
            wanted[trial._trial_id] = findings.to_markdown(blocks) if blocks else ""
    for trial_id, body in wanted.items():
        if current.get(trial_id, "") != body:
            version = int(attrs.get(note_ver_key(trial_id), get_note_from_system_attrs(attrs, trial_id)["version"]))
            _save(storage, study_id, trial_id, body, version + 1)
    study.set_user_attr("roles", {str(n): role for n, role in findings.roles(study).items()})


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
