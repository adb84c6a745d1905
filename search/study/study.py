"""``knobtune run`` and ``knobtune worker``: create, resume or join a study, run its trials
(search/study/loop.py), then confirm and diagnose the winner."""
from __future__ import annotations

import contextlib
import os
import random
import sys
from dataclasses import replace
from typing import Any, Callable, Sequence, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState

from knobtune import __version__
from knobtune.search.errors import RunError, UserError
from knobtune.search.launch import partition
from knobtune.search.launch.partition import Partition
from knobtune.search.launch.probe import probe_study
from knobtune.search.storage import artifacts, record, runlock, workers
from knobtune.search.storage.database import is_sqlite, open_storage, redact, resolve_url
from knobtune.search.storage.lease import Lease
from knobtune.search.storage.record import StudyRecord, TrialRecord, mark_study
from knobtune.search.storage.workers import Sharing
from knobtune.search.story import notes, results
from knobtune.search.story.progress import Progress
from knobtune.search.story.summary import best_label, study_summary
from knobtune.search.study import loop, queue, scaling, survival, warmstart
from knobtune.search.study.confirm import confirm
from knobtune.search.study.definition import Definition
from knobtune.search.study.diagnose import diagnose_study, undiagnosable
from knobtune.search.study.effects import EffectsSampler
from knobtune.search.study.objective import Plan, known_invalid, verdict_floor
from knobtune.spaces import for_framework

# The fingerprint keys that must match for a resumed study's numbers to compare.
HARDWARE_KEYS = ("cpu_model", "usable_cores", "gpus", "torch", "tensorflow", "cuda_version")


