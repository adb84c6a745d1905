"""The wire between the engine and a child: the request a study's Plan writes, read back as the
child reads it; the result's JSON kept whole; what either side refuses."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from knobtune.search.study import definition
from knobtune.search.study.objective import Plan
from knobtune.trainers.common.wire import Burst, Request, Result

TTA = """
[study]
framework = "pytorch"
workload = "digits-mlp"
seed = 3
objective = "time-to-accuracy"
target_accuracy = 0.5
eval_every_samples = 2500
[burst]
min_window_seconds = 0
[workload]
hidden = 64
"""


def test_a_plans_request_is_the_json_children_have_always_read():
    d = definition.parse(TTA, default_name="tta")
    plan = Plan(d, None, None, {"workload": {"train_samples": 1797}}, "/work")  # type: ignore[arg-type]
    request = plan.request({"batch_size": 32}, seed_offset=2)
    assert request.to_json() == {
        "workload": "digits-mlp", "workload_options": {"hidden": 64}, "script": None, "args": [],
        "knobs": {"batch_size": 32},
        "burst": {"train_samples": 12000, "warmup_samples": 2000, "windows": 4, "min_window_seconds": 0,
                  "seed": 5},
        "workdir": "/work", "lr_scale": 1.0, "train_records": 1797, "accuracy_required": True,
        "target_accuracy": 0.5,
    }
    read = Request.from_json(json.loads(json.dumps(request.to_json())))
    assert read == request and isinstance(read.burst.min_window_seconds, float)  # (the TOML's 0, a float)


def test_the_study_files_burst_is_the_childs_plus_its_timeout():
    d = definition.parse("[study]\nframework = 'pytorch'\nworkload = 'digits-mlp'\n[burst]\ntimeout_s = 60\n",
                         default_name="s")
    assert isinstance(d.burst, Burst) and d.burst.timeout_s == 60
    assert asdict(d.burst) == {**Burst().to_json(), "timeout_s": 60}  # the stored definition's keys


def test_a_request_with_a_key_the_child_does_not_know_is_refused():
    with pytest.raises(ValueError, match=r"request: unknown key\(s\) knob; expected .*knobs"):
        Request.from_json({"knob": {"batch_size": 32}})
    with pytest.raises(ValueError, match=r"request burst: unknown key\(s\) timeout_s"):
        Request.from_json({"burst": {"train_samples": 640, "timeout_s": 60}})
    with pytest.raises(ValueError, match="request: expected a JSON object, got list"):
        Request.from_json([])
    assert Request.from_json({"burst": {"train_samples": 640}}) == Request(burst=Burst(train_samples=640))


def test_a_results_json_comes_back_whole_with_keys_this_version_does_not_name():
    written = {"outcome": "ok", "samples_per_second": 812.5, "window_rates": [800.0, 825.0],
               "knobs_effective": {"batch_size": 32}, "a_new_detail": {"x": 1}}
    result = Result.from_json(written)
    assert result.samples_per_second == 812.5 and result.extra == {"a_new_detail": {"x": 1}}
    assert result.to_json() == written
    assert Result(error="bad workload").to_json() == {"error": "bad workload"}
