"""A trial as a group of ranks: ``launch`` forks ``nproc`` processes from the trial's child the way
``torchrun --nproc_per_node N`` starts them, and ends them as one job; ``run`` is a data-parallel
trial (``[study] nproc``) on top of it: each rank on its share of the trial's cores, its result
merged into the trial's (trainers/common/ranks.py).

Each rank gets torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ...), so a script's own
``torch.distributed.init_process_group()`` works unchanged. As under torchrun, the launcher hosts
the rendezvous store itself (``TORCHELASTIC_USE_AGENT_STORE``: every rank connects as a client):
the store takes a port the system chooses, so groups started side by side (``--jobs``, tests)
never ask for the same port, and no port is picked free and then lost to a neighbour.

The group ends as one job:

- a rank that exits non-zero or is killed (a crash, the kernel's OOM killer) ends the others at
  once; ``GroupEnd.failed`` names it;
- ranks that disagree (one rank's loader ran out of batches, so it finished while the others wait
  in a collective that will never complete) end ``grace_s`` after the first rank finished, and
  ``GroupEnd.stragglers`` names the ranks killed, never a hang until the trial's timeout;
- when the launcher itself dies, every rank dies with it (``PR_SET_PDEATHSIG``); the ranks stay in
  the launcher's process group, which the engine kills whole on a timeout.

The launcher forks before it touches torch's thread pools, and starts the store's threads after
the forks: a rank inherits no thread.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

from knobtune.trainers.common import hostinfo, ranks
from knobtune.trainers.common.child import write_json
from knobtune.trainers.common.errors import KILLED_UNASKED, InvalidKnobs, WorkloadError
from knobtune.trainers.common.forkserver import PR_SET_PDEATHSIG, _prctl
from knobtune.trainers.common.wire import Request, Result

HOST = "127.0.0.1"


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended: its exit code, or minus the signal that killed it, and when (seconds
    after the group started)."""

    rank: int
    status: int
    seconds: float


@dataclass(frozen=True)
class GroupEnd:
    """How a group ended: every rank's end, the rank whose failure ended the group (None when
    none failed), and the ranks killed because the others had finished."""

    ranks: tuple[RankEnd, ...]
    failed: RankEnd | None
    stragglers: tuple[int, ...]
    port: int

    @property
    def ok(self) -> bool:
        return self.failed is None and not self.stragglers

    def reason(self) -> str | None:
        """One line saying why the group did not end well, or None."""
        if self.failed is not None:
            how = (f"was killed by signal {-self.failed.status}" if self.failed.status < 0
                   else f"exited with status {self.failed.status}")
            left = sorted(r.rank for r in self.ranks if r.status == 0 and r.seconds <= self.failed.seconds)
            if left:  # (a collective's peer gone: gloo and NCCL raise in the ranks still in it)
                return (f"the ranks disagree: rank(s) {_listed(left)} finished while rank {self.failed.rank} was still "
                        f"running, which then {how} (in a collective the others had left?)")
            return f"rank {self.failed.rank} of {len(self.ranks)} {how}; the other ranks were stopped with it"
        if self.stragglers:
            done = sorted(r.rank for r in self.ranks if r.rank not in self.stragglers)
            return (f"the ranks disagree: rank(s) {_listed(done)} finished while rank(s) {_listed(self.stragglers)} "
                    f"were still running (waiting in a collective the others had left?); stopped them")
        return None


