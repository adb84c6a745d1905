"""knobtune's side of a trainer library's own training loop (Hugging Face's ``Trainer``:
huggingface.py; Lightning: lightning.py), shared by both: the role's burst or watchdog driven
from the library's step events, the device-side NaN guard on each micro-batch's loss, what the
library really built registered for the read-back, and its evaluation's metric as the accuracy.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from knobtune.trainers.common.production import log
from knobtune.trainers.pytorch.loops import AutocastSeen, LoaderView, count

if TYPE_CHECKING:
    from knobtune.trainers.pytorch.tuned import Tuned


class Precision:
    """The autocast dtype a library applies for its precision setting ("bf16", "bf16-mixed",
    "fp16", "16-mixed"; anything else: none)."""

    DTYPES = {"bf16": torch.bfloat16, "bf16-mixed": torch.bfloat16, "fp16": torch.float16, "16-mixed": torch.float16}

    def __init__(self, setting: Any) -> None:
        self.fast_dtype = self.DTYPES.get(str(setting))


class LibraryLoop:
    """One library loop's events, in knobtune's terms. ``begin`` when it starts training,
    ``micro_batch`` after each micro-batch's backward, ``step(done)`` every ``per_call``
    micro-batches (False: stop training), ``end`` when its loop ends, ``evaluated`` with its
    evaluation's metrics."""

    def __init__(self, kt: Tuned, what: str) -> None:
        self.kt, self.what = kt, what
        self.micro = 0    # micro-batches since training began
        self.samples = 0  # samples since the last step call

    def begin(self, model: torch.nn.Module, trained: torch.nn.Module, optimizer: Any, loader: Any,
              accumulation: int, precision: Any, applied: Callable[[], dict[str, Any]], per_call: int = 1,
              settings: Mapping[str, Any] | None = None) -> None:
        """``model`` (unwrapped) trained as ``trained`` with ``optimizer`` on ``loader``;
        ``precision`` the library's precision setting (read back from the first forward when
        the model runs eagerly); ``applied()`` the library's own report; ``settings`` the knobs
        as the script's arguments to the library set them (the probe's baseline)."""
        kt = self.kt
        if not any(m is model for m, _ in kt.models):
            kt.models.append((model, trained))
        if optimizer is not None:
            kt.prepared.append(optimizer)
            kt.optimizers.append(optimizer)
        kt.accumulation = accumulation
        # (a hook inside a compiled graph would be traced into it: there, the library's setting)
        kt.observed_autocast = AutocastSeen(model) if trained is model else Precision(precision)
        kt.library = applied
        made = kt.made.get(id(loader))
        if made is not None:  # kt.dataloader built it (a Lightning DataModule's convention)
            view = loader
            made[3].update(settings or {})
        else:  # the library built it from its arguments: read its settings from what it built
            view = LoaderView.of(loader)
            kt.made[id(view)] = (getattr(loader, "dataset", None), {}, True, dict(settings or {}))
        kt.last_loader = view
        kt.driver.loop_begin(view, per_call=per_call)

    def micro_batch(self, loss: Any, batch: Any) -> None:
        kt = self.kt
        if kt.guard is not None and kt.guarded and isinstance(loss, torch.Tensor):
            kt.guard.record(self.micro, loss)
        self.micro += 1
        self.samples += count(batch)

    def step(self, done: int) -> bool:
        go_on = self.kt.driver.loop_step(done, self.samples)
        self.samples = 0
        return go_on

    def end(self) -> None:
        self.kt.driver.loop_end()

    def evaluated(self, metrics: Mapping[str, Any]) -> None:
        accuracy, extra = metric(metrics)
        if accuracy is None:
            log.warning(f"{self.what} gave no accuracy and no loss (metrics: {', '.join(metrics) or 'none'})")
        self.kt.report(val_accuracy=accuracy, **extra)


def _number(value: Any) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def metric(metrics: Mapping[str, Any]) -> tuple[float | None, dict[str, Any]]:
    """The accuracy the guard compares, from an evaluation's metrics: a ``*accuracy`` or
    ``*acc`` metric as it is, else ``exp(-*loss)`` (lower-is-better made a fraction: for a
    language model the mean per-token likelihood)."""
    numbers = {key: v for key, value in metrics.items() if (v := _number(value)) is not None}
    # the held-out split's first: val_accuracy before a train_accuracy logged beside it
    numbers = dict(sorted(numbers.items(), key=lambda kv: not kv[0].startswith(("val", "eval"))))
    for key, value in numbers.items():
        if key.endswith(("accuracy", "_acc")) and math.isfinite(value) and 0.0 <= value <= 1.0:
            return value, {"guard_metric": key}
    for key, value in numbers.items():
        if key.endswith("loss"):
            return (math.exp(-value) if math.isfinite(value) else 0.0), {key: value, "guard_metric": f"exp(-{key})"}
    return None, {}
