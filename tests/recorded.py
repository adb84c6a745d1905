"""Recorded studies: real runs saved as JSON (tests/data/*.json) and rebuilt into a fresh
storage, so the story, notes and report code is tested on real figures without running trials.

Record one from a finished run (the trials, their attributes, the study's attributes; not the
dashboard's notes):

    .venv/bin/python tests/recorded.py record sqlite:///knobtune.db STUDY tests/data/NAME.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.trial import TrialState, create_trial

DATA = Path(__file__).resolve().parent / "data"


def record(url: str, name: str, path: Path) -> None:
    study = optuna.load_study(study_name=name, storage=url)
    doc: dict[str, Any] = {
        "name": name, "directions": [d.name for d in study.directions], "user_attrs": study.user_attrs,
        "metric_names": study.metric_names,
        "trials": [{
            "state": t.state.name, "values": t.values, "params": t.params,
            "distributions": {k: distribution_to_json(v) for k, v in t.distributions.items()},
            "user_attrs": t.user_attrs,
            "constraints": t.constraints,
            "intermediate_values": {str(k): v for k, v in t.intermediate_values.items()},
        } for t in study.trials],
    }
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def rebuild(name: str, url: str, as_name: str | None = None) -> optuna.Study:
    """The recorded study ``tests/data/<name>.json`` in the storage at ``url`` (created, under
    its recorded name or ``as_name``)."""
    doc = json.loads((DATA / f"{name}.json").read_text())
    study = optuna.create_study(study_name=as_name or doc["name"], storage=url,
                                directions=[d.lower() for d in doc["directions"]])
    for key, value in doc["user_attrs"].items():
        study.set_user_attr(key, value)
    for entry in doc["trials"]:
        state = TrialState[entry["state"]]
        study.add_trial(create_trial(
            state=state, values=entry["values"] if state == TrialState.COMPLETE else None,
            params=entry["params"],
            distributions={k: json_to_distribution(v) for k, v in entry["distributions"].items()},
            user_attrs=entry["user_attrs"], constraints=entry["constraints"] or None,
            intermediate_values={int(k): v for k, v in entry["intermediate_values"].items()},
        ))
    return study


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "record":
        sys.exit("usage: tests/recorded.py record STORAGE_URL STUDY OUT.json")
    record(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