def _listed(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def rank_environment(rank: int, nproc: int, port: int) -> dict[str, str]:
    """What torchrun sets for a worker on one node (the agent hosting the store)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "ROLE_WORLD_SIZE": str(nproc),
            "ROLE_NAME": "default", "MASTER_ADDR": HOST, "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": f"knobtune-{os.getpid()}"}


def launch(nproc: int, body: Callable[[int], int], *, grace_s: float = 30.0, poll_s: float = 0.05) -> GroupEnd:
    """Run ``body(rank)`` in ``nproc`` forked ranks (its return value is the rank's exit code; an
    exception is printed and exits 1) and wait for the group to end as one job."""
    if nproc < 1:
        raise ValueError(f"nproc: expected 1 or more ranks, got {nproc}")
    import torch.distributed as dist

    started = time.monotonic()
    pids: dict[int, int] = {}
    writers: list[int] = []
    ends_read, ends_write = os.pipe()  # each rank's own line when it ends: "rank status monotonic-time"
    for rank in range(nproc):
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(write_fd)
            os.close(ends_read)
            for fd in writers:
                os.close(fd)
            _rank_main(rank, nproc, read_fd, ends_write, body)
        os.close(read_fd)
        writers.append(write_fd)
        pids[pid] = rank
    os.close(ends_write)
    # the store's threads start after the forks (a fork copies no thread, but a lock a thread held)
    store = dist.TCPStore(HOST, 0, nproc, is_master=True, wait_for_workers=False)
    port = int(store.port)
    for fd in writers:
        os.write(fd, f"{port}\n".encode())
        os.close(fd)
    ends, killed = _wait(pids, started, grace_s, poll_s)
    del store
    ends, told = _as_told(ends, ends_read, started)
    # (a rank that had ended on its own before the kill reached it: it told, or another signal than ours ended it)
    killed = {r for r in killed - told if ends[r].status == -signal.SIGKILL}
    # a rank killed by a signal nobody here sent is the cause (its peers only raise when its connections
    # close, a poll before it is reaped); else the first rank that told of its failure
    failed = next((e for e in sorted(ends.values(), key=lambda e: (e.status >= 0, e.seconds))
                   if e.status != 0 and e.rank not in killed), None)
    stragglers = tuple(sorted(killed)) if failed is None else ()
    return GroupEnd(ranks=tuple(ends[r] for r in sorted(ends)), failed=failed, stragglers=stragglers, port=port)


def _as_told(ends: dict[int, RankEnd], ends_read: int, started: float) -> tuple[dict[int, RankEnd], set[int]]:
    """The ranks' ends with the time each rank told (when it raised or returned), not when it was
    reaped: ranks that fail together, one because the other's connection closed, end within one
    poll, and the earlier is the cause. A rank killed by a signal told nothing: its reap time.
    Also the ranks that told."""
    with os.fdopen(ends_read) as pipe:
        told = {int(rank): float(at) for rank, _, at in (line.split() for line in pipe.read().splitlines())}
    return {rank: RankEnd(rank, end.status, round(told[rank] - started, 3)) if rank in told else end
            for rank, end in ends.items()}, set(told)


def _rank_main(rank: int, nproc: int, read_fd: int, ends_write: int, body: Callable[[int], int]) -> None:
    """In a forked rank: die with the launcher, take torchrun's environment, run ``body``, tell
    the launcher when it ended, never return."""
    code = 1
    try:
        parent = os.getppid()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the launcher died between fork and prctl
            os._exit(1)
        with os.fdopen(read_fd) as pipe:
            line = pipe.readline()
        if not line:  # the launcher failed before it had a store
            os._exit(1)
        os.environ.update(rank_environment(rank, nproc, int(line)))
        code = int(body(rank) or 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a rank's failure is its exit status and its traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            os.write(ends_write, f"{rank} {code} {time.monotonic()}\n".encode())  # one write under PIPE_BUF
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pids: dict[int, int], started: float, grace_s: float, poll_s: float
          ) -> tuple[dict[int, RankEnd], set[int]]:
    """Reap the ranks; on a failure kill the rest at once, and the rest ``grace_s`` after the
    first rank finished well. Every rank's end, and the ranks killed."""
    ends: dict[int, RankEnd] = {}
    killed: set[int] = set()
    first_done: float | None = None
    while len(ends) < len(pids):
        for pid, rank in pids.items():
            if rank in ends:
                continue
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == 0:
                continue
            code = os.waitstatus_to_exitcode(status)
            ends[rank] = RankEnd(rank, code, round(time.monotonic() - started, 3))
            if code != 0 and rank not in killed:
                killed |= _kill(pids, ends)
            elif code == 0 and first_done is None:
                first_done = time.monotonic()
        if len(ends) < len(pids):
            if first_done is not None and time.monotonic() - first_done > grace_s:
                killed |= _kill(pids, ends)
            time.sleep(poll_s)
    return ends, killed


def _kill(pids: dict[int, int], ends: dict[int, RankEnd]) -> set[int]:
    """SIGKILL every rank still running; the ranks killed."""
    out = set()
    for pid, rank in pids.items():
        if rank not in ends:
            try:
                os.kill(pid, signal.SIGKILL)
                out.add(rank)
            except ProcessLookupError:
                pass
    return out


# A rank that finished while another is still running gets this long before the other is stopped:
# the ranks meet in a collective at every segment boundary, so a rank still running longer is stuck.
GRACE_S = 30.0


class GroupFailed(RuntimeError):
    """A rank crashed, was killed, or the ranks disagreed: the trial crashed (its reason is the
    last line the child prints)."""


def run(request: Request, role: str, single: Callable[[Request, str], Result], grace_s: float = GRACE_S) -> Result:
    """A data-parallel trial: ``single(rank's request, role)`` in each of ``request.nproc`` ranks,
    each pinned to its share of this process's cores (one intra-op thread, as torchrun gives a
    rank unless ``OMP_NUM_THREADS`` says otherwise; the ``intra_op_threads`` knob sets others),
    and the ranks' results merged. A rank's workload error is the trial's; a rank that crashed or
    was killed, or ranks that disagree, raise GroupFailed (a rank killed by a SIGKILL nobody here
    sent is outcome oom, as for one process)."""
    try:
        shares = hostinfo.rank_shares(sorted(os.sched_getaffinity(0)), request.nproc)
    except ValueError as exc:
        raise WorkloadError(f"nproc = {request.nproc}: {exc}") from None
    if request.solo:  # one rank alone on its share, no group: what the extra ranks are measured against
        _pin(shares[0])
        return single(ranks.rank_request(request, 0), role)
    out = Path(tempfile.mkdtemp(prefix="knobtune-ranks-"))
    try:
        def body(rank: int) -> int:
            _pin(shares[rank])
            code = 0
            try:
                result = single(ranks.rank_request(request, rank), role)
            except WorkloadError as exc:
                result, code = Result(error=str(exc)), 2
            except InvalidKnobs as exc:
                result = Result(outcome="invalid", failure=f"{exc} (each of the {request.nproc} ranks trains 1/"
                                                           f"{request.nproc} of [burst] train_samples = "
                                                           f"{request.burst.train_samples})")
            write_json(out / f"rank{rank}.json", replace(result, placement=hostinfo.placement()).to_json())
            return code

        end = launch(request.nproc, body, grace_s=grace_s)
        results = {rank: Result.from_json(json.loads((out / f"rank{rank}.json").read_text()))
                   for rank in range(request.nproc) if (out / f"rank{rank}.json").exists()}
    finally:
        shutil.rmtree(out, ignore_errors=True)
    error = next((r.error for _, r in sorted(results.items()) if r.error), None)
    if error is not None:
        raise WorkloadError(error)
    if not end.ok or len(results) < request.nproc:
        told = ranks.first_failure(results)
        if told is not None:  # a rank said what went wrong (it left the burst early, ...): the cause
            rank, result = told
            return replace(result, failure=f"rank {rank} of {request.nproc}: {result.failure}; {end.reason()}")
        failed = end.failed
        if failed is not None and failed.status == -signal.SIGKILL:
            return Result(outcome="oom", failure=f"rank {failed.rank} of {request.nproc} was {KILLED_UNASKED}; the "
                                                 f"other ranks were stopped with it")
        raise GroupFailed(end.reason() or f"rank(s) {_listed(r for r in range(request.nproc) if r not in results)} "
                                          f"ended without a result")
    from knobtune.trainers.pytorch import distributed

    return ranks.merge(results, request.nproc, distributed.backend(distributed.device()), shares)


def _pin(cores: tuple[int, ...]) -> None:
    import torch

    os.sched_setaffinity(0, cores)
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