def make_sampler(definition: Definition, total_trials: int, parallel: bool = False,
                 seed: int | None = None, plan: Callable[[], Plan] | None = None) -> optuna.samplers.BaseSampler:
    """The study's sampler; ``parallel`` when trials run at once (here or on other workers);
    ``seed`` overrides the study's (each worker of a shared study has its own); with ``plan``
    (the study's current plan: a good baseline narrows it), the effects sampler does not propose
    what ``known_invalid`` refuses."""
    seed = definition.study.seed if seed is None else seed
    if definition.study.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    tpe = optuna.samplers.TPESampler(
        seed=seed,
        multivariate=True,
        group=True,  # conditional knobs (prefetch_factor only with workers) form their own groups
        n_startup_trials=max(3, min(10, total_trials // 3)),
        constant_liar=parallel,  # trials running at once: keep proposals apart
    )
    # (the effects model ranks one objective: a pareto study's proposals are TPE's)
    def invalid(params: dict[str, Any]) -> bool:
        assert plan is not None
        now = plan()
        resolved = now.space.resolve(params, now.offer, now.ctx)
        return known_invalid(now, {name: r.value for name, r in resolved.items()}) is not None

    return EffectsSampler(seed=seed, tpe=tpe, floor=_verdict_floor(definition),
                          invalid=invalid if plan is not None else None) \
        if definition.study.sampler == "effects" else tpe


def _verdict_floor(definition: Definition) -> Callable[[Sequence[FrozenTrial]], float | None]:
    """For the effects sampler: ``verdict_floor`` of the study's latest ok baseline, once measured."""
    def floor(trials: Sequence[FrozenTrial]) -> float | None:
        bases = [r for r in (TrialRecord.of(t) for t in trials if t.state == TrialState.COMPLETE)
                 if r.is_baseline and r.ok]
        return verdict_floor(definition, bases[-1] if bases else None)
    return floor


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
        return load_or_create(storage, name, definition, fingerprint, sampler)  # (its attributes, below)
    kept = StudyRecord.of(study)
    if not study.user_attrs and not study.trials:  # created, then the process died (or lost the database) at once
        record.mark_study(study, definition=definition.as_dict(), measurement=definition.measurement_key(),
                          fingerprint=fingerprint, knobtune_version=__version__)
        return study, True
    if kept.measurement is None:
        raise UserError(f"study {name!r} exists in this storage but was not made by knobtune; pick another --name")
    diffs = _differences(kept.measurement, definition.measurement_key())
    if diffs:
        raise UserError(
            f"study {name!r} exists with a different definition ({'; '.join(diffs[:3])}); its trials would not "
            f"compare with new ones: use --name for a new study"
        )
    diffs = _differences(_hardware(kept.fingerprint), _hardware(fingerprint))
    if diffs:
        share = kept.partition or {"jobs": 1}
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
    On SQLite one run per study at a time: a second is refused (search/storage/runlock.py). On a server
    database every process is a worker of a shared study: heartbeats, a study-wide trial count,
    confirmation and diagnosis by one of them (search/storage/workers.py, search/storage/lease.py)."""
    name = name or definition.study.name
    target = trials if trials is not None else definition.study.trials
    if target < 1:
        raise UserError(f"--trials must be >= 1, got {target}")
    url = resolve_url(storage_url, definition.study.storage)
    if worker_command:
        refuse_sqlite_worker(url)
    shared = None if is_sqlite(url) else (sharing or Sharing())
    if shared is None:
        storage = open_storage(url)
    else:  # a worker started while the database is away (a restart, a reboot of both) waits for it
        storage = workers.patiently(lambda: open_storage(url, shared), url, shared.db_retry_s,
                                    lambda line: err.write(line + "\n"))
    search = _StudyRun(definition, url, storage, name, target, out, err, shared)
    if shared is None:
        with runlock.hold(url, name):
            return search.run(timeout, confirm_winners, diagnose, artifacts_option, jobs)
    try:
        return search.run(timeout, confirm_winners, diagnose, artifacts_option, jobs)
    except (RunError, UserError):
        raise
    except Exception as exc:  # a database lost where no retry applies (a long confirmation): one line
        if workers.is_connection_error(exc):
            raise RunError(f"lost the database {redact(url)} ({workers.first_line(exc, url)})") from None
        raise


def refuse_sqlite_worker(url: str) -> None:
    """``knobtune worker`` shares a study between machines: an SQLite file cannot be shared."""
    if is_sqlite(url):
        raise UserError(
            f"knobtune worker needs a database server that every machine reaches (postgresql://user:password@host/db), "
            f"got {redact(url)}: an SQLite file belongs to one machine and cannot be shared over the network; on one "
            f"machine, knobtune run --jobs N runs several trials at once")


def _share(slots: list[Partition | None], nproc: int = 1, members: str = "ranks") -> dict[str, Any]:
    """What each trial of the study measured: the whole machine, or one of ``jobs`` equal shares
    (a data-parallel trial's share divided again between its ranks, or shared by its replicas)."""
    first = slots[0]
    if first is None:
        return {"jobs": 1, "share": "the whole machine"}
    gpus = len(first.gpu.split(",")) if first.gpu else 0
    jobs = len(slots)
    out: dict[str, Any] = {"jobs": jobs, "cores_per_trial": len(first.cores), "gpus_per_trial": gpus,
                           "share": (f"1/{jobs} of the machine: " if jobs > 1 else "the machine: ")
                           + f"{len(first.cores)} core(s)" + (f" and {gpus} GPU(s)" if gpus else "")}
    if nproc > 1 and members == "replicas":
        out.update(nproc=nproc, share=out["share"] + f", {nproc} MirroredStrategy replicas in one process")
    elif nproc > 1:
        per_rank = len(first.cores) // nproc
        out.update(nproc=nproc, cores_per_rank=per_rank,
                   share=out["share"] + f", {nproc} ranks of {per_rank} core(s)"
                   + (" and one GPU each" if gpus else ""))
    return out


def _partition(definition: Definition, info: dict[str, Any], jobs_option: str | None,
               err: TextIO) -> tuple[list[Partition | None], dict[str, Any], int]:
    """The run's slots (``--jobs``), the study's ranks per trial (``[study] nproc``), and the probe
    of what one trial (one rank, for a data-parallel study) will see."""
    gpus = partition.visible_gpus(len(info["fingerprint"].get("gpus") or []))
    cores = partition.machine_cores()
    groups = partition.physical_groups(cores)
    nproc = partition.group_size(definition.study.nproc, gpus, groups)
    members = definition.study.members
    if definition.study.nproc == "auto":
        err.write(f"knobtune: nproc = \"auto\": {nproc} {members[:-1]}(s) per trial"
                  + (", one per visible GPU\n" if gpus else " (no GPU here)\n"))
    jobs = partition.jobs_count(jobs_option, gpus, len(groups), nproc)
    if jobs == 1 and nproc == 1:
        return [None], info, 1
    parts = partition.plan(jobs, cores, gpus, groups, nproc)
    share = len(parts[0].cores)
    unused = len(cores) - share * jobs
    if jobs > 1:
        err.write(f"knobtune: {jobs} trials at once, each pinned to {share} core(s)"
                  + (f" and {nproc} GPU(s)" if gpus else "") + (f" ({unused} core(s) left unused: the shares must be "
                                                               f"equal)" if unused else "")
                  + f"; each trial measures 1/{jobs} of this machine, and the winner is exported for that share"
                  + (" (what one rank of a data-parallel job gets)\n" if nproc == 1 else "\n"))
    if nproc == 1:
        return list(parts), probe_study(definition, err, parts[0]), 1
    if members == "replicas":  # one process: its pipeline and threads serve every replica, on the whole share
        err.write(f"knobtune: {nproc} replicas per trial (MirroredStrategy in one process"
                  + (", one GPU each)\n" if gpus else f", logical CPU devices sharing its {share} core(s))\n"))
        return list(parts), probe_study(definition, err, parts[0], nproc), nproc
    ranks = partition.rank_shares(list(parts[0].cores), nproc)
    err.write(f"knobtune: {nproc} ranks per trial (data-parallel), each on {len(ranks[0])} core(s)"
              + (" and one GPU" if gpus else "") + "\n")
    first_gpu = parts[0].gpu.split(",")[0] if parts[0].gpu else None
    probed = probe_study(definition, err, Partition(0, ranks[0], first_gpu), nproc)
    return list(parts), probed, nproc


def _cores_line(nproc: int, members: str, cores: int) -> str:
    """The start line's end: what one process of a trial has (a rank's share, or the replicas' process)."""
    if nproc > 1 and members == "ranks":
        return f"{nproc} ranks of {cores} usable core(s) each\n"
    return (f"{nproc} replicas, " if nproc > 1 else "") + f"{cores} usable cores\n"


class _StudyRun:
    """One ``knobtune run``/``worker`` process: probe, open or create the study, search, then
    confirm and diagnose (on a shared study: by whichever worker claims it first)."""

    def __init__(self, definition: Definition, url: str, storage: Any, name: str, target: int,
                 out: TextIO, err: TextIO, shared: Sharing | None) -> None:
        self.definition, self.url, self.storage, self.name, self.target = definition, url, storage, name, target
        self.out, self.err, self.shared = out, err, shared
        self.worker = workers.worker_id()

    def _retrying(self, step: Callable[[], Any]) -> Any:
        """``step()``; on a shared study, retried while the database is away (search/storage/workers.py)."""
        if self.shared is None:
            return step()
        return workers.patiently(step, self.url, self.shared.db_retry_s, lambda line: self.err.write(line + "\n"))

    def _open(self, plan: Plan, fingerprint: dict[str, Any], sampler: optuna.samplers.BaseSampler,
              slots: list[Partition | None]) -> tuple[optuna.Study, bool]:
        """Load or create the study and queue its baseline (on a shared study under the queue's
        lease, so two workers starting together neither create it twice nor queue two baselines)."""
        shared = self.shared
        held = (survival.queue_lease(self.storage.engine, self.name, self.worker).held() if shared
                else contextlib.nullcontext())
        with held:
            study, created = load_or_create(self.storage, self.name, self.definition, fingerprint, sampler)
            if created:
                record.mark_study(study, partition=_share(slots, plan.nproc, self.definition.study.members))
            if not created and shared is None:
                stale = _fail_stale(study)
                if stale:
                    self.err.write(f"note: marked {stale} trial(s) left running by an earlier run as failed\n")
            queue.enqueue_baseline(study, plan)
            notes.name_metrics(study)
        return study, created

    def run(self, timeout: float | None, confirm_winners: bool, diagnose: bool, artifacts_option: str | None,
            jobs_option: str | None) -> int:
        definition, url, name, err, target, shared = (self.definition, self.url, self.name, self.err,
                                                      self.target, self.shared)
        study_cfg = definition.study
        artifact_dir = artifacts.resolve(url, artifacts_option)
        artifact_store = artifacts.store(artifacts.prepare(artifact_dir)) if artifact_dir is not None else None
        warm = self._retrying(lambda: warmstart.candidates(self.storage, name, definition))  # (refusals: before the probe)
        info = probe_study(definition, err)
        slots, info, nproc = _partition(definition, info, jobs_option, err)
        fingerprint = info["fingerprint"]
        plan = replace(make_plan(definition, info), nproc=nproc)
        _notes(plan, err)
        warning = resolution_warning(definition, info["workload"].get("eval_samples"))
        if warning:
            err.write(warning + "\n")

        seed = workers.sampler_seed(study_cfg.seed, self.worker) if shared else None
        searching: list[loop.Search] = []  # (the sampler asks the search's plan, which a good baseline narrows)
        sampler = make_sampler(definition, target, len(slots) > 1 or shared is not None, seed,
                               lambda: searching[0].plan if searching else plan)
        study, created = self._retrying(lambda: self._open(plan, fingerprint, sampler, slots))
        measured_base = results.baseline(study)
        if measured_base is not None and (base_record := TrialRecord.of(measured_base)).ok:  # resuming
            plan = loop.stop_searching_unexercised(plan, base_record.not_exercised, None)
        done = len(results.finished(study))
        verb = "joining" if shared else "resuming"
        wl = info["workload"]
        err.write(
            f"knobtune: study {name!r} on {redact(url)} ({'new' if created else f'{verb}, {done} trials done'}); "
            f"{wl['name']}: {wl['parameters']:,} parameters, {wl['train_samples'] or 'an unknown number of'} training "
            f"samples; {fingerprint['hardware']['device']}, "
            + _cores_line(plan.nproc, study_cfg.members, fingerprint['hardware']['usable_cores'])
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
        search = loop.Search(study, plan, url, err, progress, artifact_store, slots,
                             random.Random(study_cfg.seed if seed is None else seed), shared, self.worker,
                             self.storage.engine, warm)
        searching.append(search)
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
        search.close()
        plan = replace(search.plan, placement=slots[0])  # confirmation and diagnosis: on one share, as the trials
        progress.close()
        if self._retrying(lambda: len(results.finished(study))) >= target:
            try:
                self._confirm_and_diagnose_once(study, plan, confirm_winners, diagnose)
            except KeyboardInterrupt:
                err.write("\nknobtune: interrupted during confirmation/diagnosis; the trials are kept.\n")
                return 130
        notes.publish_safely(study, url, "at the end of the run", err)  # a study made before notes: its story
        self.out.write(self._retrying(lambda: study_summary(study, url)) + "\n")
        return 0

    def _confirm_and_diagnose_once(self, study: optuna.Study, plan: Plan, confirm_winners: bool, diagnose: bool) -> None:
        """Confirmation and diagnosis; on a shared study exactly once, by the first worker to claim them."""
        if self.shared is None:
            _confirm_and_diagnose(study, plan, self.err, confirm_winners, diagnose, self.url)
            return
        lease = Lease(self.storage.engine, f"{self.name}/after-search", self.worker, max(60, 3 * self.shared.heartbeat_s))
        holder = self._retrying(lease.claim)
        if holder is not None:
            self.err.write(f"knobtune: worker {holder} is confirming and diagnosing the winner of {self.name!r}; this "
                           f"worker is done (knobtune export {self.name} once it has finished)\n")
            return
        lease.keep()
        wanted = (confirm_winners and plan.definition.confirm.top_k > 0) or diagnose
        with lease:
            if not _confirm_and_diagnose(study, plan, self.err, confirm_winners, diagnose, self.url) and wanted:
                self.err.write(f"knobtune: the winner of {self.name!r} was confirmed and diagnosed by another worker; "
                               f"this worker is done\n")


def _confirm_and_diagnose(study: optuna.Study, plan: Plan, err: TextIO, confirm_winners: bool, diagnose: bool,
                  url: str) -> bool:
    """Confirm the winner (unless a current confirmation exists) and diagnose it (once per winner);
    the notes are rewritten after each. Whether there was anything to do."""
    did = False
    if confirm_winners and plan.definition.confirm.top_k > 0 and results.confirmation(study) is None:
        confirm(study, plan, err)
        notes.publish(study, url, "after the confirmation")
        did = True
    if scaling.measure_study(study, plan, err) is not None:
        did = True
    winner = results.best(study)
    done = StudyRecord.of(study).diagnosis or {}
    skip = undiagnosable(plan) if diagnose and winner is not None else None
    if skip and done.get("skipped") != skip:
        err.write(f"knobtune: {skip}\n")
        mark_study(study, diagnosis={"skipped": skip})
    elif diagnose and winner is not None and done.get("winner_trial") != winner.number:
        baseline_params = plan.space.baseline_params(plan.offer, plan.ctx, plan.definition.baseline)
        diagnose_study(study, plan, baseline_params, winner, err)
        notes.publish(study, url, "after the diagnosis")
        did = True
    return did
