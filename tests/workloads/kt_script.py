"""A user's own PyTorch training script for the tests, on a slice of the real digits. Flags
break it in the ways the tests need: ``--raise-before`` (fails before its first batch),
``--no-batches`` (never iterates kt.batches), ``--no-report`` (never reports its accuracy),
``--no-autocast`` (never enters kt.autocast), ``--nan-after N`` (loss non-finite after N steps),
``--dict`` (dict batches, Hugging Face style). In a data-parallel trial, ``--rank R`` limits
``--nan-after`` to rank R, ``--die-after N`` makes rank R kill itself (SIGTERM) after N steps and
``--stop-after N`` makes it leave kt.batches after N steps; ``--pids DIR`` writes each rank's pid;
``--no-prepare`` never calls kt.prepare."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from knobtune.pytorch import Tuned
from knobtune.trainers.common import digits
from knobtune.trainers.pytorch.data import PngDigits
from knobtune.trainers.pytorch.models import mlp

from kt_test_workloads import DictDigits


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--raise-before", action="store_true")
    p.add_argument("--no-batches", action="store_true")
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--no-autocast", action="store_true")
    p.add_argument("--nan-after", type=int)
    p.add_argument("--dict", action="store_true")
    p.add_argument("--evaluate", action="store_true", help="give kt.batches an evaluation (time-to-accuracy)")
    p.add_argument("--rank", type=int, help="the rank --nan-after, --die-after and --stop-after act in")
    p.add_argument("--die-after", type=int)
    p.add_argument("--stop-after", type=int)
    p.add_argument("--pids", type=Path)
    p.add_argument("--no-prepare", action="store_true", help="train the model as it is, never calling kt.prepare")
    args = p.parse_args()
    me = int(os.environ.get("RANK", "0"))
    chosen = args.rank is None or args.rank == me
    if args.pids:
        args.pids.mkdir(parents=True, exist_ok=True)
        (args.pids / f"rank{me}.pid").write_text(str(os.getpid()))

    kt = Tuned.load()
    files = digits.prepare()
    # the evaluation loader first, and through the API: it must not become the baseline's loader
    val = kt.dataloader(PngDigits(files.val[:160], augment=False), train=False, batch_size=64)
    train_set: Dataset = PngDigits(files.train[:320], augment=True)
    if args.dict:
        train_set = DictDigits(train_set)
    loader = kt.dataloader(train_set, shuffle=True, batch_size=args.batch_size, num_workers=args.workers)
    model = mlp()
    trained = model if args.no_prepare else kt.prepare(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    if args.raise_before:
        raise RuntimeError("the user's data set could not be opened")
    def evaluate() -> float:
        model.eval()
        with torch.no_grad():
            right = sum(int((model(x.to(kt.device)).argmax(1) == y.to(kt.device)).sum()) for x, y in val)
        return right / 160

    steps = 0
    for epoch in range(args.epochs):
        if args.no_batches:
            break
        for batch in kt.batches(loader, evaluate=evaluate if args.evaluate else None):
            x, y = (batch["pixels"], batch["label"]) if args.dict else batch
            if args.no_autocast:
                loss = loss_fn(trained(x), y)
            else:
                with kt.autocast():
                    loss = loss_fn(trained(x), y)
            steps += 1
            if args.nan_after is not None and steps > args.nan_after and chosen:
                loss = loss * float("nan")
            if args.die_after is not None and steps > args.die_after and chosen:
                os.kill(os.getpid(), signal.SIGTERM)
            if args.stop_after is not None and steps > args.stop_after and chosen:
                break
            kt.backward(loss, optimizer)
        print(f"epoch {epoch + 1} done", flush=True)
    if not args.no_report:
        kt.report(val_accuracy=evaluate())
    # one write of the whole line: under torchrun every rank shares this stdout, and print's text and
    # its newline can go out as two writes (unbuffered stdout) with another rank's line between them
    sys.stdout.write("stats " + json.dumps(kt.stats()) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
