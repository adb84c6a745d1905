"""Hugging Face ``Trainer`` (transformers), tuned through the lines a script already has::

    kt = Tuned.load()
    args = kt.training_arguments(TrainingArguments(output_dir="out", per_device_train_batch_size=16, ...))
    trainer = kt.trainer(Trainer(model=model, args=args, train_dataset=train, eval_dataset=val))
    trainer.train()
    trainer.evaluate()

``kt.training_arguments`` builds the arguments again with the knobs' fields (a field set on an
existing ``TrainingArguments`` does nothing: ``__post_init__`` turns bf16/fp16, tf32 and
torch_compile into the accelerator's settings once), and in a trial keeps evaluation,
checkpoints and reporting out of the burst and trains exactly the burst (``max_steps``).
``kt.trainer`` adds knobtune's callback: the burst's protocol (warm-up, settle, windows, the
device-side NaN guard on each micro-batch's loss) driven from the Trainer's own loop, the
knobs read back from what the Trainer built, and the script's ``evaluate()`` as the trial's
accuracy: ``eval_accuracy`` when the metrics have it, else ``exp(-eval_loss)`` (a language
model's loss is lower-is-better; its exponential is the geometric-mean probability of the
right token, a fraction the accuracy guard compares like an accuracy).
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch

from knobtune.spaces import libraries
from knobtune.trainers.common import roles
from knobtune.trainers.common.errors import InvalidKnobs, WorkloadError
from knobtune.trainers.common.production import log
from knobtune.trainers.common.protocol import make_schedule
from knobtune.trainers.pytorch.loops import AutocastSeen, LoaderView, count

try:
    from transformers import TrainerCallback, TrainingArguments
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is installed by make test
    raise WorkloadError("kt.training_arguments / kt.trainer need transformers: pip install 'knobtune[transformers]'"
                        ) from exc

if TYPE_CHECKING:
    from transformers import Trainer

    from knobtune.trainers.pytorch.tuned import Tuned

NOT_CHANNELS_LAST = "the Trainer integration keeps the model's memory format (channels_last is for conv nets)"


def _optim(args: TrainingArguments) -> str:
    """The optimizer's name (``__post_init__`` makes it an ``OptimizerNames`` member)."""
    return str(getattr(args.optim, "value", args.optim))


def settings(args: TrainingArguments, device: torch.device) -> dict[str, Any]:
    """The knobs as the script's own ``TrainingArguments`` set them (the baseline's values)."""
    names = ("per_device_train_batch_size", "gradient_accumulation_steps", "dataloader_num_workers",
             "dataloader_prefetch_factor", "dataloader_persistent_workers", "dataloader_in_order",
             "dataloader_pin_memory", "bf16", "fp16", "torch_compile", "torch_compile_mode", "tf32")
    return libraries.hf_settings({**{n: getattr(args, n, None) for n in names}, "optim": _optim(args)},
                                 cuda=device.type == "cuda")


def arguments(kt: Tuned, args: TrainingArguments) -> TrainingArguments:
    """``args`` built again with the knobs' fields; in a trial, the burst's too."""
    if not isinstance(args, TrainingArguments):
        raise WorkloadError(f"kt.training_arguments(args): expected a transformers.TrainingArguments, got "
                            f"{type(args).__name__}")
    kt.used.add("training_arguments")
    try:
        changes, skipped = libraries.hf_fields(kt.knobs, kt.explicit, cuda=kt.device.type == "cuda", optim=_optim(args))
    except ValueError as exc:
        raise InvalidKnobs(str(exc)) from None
    kt.also_not_exercised.update(skipped)
    if changes or isinstance(kt.driver, roles.Measuring):
        # knobtune's device-side guard replaces the Trainer's NaN filter, an isnan().item() per step
        changes["logging_nan_inf_filter"] = False
    if isinstance(kt.driver, roles.Measuring):
        changes.update(burst_fields(kt, {**dataclasses.asdict(args), **changes}))
    if not changes:
        return args
    try:
        return dataclasses.replace(args, **changes)
    except ValueError as exc:
        shown = ", ".join(f"{k}={v!r}" for k, v in changes.items())
        raise InvalidKnobs(f"TrainingArguments refused the knobs' fields ({shown}): {exc}") from None


def burst_fields(kt: Tuned, values: dict[str, Any]) -> dict[str, Any]:
    """A trial trains the burst and nothing else: exactly its optimizer steps, every batch the
    same shape, no evaluation, checkpoint or report while it runs (the script's own
    ``evaluate()`` afterwards gives the accuracy)."""
    assert kt.trial is not None
    k = int(values["gradient_accumulation_steps"])
    schedule = make_schedule(kt.trial.request.burst, int(values["per_device_train_batch_size"]), k,
                             execution_steps=k)
    return {"max_steps": schedule.total_steps // k, "eval_strategy": "no", "save_strategy": "no",
            "load_best_model_at_end": False, "report_to": "none", "dataloader_drop_last": True,
            "eval_on_start": False, "push_to_hub": False}


