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
from typing import TYPE_CHECKING, Any

import torch

from knobtune.spaces import libraries
from knobtune.trainers.common import roles
from knobtune.trainers.common.errors import InvalidKnobs, WorkloadError
from knobtune.trainers.common.protocol import make_schedule
from knobtune.trainers.pytorch.libraries import LibraryLoop
from knobtune.trainers.pytorch.roles import ProbeDriver

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
             "dataloader_pin_memory", "bf16", "fp16", "torch_compile", "torch_compile_mode", "tf32",
             "train_sampling_strategy")
    return libraries.hf_settings({**{n: getattr(args, n, None) for n in names}, "optim": _optim(args)},
                                 cuda=device.type == "cuda")


def arguments(kt: Tuned, args: TrainingArguments) -> TrainingArguments:
    """``args`` built again with the knobs' fields; in a trial, the burst's too."""
    if not isinstance(args, TrainingArguments):
        raise WorkloadError(f"kt.training_arguments(args): expected a transformers.TrainingArguments, got "
                            f"{type(args).__name__}")
    kt.used.add("training_arguments")
    try:
        changes, skipped = libraries.hf_fields(kt.knobs, kt.explicit, cuda=kt.device.type == "cuda", optim=_optim(args),
                                               sampling=str(args.train_sampling_strategy))
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
        callback.loop.micro_batch(loss, inputs)
        return loss

    trainer.training_step = training_step  # type: ignore[method-assign]
    kt.used.update({"dataloader", "prepare", "prepare_optimizer", "autocast", "backward"})
    kt.integration = libraries.HF
    kt.also_not_exercised.setdefault("channels_last", NOT_CHANNELS_LAST)
    return trainer


def lengths_vary(dataset: Any, looked_at: int = 64) -> bool:
    """Whether the first ``looked_at`` samples' inputs differ in length (what group_by_length groups)."""
    try:
        lengths = {len(dataset[i]["input_ids"]) for i in range(min(looked_at, len(dataset)))}
    except (TypeError, KeyError, IndexError):  # not a sized dataset of dicts with input_ids
        return False
    return len(lengths) > 1


class Callback(TrainerCallback):
    """knobtune's side of a ``Trainer``: its events handed to the shared library loop."""

    def __init__(self, kt: Tuned, trainer: Trainer) -> None:
        self.kt, self.trainer = kt, trainer
        self.loop = LibraryLoop(kt, "trainer.evaluate()")
        self.steps = 0  # optimizer steps since training began
        self.accumulation = 1

    def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        trainer = self.trainer
        self.accumulation = int(args.gradient_accumulation_steps)
        loader = train_dataloader if train_dataloader is not None else trainer.get_train_dataloader()
        if isinstance(self.kt.driver, ProbeDriver):  # only the probe asks (it reads up to 64 samples)
            self.kt.variable_lengths = lengths_vary(trainer.train_dataset)
        self.loop.begin(trainer.accelerator.unwrap_model(trainer.model_wrapped, keep_torch_compile=False),
                        trainer.model_wrapped, getattr(optimizer, "optimizer", optimizer), loader, self.accumulation,
                        trainer.accelerator.mixed_precision, self.applied, per_call=self.accumulation,
                        settings=settings(args, self.kt.device))

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

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps += 1
        # counted in whole optimizer steps: an epoch's last, shorter accumulation still ends on a boundary
        if not self.loop.step(self.steps * self.accumulation):
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loop.end()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> None:
        self.loop.evaluated(metrics or {})
