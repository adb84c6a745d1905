"""What ``torch.compile`` really did in this process, read back from dynamo's and inductor's
counters: graphs, graph breaks (with reasons), recompilations, a fall-back to eager, and CUDA
graphs skipped or replayed."""
from __future__ import annotations

import sys
from typing import Any

import torch

MAX_REASONS = 5


class ReplayCounter:
    """Counts CUDA-graph replays of inductor's cudagraph trees (reduce-overhead, max-autotune)."""

    def __init__(self) -> None:
        self.replays = 0
        try:
            from torch._inductor import cudagraph_trees
        except ImportError:  # pragma: no cover - inductor is part of torch >= 2.0
            return
        manager = cudagraph_trees.CUDAGraphTreeManager
        original = manager.execute_node
        counter = self

        def execute_node(self: Any, *args: Any, **kwargs: Any) -> Any:
            counter.replays += 1
            return original(self, *args, **kwargs)

        manager.execute_node = execute_node  # type: ignore[method-assign]  (this child process only)


def compilations() -> int:
    """Graphs dynamo has compiled in this process so far, recompilations included (0 while
    torch.compile has not been imported: reading this never imports it)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return int(utils.counters["stats"].get("unique_graphs", 0)) if utils is not None else 0


def _recompiles(frames: dict[str, int], resumes: dict[str, int]) -> int:
    """Compilations of a frame after its first: new shapes, failing guards."""
    try:
        from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER  # dynamo's own per-frame count

        return int(sum(max(0, n - 1) for n in FRAME_COMPILE_COUNTER.values()))
    except ImportError:  # every distinct frame (the forward, a resume per break) compiles once
        return max(0, int(frames.get("total", 0)) - (1 + len(resumes))) if frames.get("ok") else 0


def report(requested: str, replays: ReplayCounter | None = None) -> dict[str, Any]:
    """The compile read-back for a trial that asked for ``requested`` (a torch.compile mode)."""
    from torch._dynamo.utils import counters

    frames = dict(counters["frames"])
    breaks = dict(counters["graph_break"])
    resumes = dict(counters["resumes"])
    graphs = int(counters["stats"].get("unique_graphs", 0))
    compiled_frames = int(frames.get("ok", 0))
    recompiles = _recompiles(frames, resumes)
    out: dict[str, Any] = {
        "requested": requested,
        "graphs": graphs,
        "frames_compiled": compiled_frames,
        "graph_breaks": int(sum(breaks.values())),
        "break_reasons": [reason.splitlines()[0][:200] for reason in list(breaks)[:MAX_REASONS]],
        "recompiles": recompiles,
        "eager_fallback": graphs == 0,
        "cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0)),
    }
    if replays is not None:
        out["cudagraph_replays"] = replays.replays
    if out["eager_fallback"]:
        out["note"] = f"compile={requested!r} compiled no graph: the model ran eagerly"
    elif out["graph_breaks"]:
        out["note"] = f"{out['graph_breaks']} graph break(s): parts of the model ran eagerly"
    return out


def uses_cuda_graphs(mode: str, device: torch.device) -> bool:
    """reduce-overhead and max-autotune capture CUDA graphs on CUDA devices."""
    return device.type == "cuda" and mode in ("reduce-overhead", "max-autotune")
