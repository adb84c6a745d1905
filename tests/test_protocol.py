"""The measurement protocol's framework-free half: schedule, timing windows, guard stop."""
from __future__ import annotations

import math

import pytest

from knobtune.trainers.common.errors import InvalidKnobs
from knobtune.trainers.common.protocol import GuardReading, drive, make_schedule
from knobtune.trainers.common.wire import Burst


@pytest.mark.parametrize("batch, accum", [(32, 1), (64, 1), (64, 2), (100, 4), (512, 1), (7, 3)])
def test_schedule_covers_the_samples_in_equal_aligned_windows(batch: int, accum: int):
    spec = Burst(train_samples=12000, warmup_samples=2000, windows=5)
    s = make_schedule(spec, batch, accum)
    assert s.total_steps * batch >= spec.train_samples > (s.total_steps - 1) * batch
    assert s.warmup_steps * batch >= spec.warmup_samples
    assert s.warmup_steps % accum == 0  # warm-up ends on an optimizer step
    lengths = [b - a for a, b in zip(s.boundaries, s.boundaries[1:])]
    assert len(lengths) == 5 and s.window_ends[-1] == s.total_steps
    assert len(set(lengths[:-1])) == 1 and lengths[-1] >= lengths[0]
    if lengths[0] >= accum:
        assert all(length % accum == 0 for length in lengths[:-1])


@pytest.mark.parametrize("batch, accum, execution", [(64, 1, 4), (64, 2, 3), (32, 4, 8), (100, 1, 16)])
def test_boundaries_fall_on_executions(batch: int, accum: int, execution: int):
    spec = Burst(train_samples=12000, warmup_samples=2000, windows=5)
    s = make_schedule(spec, batch, accum, execution)
    assert s.total_steps % execution == 0
    assert all(b % execution == 0 for b in s.boundaries)
    assert s.warmup_steps % accum == 0


def test_drive_runs_whole_executions():
    spec = Burst(train_samples=1600, warmup_samples=400, windows=3)
    schedule = make_schedule(spec, 100, 1, 4)  # 16 steps: warm-up 4, then windows of 4
    calls = []

    def step(first: int, count: int) -> int:
        calls.append((first, count))
        return 100 * count

    record = drive(schedule, step, lambda: GuardReading(True, None, 1.0))
    assert calls == [(0, 4), (4, 4), (8, 4), (12, 4)]
    assert record.warmup_samples == 400 and [s for s, _ in record.windows] == [400, 400, 400]


def test_burst_too_short_is_invalid():
    with pytest.raises(InvalidKnobs, match="burst too short"):
        make_schedule(Burst(train_samples=1000, warmup_samples=500, windows=5), 256)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_drive_times_windows_and_takes_the_median():
    clock = FakeClock()
    spec = Burst(train_samples=1000, warmup_samples=200, windows=4)
    schedule = make_schedule(spec, 100)  # 10 steps: 2 warm-up, 4 windows of 2
    costs = iter([5.0, 5.0] + [1.0, 1.0] + [2.0, 2.0] + [1.0, 1.0] + [1.0, 3.0])

    def step(first: int, count: int) -> int:
        assert count == 1
        clock.now += next(costs)
        return 100

    checkpoints = []

    def checkpoint() -> GuardReading:
        checkpoints.append(clock.now)
        return GuardReading(True, None, 0.5)

    record = drive(schedule, step, checkpoint, clock=clock)
    m = record.measurement()
    assert len(checkpoints) == 5  # warm-up end + 4 windows: the only syncs
    assert m["warmup_seconds"] == 10.0
    assert m["window_rates"] == [100.0, 50.0, 100.0, 50.0]
    assert m["samples_per_second"] == 75.0
    assert m["samples_per_second_cv"] == pytest.approx(1 / 3)
    assert m["trained_samples"] == 1000 and m["final_loss"] == 0.5


def test_drive_stops_at_the_boundary_after_a_non_finite_loss():
    schedule = make_schedule(Burst(train_samples=1000, warmup_samples=200, windows=4), 100)
    state = {"bad": None}

    def step(first: int, count: int) -> int:
        if first == 5 and state["bad"] is None:
            state["bad"] = first
        return 100

    def checkpoint() -> GuardReading:
        return GuardReading(state["bad"] is None, state["bad"], 0.1)

    record = drive(schedule, step, checkpoint)
    assert record.nan_step == 5
    assert record.steps_done == 6  # the window holding step 5 ends at step 6; nothing after
    assert record.measurement()["nan_step"] == 5


def _drive(schedule, drained=None, clock=None):
    def step(first: int, count: int) -> int:
        if clock is not None:
            clock.now += count
        return schedule.batch_size * count

    return drive(schedule, step, lambda: GuardReading(True, None, 0.1), clock=clock or FakeClock(), drained=drained)


