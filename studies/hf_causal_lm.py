"""A Hugging Face ``Trainer`` script: a small causal language model (GPT-2's architecture, built
from a config, nothing downloaded) over byte-level tokens of the charlm text (the Python
standard library's own source files), in samples of whole lines (their lengths differ, so
batches are padded, and grouping them by length is a knob). Two lines make knobtune able to tune
it and to run the winner in production:

    kt = Tuned.load()
    args = kt.training_arguments(TrainingArguments(...))    # 1: the knobs are TrainingArguments fields
    trainer = kt.trainer(Trainer(model=model, args=args, ...))  # 2: knobtune's callback measures

Tune it:         knobtune run studies/hf-causal-lm.toml
Run the winner:  knobtune export hf-causal-lm -o best.json
                 KNOBTUNE_CONFIG=best.json python studies/hf_causal_lm.py --epochs 3

Its evaluation gives ``eval_loss`` (lower is better): the trial's accuracy is exp(-eval_loss),
the mean per-token likelihood (see the README, "Hugging Face Trainer").
"""
from __future__ import annotations

import argparse
import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from knobtune.pytorch import Tuned
from knobtune.trainers.common import text

CONTEXT = 64


class Lines(torch.utils.data.Dataset):
    """Windows of byte tokens cut after their last whole line (so samples differ in length, as
    text does), as the dicts a causal LM takes (the labels are the inputs: the model shifts them)."""

    def __init__(self, rows) -> None:  # type: ignore[no-untyped-def]
        self.rows = [torch.from_numpy(row[: _cut(row)].astype("int64")) for row in rows[:, :CONTEXT]]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[index]}


def _cut(row) -> int:  # type: ignore[no-untyped-def]
    newlines = (row == ord("\n")).nonzero()[0]
    last = int(newlines[-1]) + 1 if len(newlines) else len(row)
    return last if last >= 16 else len(row)


def pad(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A batch padded to its longest sample (padding masked out of attention and of the loss)."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.int64)
    mask = torch.zeros(len(samples), longest, dtype=torch.int64)
    for i, sample in enumerate(samples):
        ids[i, : len(sample["input_ids"])] = sample["input_ids"]
        mask[i, : len(sample["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def build_model() -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=text.VOCAB, n_positions=CONTEXT, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a small GPT-2 on byte tokens with the Trainer, tuned by knobtune.")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--output", default="hf-causal-lm-out")
    args = parser.parse_args()

    corpus = text.prepare(context=CONTEXT, train_chars=400_000, eval_windows=128)
    torch.manual_seed(0)
    kt = Tuned.load()
    training = kt.training_arguments(TrainingArguments(
        output_dir=args.output, num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64, learning_rate=1e-3, logging_steps=50, save_strategy="no",
        report_to="none", seed=0, disable_tqdm=True))
    trainer = kt.trainer(Trainer(model=build_model(), args=training, train_dataset=Lines(corpus.train),
                                 eval_dataset=Lines(corpus.val), data_collator=pad))
    trainer.train()
    metrics = trainer.evaluate()  # in a trial, this ends the script: its eval_loss is the trial's
    print(f"eval_loss {metrics['eval_loss']:.3f}", flush=True)
    print("knobtune stats: " + json.dumps(kt.stats()), flush=True)  # the rate, and the knobs read back


if __name__ == "__main__":
    main()
