"""A Lightning script: a LightningModule (an MLP on the handwritten digits) and a
LightningDataModule (28x28 PNG files decoded and augmented per sample). Three lines make knobtune
able to tune it and to run the winner in production:

    kt = Tuned.load()
    return kt.dataloader(self.train_set, batch_size=..., shuffle=True)   # 1: in train_dataloader()
    model = kt.prepare(Classifier())                                      # 2: torch.compile (a knob)
    trainer = kt.lightning_trainer(max_epochs=...)                        # 3: L.Trainer(...) + callback

Tune it:         knobtune run studies/lightning-digits.toml
Run the winner:  knobtune export lightning-digits -o best.json
                 KNOBTUNE_CONFIG=best.json python studies/lightning_digits.py --epochs 10
"""
from __future__ import annotations

import argparse
import json

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from knobtune.pytorch import Tuned
from knobtune.trainers.common import digits
from knobtune.trainers.pytorch.data import PngDigits


class Classifier(L.LightningModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 256), nn.ReLU(), nn.Dropout(0.3),
                                 nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.loss(self(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_accuracy", (self(x).argmax(dim=1) == y).float().mean(), on_epoch=True, prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class Digits(L.LightningDataModule):
    def __init__(self, kt: Tuned, batch_size: int) -> None:
        super().__init__()
        self.kt, self.batch_size = kt, batch_size

    def setup(self, stage: str) -> None:
        files = digits.prepare()
        self.train_set = PngDigits(files.train, augment=True)
        self.val_set = PngDigits(files.val, augment=False)

    def train_dataloader(self) -> DataLoader:
        return self.kt.dataloader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


def main() -> None:
    parser = argparse.ArgumentParser(description="Train an MLP on the digits with Lightning, tuned by knobtune.")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    kt = Tuned.load()
    data = Digits(kt, args.batch_size)
    model = kt.prepare(Classifier())
    trainer = kt.lightning_trainer(max_epochs=args.epochs, accelerator="auto", devices=1, logger=False,
                                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=data)
    trainer.validate(model, datamodule=data, verbose=False)  # in a trial, this ends the script
    print(f"val_accuracy {float(trainer.callback_metrics['val_accuracy']):.3f}", flush=True)
    print("knobtune stats: " + json.dumps(kt.stats()), flush=True)  # the rate, and the knobs read back


if __name__ == "__main__":
    main()
