"""Create or resume a study and run its trials, one at a time, in isolated children."""
from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, TextIO

import optuna
from optuna.trial import TrialState

from search import __version__, artifacts, notes, partition, results, runlock, story, workers
from search.definition import Definition
from search.errors import RunError, UserError
from search.confirm import confirm
from search.diagnose import diagnose_study
from search.lease import Lease
from search.objective import (Plan, Report, baseline_accuracies, duplicate_of, measure, measure_baseline,
                              prune_rule, suggest, tell, without_unexercised)
from search.partition import Partition
from search.probe import probe_study
from search.progress import Progress
from search.storage import is_sqlite, open_storage, redact, resolve_url
from search.workers import Sharing
from search.summary import study_summary, trial_line
from spaces import for_framework

# The fingerprint keys that must match for a resumed study's numbers to compare.
RANDOM_TRIES = 2000
HARDWARE_KEYS = ("cpu_model", "usable_cores", "gpus", "torch", "tensorflow", "cuda_version")


def make_sampler(definition: Definition, total_trials: int, parallel: bool = False,
                 seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The study's sampler; ``parallel`` when trials run at once (here or on other workers);
    ``seed`` overrides the study's (each worker of a shared study has its own)."""
    seed = definition.study.seed if seed is None else seed
    if definition.study.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(
        seed=seed,
        multivariate=True,
        group=True,  # conditional knobs (prefetch_factor only with workers) form their own groups
        n_startup_trials=max(3, min(10, total_trials // 3)),
        constant_liar=parallel,  # trials running at once: keep proposals apart
    )


def _hardware(fingerprint: dict[str, Any]) -> dict[str, Any]:
    return {k: fingerprint.get(k) for k in HARDWARE_KEYS if k in fingerprint}


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return diffs


def load_or_create(storage: Any, name: str, definition: Definition, fingerprint: dict[str, Any],
                   sampler: optuna.samplers.BaseSampler) -> tuple[optuna.Study, bool]:
    """The study called ``name``; an existing one must have the same definition and hardware."""
    try:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    except KeyError:
        try:
            study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                        directions=results.DIRECTIONS[definition.study.objective])
        except optuna.exceptions.DuplicatedStudyError:  # another worker created it just now
            return load_or_create(storage, name, definition, fingerprint, sampler)
        study.set_user_attr("definition", definition.as_dict())
        study.set_user_attr("measurement", definition.measurement_key())
        study.set_user_attr("fingerprint", fingerprint)
        study.set_user_attr("knobtune_version", __version__)
        return study, True
    attrs = study.user_attrs
    if "measurement" not in attrs:
        raise UserError(f"study {name!r} exists in this storage but was not made by knobtune; pick another --name")
    diffs = _differences(attrs["measurement"], definition.measurement_key())
    if diffs:
        raise UserError(
            f"study {name!r} exists with a different definition ({'; '.join(diffs[:3])}); its trials would not "
            f"compare with new ones: use --name for a new study"
        )
    diffs = _differences(_hardware(attrs.get("fingerprint", {})), _hardware(fingerprint))
    if diffs:
        share = attrs.get("partition") or {"jobs": 1}
        hint = (f"; its trials ran with --jobs {share['jobs']} ({share.get('share', 'the whole machine')}): pass the "
                f"same --jobs to resume it" if any(d.startswith(("usable_cores", "gpus")) for d in diffs) else "")
        raise UserError(
            f"study {name!r} was measured on different hardware or software ({'; '.join(diffs[:3])}){hint}; "
            f"or use --name for a new study on this machine"
        )
    return study, False


def _fail_stale(study: optuna.Study) -> int:
    """Trials left RUNNING by a run that died (this run holds the study's SQLite run lock, so no
    other run of it is live)."""
    stale = study.get_trials(deepcopy=False, states=[TrialState.RUNNING])
    for trial in stale:
        study._storage.set_trial_user_attr(trial._trial_id, "failure", "interrupted: its run ended without finishing it")
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    return len(stale)


def _enqueue_baseline(study: optuna.Study, plan: Plan) -> None:
    """Queue the baseline unless an ok baseline exists or one is already waiting.

    Nothing else is queued before a baseline has succeeded, so it is always the next trial.
    """
    base = results.baseline(study)
    # (a RUNNING one is another worker's, on a shared study: a dead run's was failed before this)
    queued = study.get_trials(deepcopy=False, states=[TrialState.WAITING, TrialState.RUNNING])
    if (base is None or base.user_attrs.get("outcome") != "ok") and not any(
        t.user_attrs.get("is_baseline") for t in queued
    ):
        params = plan.space.baseline_params(plan.offer, plan.ctx, plan.definition.baseline)
        study.enqueue_trial(params, user_attrs={"is_baseline": True, "source": "baseline"})


def _enqueue_advice(study: optuna.Study, plan: Plan) -> None:
    """Once per study, after its baseline succeeded: the seeds' advice applied by hand."""
    if study.user_attrs.get("advice_enqueued") or plan.definition.study.sampler != "tpe":
        return  # sampler = "random" is plain random search: no expert start
    study.set_user_attr("advice_enqueued", True)
    baseline = plan.space.baseline_params(plan.offer, plan.ctx, plan.definition.baseline)
    advice = plan.space.advice_params(plan.offer, plan.ctx, plan.definition.baseline)
    if advice != baseline:
        study.enqueue_trial(advice, user_attrs={"source": "advice"})


def _unmeasured(study: optuna.Study, plan: Plan, rng: random.Random,
                running: set[int] = frozenset()) -> dict[str, Any] | None:  # type: ignore[assignment]
    """Params of a random configuration no trial has measured, is measuring (``running``: this
    run's) or waits to measure (None if none is found)."""
    seen = [t.params for t in results.finished(study)]
    seen += [t.params for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if t.number in running]
    seen += [t.system_attrs.get("fixed_params", {}) for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    for _ in range(RANDOM_TRIES):
        params = plan.space.random_params(plan.offer, rng)
        if params not in seen:
            return params
    return None


def short_windows_note(number: int, short: dict[str, Any]) -> str:
    return (f"note: trial #{number}'s shortest window lasted {short['shortest_seconds'] * 1000:.0f} ms, under "
            f"[burst] min_window_seconds = {short['min_window_seconds']:g}: timing, queue transients and "
            f"allocator effects weigh on such windows; [burst] train_samples = {short['suggested_train_samples']} "
            f"would make them long enough (for a new study: --name)")


def unsettled_note(number: int, unsettled: dict[str, Any]) -> str:
    return (f"note: trial #{number}'s input pipeline held up to {unsettled['read_ahead_batches']} batches ahead, and "
            f"the burst had room to train through {unsettled['settled_batches']} before its windows: batches "
            f"loaded during warm-up may have inflated its rate (marked noisy); [burst] train_samples = "
            f"{unsettled['suggested_train_samples']} would leave room (for a new study: --name)")


BURST_NOTES = {"short_windows": short_windows_note, "unsettled": unsettled_note}


def resolution_warning(definition: Definition, eval_samples: int | None) -> str | None:
    """A warning when the guard is finer than a few images of the held-out split can resolve."""
    drop = definition.guard.max_accuracy_drop
    if not eval_samples or definition.study.objective == "time-to-accuracy":
        return None
    step = 1 / eval_samples
    if drop >= 3 * step:
        return None
    return (f"warning: [guard] max_accuracy_drop = {drop:g} is under 3 images' worth of the held-out split "
            f"({eval_samples} images: one image moves val_accuracy by {step:.4f}); good configurations will be "
            f"rejected at random: use max_accuracy_drop >= {3 * step:.3f} or a larger held-out split")


def _notes(plan: Plan, err: TextIO) -> None:
    for knob, dropped in plan.offer.dropped.items():
        for note in dropped:
            err.write(f"note: [space] {knob} {note}; not searched here\n")
    for knob, value in plan.definition.baseline.items():
        if knob in plan.offer.unavailable:
            err.write(f"note: [baseline] {knob}={value!r} does not apply here ({plan.offer.unavailable[knob]})\n")
        elif value not in plan.offer.choices.get(knob, [value]):
            err.write(f"note: [baseline] {knob}={value!r} cannot run here; the baseline uses the default\n")
    for knob, values in plan.offer.choices.items():
        if not values:
            raise UserError(f"[space] {knob}: none of its values can run on this machine")


def best_label(study: optuna.Study) -> tuple[str, int] | None:
    """The progress bar's "best so far": samples/s, or seconds to target."""
    best = results.searched_best(study)
    if best is None:
        return None
    if results.mode(study) == "time-to-accuracy":
        return f"{best.value:.2f} s to target", best.number
    return f"{results.rate(best):,.0f} samples/s", best.number


def make_plan(definition: Definition, info: dict[str, Any]) -> Plan:
    """What every trial of the study shares, for the probed hardware and workload."""
    ctx = {"hardware": info["fingerprint"]["hardware"], "workload": info["workload"]}
    space = for_framework(definition.study.framework)
    try:
        offer = space.offer(ctx, definition.space, definition.baseline, definition.effective_batch_size)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return Plan(definition, space, offer, ctx, os.getcwd())


def run(definition: Definition, storage_url: str | None = None, trials: int | None = None,
        timeout: float | None = None, name: str | None = None, out: TextIO = sys.stdout,
        err: TextIO = sys.stderr, confirm_winners: bool = True, diagnose: bool = True,
        artifacts_option: str | None = None, jobs: str | None = None, sharing: Sharing | None = None,
        worker_command: bool = False) -> int:
    """``knobtune run`` (and ``knobtune worker``): create or resume the study, run it to ``trials``
    finished trials, then confirm the winner against noise and diagnose the bottleneck (once per
    winner). The story (notes) and each trial's files (artifacts) go to the storage as it runs.
    On SQLite one run per study at a time: a second is refused (search/runlock.py). On a server
    database every process is a worker of a shared study: heartbeats, a study-wide trial count,
    confirmation and diagnosis by one of them (search/workers.py, search/lease.py)."""
    name = name or definition.study.name
    target = trials if trials is not None else definition.study.trials
    if target < 1:
        raise UserError(f"--trials must be >= 1, got {target}")
    url = resolve_url(storage_url, definition.study.storage)
    if worker_command and is_sqlite(url):
        raise UserError(
            f"knobtune worker needs a database server that every machine reaches (postgresql://user:password@host/db), "
            f"got {redact(url)}: an SQLite file belongs to one machine; there, knobtune run --jobs N runs several "
            f"trials at once")
    shared = None if is_sqlite(url) else (sharing or Sharing())
    if shared is None:
        storage = open_storage(url)
    else:  # a worker started while the database is away (a restart, a reboot of both) waits for it
        storage = workers.patiently(lambda: open_storage(url, shared), url, shared.db_retry_s,
                                    lambda line: err.write(line + "\n"))
    search = _Setup(definition, url, storage, name, target, out, err, shared)
    if shared is None:
        with runlock.hold(url, name):
            return search.run(timeout, confirm_winners, diagnose, artifacts_option, jobs)
    return search.run(timeout, confirm_winners, diagnose, artifacts_option, jobs)


def _share(slots: list[Partition | None]) -> dict[str, Any]:
    """What each trial of the study measured: the whole machine, or one of ``jobs`` equal shares."""
    first = slots[0]
    if first is None:
        return {"jobs": 1, "share": "the whole machine"}
    return {"jobs": len(slots), "cores_per_trial": len(first.cores), "gpus_per_trial": 1 if first.gpu else 0,
            "share": f"1/{len(slots)} of the machine: {len(first.cores)} core(s)" + (" and one GPU" if first.gpu else "")}


def _partition(definition: Definition, info: dict[str, Any], jobs_option: str | None,
               err: TextIO) -> tuple[list[Partition | None], dict[str, Any]]:
    """The run's slots (``--jobs``) and the probe of one share: what each trial will see."""
    gpus = partition.visible_gpus(len(info["fingerprint"].get("gpus") or []))
    cores = partition.machine_cores()
    groups = partition.physical_groups(cores)
    jobs = partition.jobs_count(jobs_option, gpus, len(groups))
    if jobs == 1:
        return [None], info
    parts = partition.plan(jobs, cores, gpus, groups)
    share = len(parts[0].cores)
    unused = len(cores) - share * jobs
    err.write(f"knobtune: {jobs} trials at once, each pinned to {share} core(s)"
              + (" and one GPU" if gpus else "") + (f" ({unused} core(s) left unused: the shares must be equal)"
                                                     if unused else "")
              + f"; each trial measures 1/{jobs} of this machine, and the winner is exported for that share "
                f"(what one rank of a data-parallel job gets)\n")
    return list(parts), probe_study(definition, err, parts[0])


def _wait_for(lease: Lease, what: str, patience_s: float = 120.0) -> None:
    """Claim ``lease``, waiting while another worker holds it (setting the study up takes seconds)."""
    deadline = time.monotonic() + patience_s
    while (holder := lease.claim()) is not None:
        if time.monotonic() > deadline:
            raise RunError(f"worker {holder} has held {what} for over {patience_s:g} s; if it is dead, its lease "
                           f"expires {lease.ttl.total_seconds():g} s after its last renewal: run again then")
        time.sleep(0.5)


class _Setup:
    """One ``knobtune run``/``worker`` process: probe, open or create the study, search, then
    confirm and diagnose (on a shared study: by whichever worker claims it first)."""

    def __init__(self, definition: Definition, url: str, storage: Any, name: str, target: int,
                 out: TextIO, err: TextIO, shared: Sharing | None) -> None:
        self.definition, self.url, self.storage, self.name, self.target = definition, url, storage, name, target
        self.out, self.err, self.shared = out, err, shared
        self.worker = workers.worker_id()

    def _lease(self, what: str, ttl_s: float) -> Lease:
        return Lease(self.storage.engine, f"{self.name}/{what}", self.worker, ttl_s)

    def run(self, timeout: float | None, confirm_winners: bool, diagnose: bool, artifacts_option: str | None,
            jobs_option: str | None) -> int:
        definition, url, name, err, target, shared = (self.definition, self.url, self.name, self.err,
                                                      self.target, self.shared)
        study_cfg = definition.study
        artifact_dir = artifacts.resolve(url, artifacts_option)
        artifact_store = artifacts.store(artifacts.prepare(artifact_dir)) if artifact_dir is not None else None
        info = probe_study(definition, err)
        slots, info = _partition(definition, info, jobs_option, err)
        fingerprint = info["fingerprint"]
        plan = make_plan(definition, info)
        _notes(plan, err)
        warning = resolution_warning(definition, info["workload"].get("eval_samples"))
        if warning:
            err.write(warning + "\n")

        seed = workers.sampler_seed(study_cfg.seed, self.worker) if shared else None
        sampler = make_sampler(definition, target, len(slots) > 1 or shared is not None, seed)
        setup = self._lease("setup", 60) if shared else None
        if setup is not None:
            _wait_for(setup, "the study's setup")
        try:
            study, created = load_or_create(self.storage, name, definition, fingerprint, sampler)
            if created:
                study.set_user_attr("partition", _share(slots))
            stale = _fail_stale(study) if not created and shared is None else _fail_unwatched(study, shared)
            if stale:
                err.write(f"note: marked {stale} trial(s) left running by an earlier run as failed\n")
            _enqueue_baseline(study, plan)
            notes.name_metrics(study)
        finally:
            if setup is not None:
                setup.release()
        measured_base = results.baseline(study)
        if measured_base is not None and measured_base.user_attrs.get("outcome") == "ok":  # resuming
            plan = _narrow(plan, measured_base.user_attrs.get("not_exercised"), None)
        done = len(results.finished(study))
        verb = "joining" if shared else "resuming"
        wl = info["workload"]
        err.write(
            f"knobtune: study {name!r} on {redact(url)} ({'new' if created else f'{verb}, {done} trials done'}); "
            f"{wl['name']}: {wl['parameters']:,} parameters, {wl['train_samples'] or 'an unknown number of'} training "
            f"samples; {fingerprint['hardware']['device']}, {fingerprint['hardware']['usable_cores']} usable cores\n"
        )
        if shared:
            err.write(f"knobtune: worker {self.worker}: heartbeat every {shared.heartbeat_s} s; another worker's trial "
                      f"silent for {shared.grace_s} s is re-queued; {target} trials in all, whoever runs them\n")
        if artifact_dir is not None:
            err.write(f"knobtune: trial artifacts (output, request, window chart) in {artifact_dir}\n")
        elif artifacts_option is None:
            err.write("note: no artifact directory for a server database: each machine would need the same one; "
                      "name a shared directory with --artifacts DIR to keep trial outputs for the dashboard\n")
        progress = Progress(target, min(done, target), err)
        progress.best = best_label(study)
        search = _Search(study, plan, url, err, progress, artifact_store, slots,
                         random.Random(study_cfg.seed if seed is None else seed), shared, self.worker,
                         self.storage.engine)
        try:
            search.run(target, timeout)
        except KeyboardInterrupt:
            progress.close()
            search.stop("interrupted by the user (Ctrl-C)")
            kept = len(results.finished(study))
            notes.publish_safely(study, url, "when the run was interrupted", err)
            err.write(f"\nknobtune: interrupted; {kept} finished trials are kept. Run the same command to resume.\n")
            return 130
        except BaseException:
            search.stop("interrupted: the run stopped on an error")
            raise
        plan = replace(search.plan, placement=slots[0])  # confirmation and diagnosis: on one share, as the trials
        progress.close()
        if len(results.finished(study)) >= target:
            try:
                self._after(study, plan, confirm_winners, diagnose)
            except KeyboardInterrupt:
                err.write("\nknobtune: interrupted during confirmation/diagnosis; the trials are kept.\n")
                return 130
        notes.publish_safely(study, url, "at the end of the run", err)  # a study made before notes: its story
        self.out.write(study_summary(study, url) + "\n")
        return 0

    def _after(self, study: optuna.Study, plan: Plan, confirm_winners: bool, diagnose: bool) -> None:
        """Confirmation and diagnosis; on a shared study exactly once, by the first worker to claim them."""
        if self.shared is None:
            _after_search(study, plan, self.err, confirm_winners, diagnose, self.url)
            return
        lease = self._lease("after-search", max(60, 3 * self.shared.heartbeat_s))
        holder = lease.claim()
        if holder is not None:
            self.err.write(f"knobtune: worker {holder} is confirming and diagnosing the winner of {self.name!r}; this "
                           f"worker is done (knobtune export {self.name} once it has finished)\n")
            return
        lease.keep()
        with lease:
            _after_search(study, plan, self.err, confirm_winners, diagnose, self.url)


def _fail_unwatched(study: optuna.Study, shared: Sharing | None) -> int:
    """On a shared study: RUNNING trials that no worker's heartbeat watches (left by a process that
    died before its first heartbeat, or by a knobtune without heartbeats) and older than the grace."""
    if shared is None:
        return 0
    now = time.time()
    silent = [t for t in study.get_trials(deepcopy=False, states=[TrialState.RUNNING])
              if "worker" not in t.user_attrs and t.datetime_start is not None
              and now - t.datetime_start.timestamp() > shared.grace_s]
    for trial in silent:
        study._storage.set_trial_user_attr(trial._trial_id, "failure", "interrupted: left running with no heartbeat")
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    return len(silent)


def _fail(study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
    """Tell ``trial`` FAIL with ``reason`` (nothing when it was told already or the database is away:
    then the trial's heartbeat stops and another worker fails it)."""
    try:
        trial.set_user_attr("failure", reason)
        study.tell(trial, state=TrialState.FAIL)
    except (RuntimeError, ValueError):  # already told
        pass
    except Exception as exc:  # noqa: BLE001
        if not workers.is_connection_error(exc):
            raise


@dataclass
class _Running:
    trial: optuna.Trial
    is_baseline: bool
    slot: Partition | None
    kept: Path | None


class _Search:
    """The trial loop: asks Optuna for trials and measures up to one per slot at once (a slot is
    a partition of the machine, or the whole machine when there is one slot). Only this thread
    talks to the storage; the slots' threads run the children.

    On a shared study (``shared``: a server database, other workers on it) the trial count is
    study-wide, running trials get heartbeats, a silent worker's trials are failed and re-queued,
    and a lost database is waited for (``workers.patiently``)."""

    def __init__(self, study: optuna.Study, plan: Plan, url: str, err: TextIO, progress: Progress,
                 artifact_store: Any, slots: list[Partition | None], rng: random.Random,
                 shared: Sharing | None = None, worker: str = "", engine: Any = None) -> None:
        self.study, self.plan, self.url, self.err, self.progress = study, plan, url, err, progress
        self.artifact_store, self.rng, self.shared, self.worker = artifact_store, rng, shared, worker
        self.free = list(slots)
        self.running: dict[Future[Report], _Running] = {}
        self.cancel = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="knobtune-slot")
        self.noted: set[str] = set()
        self.waiting = False       # every unmeasured configuration is running: ask again once one ends
        self.pending: optuna.Trial | None = None  # asked, not yet running or told (failed if the run stops)
        self.beat_at = 0.0
        self.engine = engine      # the database's, for leases
        self.lost = False         # the database stayed away: stop without waiting for it again
        self.neighbour_said = False

    def _db(self, step: Callable[[], Any]) -> Any:
        if self.shared is None or self.lost:
            return step()
        try:
            return workers.patiently(step, self.url, self.shared.db_retry_s,
                                     lambda line: self.err.write(line + "\n"))
        except workers.DatabaseLost:
            self.lost = True
            raise

    def _baseline_ok(self) -> bool:
        base = results.baseline(self.study)
        return base is not None and base.user_attrs.get("outcome") == "ok"

    def _study_running(self) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))

    def _running_numbers(self) -> set[int]:
        """The trials being measured: this run's; on a shared study, every worker's (a dead
        worker's trial is failed by heartbeat within the grace period)."""
        if self.shared is not None:
            return {t.number for t in self._study_running()}
        return {r.trial.number for r in self.running.values()}

    def _may_start(self, target: int) -> bool:
        """Room under the trial count, and the baseline measured (nothing runs beside it)."""
        if len(results.finished(self.study)) + len(self._running_numbers()) >= target:
            return False
        if self._baseline_ok():
            return True
        if self._running_numbers():
            return False
        if self.shared is not None:
            self._baseline_or_stop()
        return True

    def _baseline_or_stop(self) -> None:
        """Shared study, nothing running, no good baseline: stop if it failed, else make sure it is
        queued (a worker stopped while measuring it)."""
        base = results.baseline(self.study)
        if base is not None:
            raise RunError(f"the baseline trial #{base.number} did not succeed ({base.user_attrs.get('outcome')}); "
                           f"every other trial is judged against it, so this worker stops")
        setup = Lease(self.engine, f"{self.study.study_name}/setup", self.worker, 60)
        _wait_for(setup, "the study's setup")
        try:
            _enqueue_baseline(self.study, self.plan)
        finally:
            setup.release()

    def _beat(self) -> None:
        """Shared study, every heartbeat period: this worker's trials are alive; others' silent
        ones are failed and re-queued (search.workers.fail_silent)."""
        if self.shared is None or time.monotonic() - self.beat_at < self.shared.heartbeat_s:
            return
        for r in self.running.values():
            self.study._storage.record_heartbeat(r.trial._trial_id)
        for number in workers.fail_silent(self.study):
            self.err.write(f"knobtune: trial #{number}'s worker stopped sending heartbeats; its configuration is "
                           f"queued again\n")
        self.beat_at = time.monotonic()
        if not self.neighbour_said:
            host = self.worker.rsplit(":", 1)[0]
            near = sorted({w for t in self._study_running() if isinstance(w := t.user_attrs.get("worker"), str)
                           and w != self.worker and w.rsplit(":", 1)[0] == host})
            if near:
                self.neighbour_said = True
                self.err.write(f"warning: another worker of this study runs on this machine ({', '.join(near)}): "
                               f"their trials measure on the same cores at once and distort each other; run one "
                               f"worker per machine (--jobs N splits a machine between trials)\n")
        self.waiting = False  # other workers' trials may have ended: ask again

    def run(self, target: int, timeout: float | None) -> None:
        started, submitting = time.monotonic(), True
        try:
            while True:
                self._db(self._beat)
                if submitting and timeout is not None and time.monotonic() - started > timeout:
                    self.err.write(f"knobtune: --timeout {timeout:g} s reached; starting no new trial\n")
                    submitting = False
                while submitting and not self.waiting and self.free and self._db(lambda: self._may_start(target)):
                    step = self._db(lambda: self._start(target))
                    if step == "exhausted":
                        submitting = False
                    if step in ("exhausted", "wait", "held"):
                        self.waiting = step != "exhausted"
                        break
                if not self.running:
                    if (self.shared is None or not submitting
                            or self._db(lambda: len(results.finished(self.study))) >= target):
                        return
                    time.sleep(1.0)  # other workers' trials run: one may come back to the queue
                    self.waiting = False
                    continue
                done, _ = wait(self.running, timeout=0.25, return_when=FIRST_COMPLETED)
                self.progress.tick()
                for future in done:
                    self.waiting = False
                    self._finish(future)
        finally:
            self.pool.shutdown(wait=False)

    def _hand_back(self, trial: optuna.Trial, reason: str) -> None:
        """Shared study: give up a trial just asked (its configuration, if it came from the queue,
        goes back there) and tell it FAIL, uncounted."""
        fixed = self.study._storage.get_trial(trial._trial_id).system_attrs.get("fixed_params")
        if fixed:
            keep = {k: trial.user_attrs[k] for k in ("is_baseline", "source", "retry_of") if k in trial.user_attrs}
            self.study.enqueue_trial(fixed, user_attrs=keep, skip_if_exists=False)
        trial.set_user_attr("handed_back", reason)
        trial.set_user_attr("failure", f"not run: {reason}")
        self.study.tell(trial, state=TrialState.FAIL)

    def _start(self, target: int) -> str:
        """Ask for a trial and start it on a free slot: "started"; or skip a duplicate: "skipped"
        ("wait" when only the running trials' results can tell what to explore next, "exhausted"
        when the space has no unmeasured configuration left, "held" when another worker's trial
        must end first)."""
        study, plan = self.study, self.plan
        if self.pending is not None:  # an earlier attempt lost the database after asking
            _fail(study, self.pending, "interrupted: the database connection dropped while it was being started")
            self.pending = None
        trial = self.pending = study.ask()
        is_baseline = bool(trial.user_attrs.get("is_baseline"))
        if self.shared is not None:
            trial.set_user_attr("worker", self.worker)
            study._storage.record_heartbeat(trial._trial_id)
            held = self._held(trial, is_baseline, target)
            if held:
                self._hand_back(trial, held)
                self.pending = None
                return "held"
        resolved = suggest(plan, trial)
        twin = None if is_baseline else duplicate_of(study, trial, self._running_numbers())
        if twin is not None:
            # TPE converges on its favourite configuration; measuring it again teaches nothing.
            # Skip it (uncounted) and explore an unmeasured configuration next.
            trial.set_user_attr("duplicate_of", twin)
            trial.set_user_attr("failure", f"skipped: same knobs as trial #{twin}")
            study.tell(trial, state=TrialState.FAIL)
            self.pending = None
            fresh = _unmeasured(study, plan, self.rng, self._running_numbers())
            if fresh is None:
                if not self._running_numbers():
                    self.err.write("knobtune: every configuration of the space has been measured; stopping\n")
                    return "exhausted"
                return "wait"
            study.enqueue_trial(fresh, user_attrs={"source": "explore"})
            return "skipped"
        if is_baseline:
            trial.set_user_attr("role", story.ROLE_BASELINE)
        else:
            trial.set_user_attr("is_baseline", False)
        if "source" not in trial.user_attrs:
            trial.set_user_attr("source", plan.definition.study.sampler)
        slot = self.free[0]
        if slot is not None:
            trial.set_user_attr("partition", slot.describe())
        watch = None if is_baseline else prune_rule(plan, study)
        self.free.pop(0)  # (storage calls above may be retried: take the slot only now)
        kept = Path(tempfile.mkdtemp(prefix="knobtune-artifacts-")) if self.artifact_store is not None else None
        slot_plan = replace(plan, placement=slot) if slot is not None else plan
        self.progress.started(trial.number)
        future = self.pool.submit(self._measure, slot_plan, resolved, is_baseline, watch, kept)
        self.running[future] = _Running(trial, is_baseline, slot, kept)
        self.pending = None
        return "started"

    def _held(self, trial: optuna.Trial, is_baseline: bool, target: int) -> str | None:
        """Why another worker's trial must end before this one may run (workers ask at the same
        moment: the lower trial numbers go first), or None."""
        if not is_baseline and not self._baseline_ok():
            return "the baseline is being measured by another worker"
        running = sorted(self._running_numbers())
        room = target - len(results.finished(self.study))
        if trial.number not in running[:max(room, 0)]:
            return f"the study's {target} trials are finished or running on other workers"
        return None

    def _measure(self, plan: Plan, resolved: dict[str, Any], is_baseline: bool,
                 watch: Callable[[list[dict[str, Any]]], str | None] | None, kept: Path | None) -> Report:
        """In a slot's thread: the child (children, for the baseline's several seeds)."""
        if is_baseline:
            return measure_baseline(plan, resolved, keep=kept, cancel=self.cancel)
        return measure(plan, resolved, False, watch=watch, keep=kept, cancel=self.cancel)

    def _finish(self, future: Future[Report]) -> None:
        running = self.running.pop(future)
        self.free.append(running.slot)
        try:
            report = future.result()
        except BaseException as exc:  # the measurement never came back: the trial must not stay RUNNING
            if running.kept is not None:
                shutil.rmtree(running.kept, ignore_errors=True)
            _fail(self.study, running.trial, "interrupted by the user (Ctrl-C)" if isinstance(exc, KeyboardInterrupt)
                  else f"interrupted: the run failed while measuring it ({type(exc).__name__}: {exc})")
            raise
        try:
            self._db(lambda: self._record(running, report))
        finally:
            if running.kept is not None:
                shutil.rmtree(running.kept, ignore_errors=True)

    def _record(self, running: _Running, report: Report) -> None:
        """Store a measurement: artifacts, the trial's result, the notes; what comes next."""
        study, trial, is_baseline = self.study, running.trial, running.is_baseline
        if running.kept is not None:
            artifacts.attach(study, trial, running.kept, report.attrs, self.artifact_store)
        base = results.baseline(study)
        base_ok = base is not None and base.user_attrs.get("outcome") == "ok"
        base_acc = baseline_accuracies(base.user_attrs) if base_ok and not is_baseline else None
        if not is_baseline and not base_ok:
            raise RunError("no successful baseline trial to compare with; run again to re-measure it")
        if report.outcome == "pruned":
            full = [t.user_attrs["trial_seconds"] for t in results.feasible(study)]
            if full:
                report.attrs["time_saved_seconds"] = round(max(0.0, sum(full) / len(full)
                                                               - report.attrs["trial_seconds"]), 2)
        state = study._storage.get_trial(trial._trial_id).state
        if state == TrialState.FAIL:  # the database was away longer than the grace: others took it for dead
            self.err.write(f"knobtune: trial #{trial.number}'s result came back after the other workers had failed it "
                           f"for its silence and queued it again; this measurement is dropped\n")
            return
        if state == TrialState.RUNNING:  # (not told on an attempt that lost the database after telling)
            try:
                tell(study, trial, report, self.plan.definition, base_acc)
            except BaseException as exc:
                if workers.is_connection_error(exc):
                    raise  # retried
                _fail(study, trial, "interrupted while its result was being stored")
                raise
        finished = study.trials[trial.number]
        self.progress.best = best_label(study)
        base = results.baseline(study)
        base_knobs = results.knob_values(base) if base else None
        self.progress.finished(trial_line(finished.number, finished.user_attrs, self.progress.best, base_knobs),
                               finished.number)
        notes.publish_safely(study, self.url, f"after trial #{finished.number}", self.err)
        for attr, note in BURST_NOTES.items():  # once per run: the burst is too short for this
            if finished.user_attrs.get(attr) and attr not in self.noted:
                self.noted.add(attr)
                self.err.write(note(finished.number, finished.user_attrs[attr]) + "\n")
        if is_baseline and report.outcome == "ok":
            self.plan = _narrow(self.plan, report.attrs.get("not_exercised"), self.err)
            _enqueue_advice(study, self.plan)
        if is_baseline and report.outcome != "ok":
            raise RunError(
                f"the baseline trial #{finished.number} did not succeed ({report.outcome}: "
                f"{(report.attrs.get('failure') or '').splitlines()[0] if report.attrs.get('failure') else ''}); "
                f"every other trial is judged against it, so the study stops here"
            )

    def stop(self, reason: str) -> None:
        """Kill the running children (each slot's thread sees the cancel within a poll), wait for
        them, and mark their trials failed with ``reason``: a resumed run measures them again (on a
        shared study their configurations go back to the queue for the other workers)."""
        self.cancel.set()
        if self.pending is not None:  # asked, never started
            _fail(self.study, self.pending, reason)
            self.pending = None
        for future, running in list(self.running.items()):
            try:
                future.result(timeout=60)
                finished = True  # it came back before the cancel reached it: keep the measurement
            except BaseException:  # Cancelled, as a rule
                finished = False
            if finished:
                try:
                    self._finish(future)
                    continue
                except BaseException:
                    pass  # _finish failed the trial
            elif not self._requeue(running.trial, reason):
                _fail(self.study, running.trial, reason)
            if running.kept is not None:
                shutil.rmtree(running.kept, ignore_errors=True)
        self.running.clear()
        self.pool.shutdown(wait=True)

    def _requeue(self, trial: optuna.Trial, reason: str) -> bool:
        """Shared study: fail an interrupted trial and queue its configuration again for the other
        workers (False: not a shared study, or the database is away; the heartbeat handles it)."""
        if self.shared is None:
            return False
        try:
            return workers.fail_and_requeue(self.study, self.study._storage.get_trial(trial._trial_id),
                                            f"{reason}; its configuration was queued again for the other workers")
        except Exception as exc:  # noqa: BLE001
            if not workers.is_connection_error(exc):
                raise
            return False


def _narrow(plan: Plan, not_exercised: dict[str, str] | None, err: TextIO | None) -> Plan:
    """Stop searching the knobs the user's script never exercises (said once, on ``err``)."""
    narrowed = without_unexercised(plan, not_exercised)
    if err is not None and narrowed is not plan:
        for name in sorted(k for k, v in plan.offer.choices.items() if len(v) > len(narrowed.offer.choices[k])):
            err.write(f"knobtune: {name} is not searched: {not_exercised[name]}\n")  # type: ignore[index]
    return narrowed


def _after_search(study: optuna.Study, plan: Plan, err: TextIO, confirm_winners: bool, diagnose: bool,
                  url: str) -> None:
    """Confirm the winner (unless a current confirmation exists) and diagnose it (once per winner);
    the notes are rewritten after each."""
    if confirm_winners and plan.definition.confirm.top_k > 0 and results.confirmation(study) is None:
        confirm(study, plan, err)
        notes.publish(study, url, "after the confirmation")
    winner = results.best(study)
    done = study.user_attrs.get("diagnosis", {})
    if diagnose and winner is not None and done.get("winner_trial") != winner.number:
        baseline_params = plan.space.baseline_params(plan.offer, plan.ctx, plan.definition.baseline)
        diagnose_study(study, plan, baseline_params, winner, err)
        notes.publish(study, url, "after the diagnosis")
