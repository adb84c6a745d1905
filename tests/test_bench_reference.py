"""The search benchmark's reference and its own spread (benchmarks/_bench.py): what the grid can
and cannot tell apart, on made-up grids whose answer is known."""
from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from _bench import reference_spread, settled, split_best  # noqa: E402

A, B, C, LOW = (("batch_size", 256),), (("batch_size", 128),), (("batch_size", 64),), (("batch_size", 512),)


def passes(level: float, rng: random.Random, accuracy: float = 0.95, n: int = 8) -> list[tuple[float, float]]:
    return [(level * rng.uniform(0.6, 1.4), accuracy) for _ in range(n)]


def test_ties_cannot_be_told_apart_a_clear_loser_and_a_config_under_the_floor_can():
    rng = random.Random(1)
    measured = {A: passes(100, rng), B: passes(99, rng), C: passes(55, rng), LOW: passes(120, rng, accuracy=0.80)}
    spread = reference_spread(measured, {}, floor=0.9)
    assert LOW not in spread  # under the accuracy floor: never the best, never a candidate
    assert spread[A][1] >= 0.95 and spread[B][1] >= 0.95  # a tie within the passes' noise
    assert 0 < spread[A][2] < 1 and 0 < spread[B][2] < 1
    low, high, share = spread[C]
    assert high < 0.95 and share == 0.0
    assert all(0 <= lo <= hi <= 1 for lo, hi, _ in spread.values())


def test_paired_rounds_separate_what_the_drifting_passes_could_not():
    # the passes ran minutes apart on a drifting machine: A and B overlap there. In every paired round
    # B ran at 0.85 of A whatever the round's level: the reference, resampled round by round, keeps that.
    rng = random.Random(2)
    measured = {A: passes(100, rng), B: passes(95, rng), C: passes(40, rng)}
    levels = [rng.uniform(50, 150) for _ in range(8)]
    top = {A: [(x, 0.95) for x in levels], B: [(0.85 * x, 0.95) for x in levels]}
    spread = reference_spread(measured, top, floor=0.9)
    assert spread[A] == (1.0, 1.0, 1.0)
    assert spread[B][:2] == pytest.approx((0.85, 0.85)) and spread[B][2] == 0.0
    # without the paired rounds the passes alone cannot tell them apart
    assert reference_spread(measured, {}, floor=0.9)[B][1] >= 0.95


def test_the_split_best_is_not_inflated_by_the_luck_of_the_rounds_that_chose_it():
    # six configurations equal in truth, eight paired rounds of independent noise: the fastest by all
    # eight rounds overstates their common rate; chosen on half the rounds and measured on the other,
    # the best's rate is the common rate, up to the noise of four rounds
    configs = [(("batch_size", b),) for b in (16, 32, 64, 128, 256, 512)]
    inflated, split = [], []
    for seed in range(200):
        rng = random.Random(seed)
        rounds = {k: [(100 * rng.uniform(0.8, 1.2), 0.95) for _ in range(8)] for k in configs}
        table = {k: (100.0, 0.95) for k in configs}
        whole = settled(table, rounds, rounds)
        inflated.append(max(whole[k][0] for k in configs))
        got = split_best(table, rounds, rounds, floor=0.9)
        assert got is not None and all(k in configs for k in got[1])
        split.append(got[0])
    assert statistics.fmean(inflated) > 104  # the winner's curse, on this noise
    assert abs(statistics.fmean(split) - 100) < 2


def test_the_split_best_keeps_a_clear_winner_and_skips_what_fails_the_floor():
    rng = random.Random(3)
    levels = [rng.uniform(50, 150) for _ in range(8)]
    rounds = {A: [(x, 0.95) for x in levels], B: [(0.8 * x, 0.95) for x in levels],
              LOW: [(1.5 * x, 0.80) for x in levels]}
    table = {k: (statistics.median(r for r, _ in v), 0.95 if k != LOW else 0.80) for k, v in rounds.items()}
    rate, chosen = split_best(table, rounds, rounds, floor=0.9)
    assert chosen == [A, A]
    assert rate == pytest.approx(settled(table, rounds, rounds)[A][0], rel=0.01)
    assert split_best(table, {k: v[:1] for k, v in rounds.items()}, rounds, floor=0.9) is None


def test_a_grid_file_is_read_only_with_the_bursts_it_was_measured_with(tmp_path):
    import json

    from search_quality import _read_grid, _write_grid

    path = tmp_path / "grid.json"
    runs = {A: [(100.0, 0.95)], B: [(90.0, 0.96)]}
    _write_grid(path, "tensorflow", "space", 48000, runs, {})
    assert _read_grid(path, "tensorflow", "space", 48000, {A: [], B: []}) == (runs, {})
    with pytest.raises(SystemExit, match="bursts of 48,000 samples, not 16,000: pass --train-samples 48000"):
        _read_grid(path, "tensorflow", "space", 16000, {A: [], B: []})
    assert json.loads(path.read_text())["runs"]  # refused, not overwritten
    older = json.loads(path.read_text())
    del older["train_samples"]  # grids measured before the option: the common burst
    path.write_text(json.dumps(older))
    assert _read_grid(path, "tensorflow", "space", 16000, {A: [], B: []}) == (runs, {})
    with pytest.raises(SystemExit, match="16,000 samples, not 48,000"):
        _read_grid(path, "tensorflow", "space", 48000, {A: [], B: []})
