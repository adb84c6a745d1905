"""The hooks' cost for the PyTorch trainer libraries (Hugging Face Trainer, Lightning): see
benchmarks/trainer_libraries.py, which runs this file once per library.

    .venv/bin/python benchmarks/_hooks_pytorch.py hf|lightning [--rounds 12] [--steps 60]
"""
from __future__ import annotations

import sys
import tempfile
from typing import Any, Callable

from _hooks import Clock, main


def hf_round(steps: int) -> tuple[Callable[[], float], Callable[[], float]]:
    """(without knobtune, with it): each trains ``steps`` optimizer steps and returns its rate."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import hf_causal_lm as job
    from knobtune.pytorch import Tuned
    from knobtune.trainers.common import text

    corpus = text.prepare(context=job.CONTEXT, train_chars=400_000, eval_windows=128)
    train = job.Lines(corpus.train)
    kt = Tuned.load()
    batch = 16

    class Timing(TrainerCallback):
        def __init__(self, clock: Clock) -> None:
            self.clock = clock

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.clock.tick()

    def arguments() -> TrainingArguments:
        return TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=steps, per_device_train_batch_size=batch,
                                 learning_rate=1e-3, save_strategy="no", report_to="none", disable_tqdm=True,
                                 logging_strategy="no", seed=0, dataloader_drop_last=True)

    def run(wrapped: bool) -> float:
        torch.manual_seed(0)
        clock = Clock(batch)
        args = kt.training_arguments(arguments()) if wrapped else arguments()
        trainer = Trainer(model=job.build_model(), args=args, train_dataset=train, data_collator=job.pad,
                          callbacks=[Timing(clock)])
        if wrapped:
            trainer = kt.trainer(trainer)
        trainer.train()
        return clock.rate()

    return (lambda: run(False)), (lambda: run(True))



def lightning_round(steps: int) -> tuple[Callable[[], float], Callable[[], float]]:
    import lightning.pytorch as L
    import torch

    import lightning_digits as job
    from knobtune.pytorch import Tuned

    kt = Tuned.load()
    batch = 64
    data = job.Digits(kt, batch)
    data.setup("fit")
    plain_loader = torch.utils.data.DataLoader(data.train_set, batch_size=batch, shuffle=True, drop_last=True)
    kt_loader = kt.dataloader(data.train_set, batch_size=batch, shuffle=True, drop_last=True)

    class Timing(L.Callback):
        def __init__(self, clock: Clock) -> None:
            self.clock = clock

        def on_train_batch_end(self, *args: Any) -> None:
            self.clock.tick()

    options = dict(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False)

    def run(wrapped: bool) -> float:
        torch.manual_seed(0)
        clock = Clock(batch)
        if wrapped:
            trainer = kt.lightning_trainer(**options, callbacks=[Timing(clock)])
            model = kt.prepare(job.Classifier())
            trainer.fit(model, train_dataloaders=kt_loader)
        else:
            trainer = L.Trainer(**options, callbacks=[Timing(clock)])
            trainer.fit(job.Classifier(), train_dataloaders=plain_loader)
        return clock.rate()

    return (lambda: run(False)), (lambda: run(True))


if __name__ == "__main__":
    sys.exit(main({"hf": ("Hugging Face Trainer", hf_round, 60), "lightning": ("Lightning", lightning_round, 60)}))