def attach(kt: Tuned, trainer: Trainer) -> Trainer:
    """``trainer`` with knobtune's callback, and its micro-batches counted and guarded."""
    if "training_arguments" not in kt.used:
        raise WorkloadError("kt.trainer(trainer): build the Trainer's arguments with kt.training_arguments(...) first "
                            "(the knobs are TrainingArguments fields)")
    callback = Callback(kt, trainer)
    trainer.add_callback(callback)
    step = trainer.training_step

    def training_step(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = step(model, inputs, *args, **kwargs)
        callback.micro_batch(loss, inputs)
        return loss

    trainer.training_step = training_step  # type: ignore[method-assign]
    kt.used.update({"dataloader", "prepare", "prepare_optimizer", "autocast", "backward", "batches"})
    kt.also_not_exercised.setdefault("channels_last", NOT_CHANNELS_LAST)
    return trainer


class Callback(TrainerCallback):
    """knobtune's side of a ``Trainer``: the role's burst (or watchdog) from the Trainer's steps,
    and the evaluation's metric as the accuracy."""

    def __init__(self, kt: Tuned, trainer: Trainer) -> None:
        self.kt, self.trainer = kt, trainer
        self.micro = 0     # micro-batches since training began
        self.samples = 0   # samples since the last optimizer step
        self.steps = 0     # optimizer steps since training began
        self.accumulation = 1

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        kt = self.kt
        unwrapped = self.trainer.accelerator.unwrap_model(self.trainer.model_wrapped, keep_torch_compile=False)
        kt.models.append((unwrapped, self.trainer.model_wrapped))
        inner = getattr(optimizer, "optimizer", optimizer)
        if inner is not None:
            kt.prepared.append(inner)
            kt.optimizers.append(inner)
        kt.accumulation = int(args.gradient_accumulation_steps)
        self.accumulation = kt.accumulation
        if kt.knobs["compile"] == "off":  # (a hook inside a compiled graph would be traced into it)
            kt.observed_autocast = AutocastSeen(unwrapped)
        else:  # what accelerate wraps the forward in
            kt.observed_autocast = Precision(self.trainer.accelerator.mixed_precision)
        kt.library = self.applied
        view = LoaderView.of(train_dataloader if train_dataloader is not None else self.trainer.get_train_dataloader())
        kt.made[id(view)] = (self.trainer.train_dataset, {}, True, settings(args, kt.device))
        kt.last_loader = view
        kt.driver.loop_begin(view, per_call=self.accumulation)

    def applied(self) -> dict[str, Any]:
        """What the Trainer itself used, for the trial's ``applied``."""
        trainer, seen = self.trainer, self.kt.observed_autocast
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        return {
            "integration": libraries.HF,
            "autocast_dtype": str(seen.fast_dtype).replace("torch.", "") if seen and seen.fast_dtype else None,
            "grad_scaler": getattr(trainer.accelerator, "scaler", None) is not None,
            "compiled": isinstance(trainer.model_wrapped, torch._dynamo.eval_frame.OptimizedModule),
            "optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "learning_rate": trainer.args.learning_rate,  # (the optimizer's has decayed by now)
            "trainer_max_steps": trainer.args.max_steps,
            "trainer_nan_filter": trainer.args.logging_nan_inf_filter,
        }

    def micro_batch(self, loss: torch.Tensor, inputs: Any) -> None:
        kt = self.kt
        if kt.guard is not None and kt.guarded:
            kt.guard.record(self.micro, loss)
        self.micro += 1
        self.samples += count(inputs)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps += 1
        # counted in whole optimizer steps: an epoch's last, shorter accumulation still ends on a boundary
        if not self.kt.driver.loop_step(self.steps * self.accumulation, self.samples):
            control.should_training_stop = True
        self.samples = 0

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.kt.driver.loop_end()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> None:
        accuracy, extra = metric(metrics or {})
        if accuracy is None:
            log.warning(f"trainer.evaluate() gave no accuracy and no loss (metrics: {', '.join(metrics or {})})")
        self.kt.report(val_accuracy=accuracy, **extra)


class Precision:
    """The autocast dtype accelerate applies for its ``mixed_precision`` setting."""

    def __init__(self, mixed_precision: Any) -> None:
        self.fast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(mixed_precision))


def metric(metrics: dict[str, float]) -> tuple[float | None, dict[str, Any]]:
    """The accuracy the guard compares, from ``evaluate()``'s metrics: ``*_accuracy`` as it is,
    else ``exp(-*_loss)`` (lower-is-better made a fraction: the mean per-token likelihood)."""
    for key, value in metrics.items():
        if key.endswith("_accuracy") and isinstance(value, (int, float)) and math.isfinite(value):
            return float(value), {key: float(value), "guard_metric": key}
    for key, value in metrics.items():
        if key.endswith("_loss") and isinstance(value, (int, float)):
            likelihood = math.exp(-value) if math.isfinite(value) else 0.0
            return likelihood, {key: float(value), "guard_metric": f"exp(-{key})"}
    return None, {}
