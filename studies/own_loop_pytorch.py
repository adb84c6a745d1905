"""An ordinary PyTorch training script, shaped like the one in "why is my PyTorch 10x slower than
my TensorFlow?" (shared/seeds/000_*): a DataLoader, a train_loop and a test_loop, an epoch loop.
Six lines make knobtune able to tune it and to run the winner in production:

    kt = Tuned.load()                               # 1: the trial's knobs, or $KNOBTUNE_CONFIG
    train_loader = kt.dataloader(train_set, ...)    # 2: batch size, workers, prefetch, pinning
    trained = kt.prepare(model)                     # 3: device, channels_last, torch.compile
    for X, y in kt.batches(dataloader):             # 4: device copies, timing, the burst's end
        with kt.autocast():                         # 5: mixed precision
        kt.backward(loss, optimizer)                # 6: GradScaler, accumulation, NaN guard
    kt.report(val_accuracy=accuracy)                # and the accuracy, after each epoch's evaluation

Tune it:      knobtune run studies/own-loop-pytorch.toml
Run the winner:  knobtune export own-loop-pytorch -o best.json
                 KNOBTUNE_CONFIG=best.json python studies/own_loop_pytorch.py --epochs 20

The data: scikit-learn's handwritten digits as 28x28 PNG files on disk (what knobtune's built-in
workloads use), decoded and augmented per sample as a real image pipeline would.
"""
from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader

from knobtune.trainers.common import digits
from knobtune.pytorch import Tuned
from knobtune.trainers.pytorch.data import PngDigits


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, 256), nn.ReLU(), nn.Dropout(0.3),
        nn.Linear(256, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )


def train_loop(kt: Tuned, dataloader: DataLoader, model: nn.Module, loss_fn: nn.Module,
               optimizer: torch.optim.Optimizer) -> None:
    model.train()
    for X, y in kt.batches(dataloader):
        with kt.autocast():
            loss = loss_fn(model(X), y)
        kt.backward(loss, optimizer)


@torch.no_grad()
def test_loop(kt: Tuned, dataloader: DataLoader, model: nn.Module) -> float:
    model.eval()
    correct = 0
    for X, y in dataloader:
        X, y = X.to(kt.device), y.to(kt.device)
        correct += int((model(X).argmax(dim=1) == y).sum())
    return correct / len(dataloader.dataset)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description="Train an MLP on the digits, tuned by knobtune.")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    kt = Tuned.load()
    files = digits.prepare()
    train_loader = kt.dataloader(PngDigits(files.train, augment=True), batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(PngDigits(files.val, augment=False), batch_size=256)
    model = build_model()
    trained = kt.prepare(model)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        train_loop(kt, train_loader, trained, loss_fn, optimizer)
        accuracy = test_loop(kt, test_loader, model)
        print(f"epoch {epoch + 1}: accuracy {accuracy:.3f}", flush=True)
        # in a trial the first report after the burst ends the script (no more epochs, no more
        # evaluations); in production it logs the accuracy and training goes on
        kt.report(val_accuracy=accuracy)
    print("knobtune stats: " + json.dumps(kt.stats()), flush=True)


if __name__ == "__main__":
    main()