def test_settle_trains_through_the_read_ahead_until_the_pipeline_is_drained():
    spec = Burst(train_samples=4000, warmup_samples=400, windows=3)
    schedule = make_schedule(spec, 100, read_ahead=6)  # 40 steps: warm-up 4, then settle, then windows
    assert (schedule.read_ahead, schedule.settle_max) == (6, 12)
    answers = iter([False, False, True])  # drained after the third settle step
    record = _drive(schedule, drained=lambda: next(answers), clock=FakeClock())
    assert record.settle_samples == 300 and record.settle_drained is True and record.unsettled is None
    assert record.settle_seconds == 3.0  # timed apart, like the warm-up
    samples = [s for s, _ in record.windows]
    assert len(samples) == 3 and sum(samples) == 4000 - 400 - 300  # the settle came out of the windows
    assert record.warmup_samples + record.settle_samples + sum(samples) == record.samples_done == 4000


def test_settle_without_a_drain_signal_takes_the_read_ahead():
    schedule = make_schedule(Burst(train_samples=4000, warmup_samples=400, windows=3), 100, read_ahead=6)
    record = _drive(schedule, drained=lambda: None)
    assert record.settle_samples == 600 and record.settle_drained is None and record.unsettled is None
    assert "settle_drained" not in record.measurement()


def test_a_pipeline_never_drained_stops_at_twice_its_read_ahead():
    schedule = make_schedule(Burst(train_samples=4000, warmup_samples=400, windows=3), 100, read_ahead=6)
    record = _drive(schedule, drained=lambda: False, clock=FakeClock())
    # (it nearly keeps up with the training: what is left barely inflates the windows)
    assert record.settle_samples == 1200 and record.settle_drained is False and record.unsettled is None
    # a burst with no room for twice the read-ahead says so, with the train_samples that has room
    schedule = make_schedule(Burst(train_samples=2000, warmup_samples=400, windows=3), 100, read_ahead=6)
    record = _drive(schedule, drained=lambda: False, clock=FakeClock())
    unsettled = record.measurement()["unsettled"]
    assert unsettled["read_ahead_batches"] == 6 and unsettled["settled_batches"] == schedule.settle_max < 12
    assert unsettled["suggested_train_samples"] > 2000


def test_a_read_ahead_larger_than_the_burst_leaves_two_steps_per_window_and_is_reported():
    schedule = make_schedule(Burst(train_samples=2000, warmup_samples=400, windows=3), 100, read_ahead=50)
    assert schedule.settle_max == 20 - 4 - 3 * 2  # each window keeps two steps
    record = _drive(schedule, drained=lambda: None, clock=FakeClock())
    assert [s for s, _ in record.windows] == [200, 200, 200]
    assert record.measurement()["unsettled"]["suggested_train_samples"] > 2000


@pytest.mark.parametrize("accum, execution", [(2, 1), (1, 4), (2, 3)])
def test_settle_ends_on_optimizer_steps_and_executions(accum: int, execution: int):
    schedule = make_schedule(Burst(train_samples=9600, warmup_samples=800, windows=3), 100, accum, execution,
                             read_ahead=5)
    answers = iter([False, True, True, True])
    record = _drive(schedule, drained=lambda: next(answers, True), clock=FakeClock())
    settled = record.settle_samples // 100
    assert settled > 0 and settled % math.lcm(accum, execution) == 0
    assert [s % (100 * execution) for s, _ in record.windows] == [0, 0, 0]


def test_no_warm_up_settles_from_the_first_step():
    schedule = make_schedule(Burst(train_samples=2000, warmup_samples=0, windows=2), 100, read_ahead=2)
    record = _drive(schedule, drained=lambda: None, clock=FakeClock())
    assert record.warmup_samples == 0 and record.settle_samples == 200 and len(record.windows) == 2


def test_a_data_parallel_trials_ranks_read_disjoint_equal_shards_of_the_same_seeded_order():
    from knobtune.trainers.pytorch.data import SeededSampler

    whole = list(SeededSampler(10, seed=3))
    shards = [list(SeededSampler(10, seed=3, rank=r, ranks=3)) for r in range(3)]
    assert [len(s) for s in shards] == [3, 3, 3]  # the tail that does not divide is left out, on every rank
    assert [int(i) for i in shards[1]] == [int(i) for i in whole[1:9:3]]  # every 3rd draw, from its own
    assert len({int(i) for s in shards for i in s}) == 9
    # each draw keeps the augmentation seed it has in the one-process order
    assert [i.seed for i in shards[2]] == [i.seed for i in whole[2:9:3]]
