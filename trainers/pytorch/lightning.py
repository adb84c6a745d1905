"""Lightning, tuned through the lines a script already has::

    kt = Tuned.load()
    class Data(L.LightningDataModule):
        def train_dataloader(self):                       # the convention: the training loader
            return kt.dataloader(self.train_set, batch_size=64, shuffle=True)   # is kt.dataloader's
    model = kt.prepare(LitModel())                        # torch.compile of the module (a knob)
    trainer = kt.lightning_trainer(max_epochs=10)         # L.Trainer(...) with the knobs' arguments
    trainer.fit(model, datamodule=Data())
    trainer.validate(model, datamodule=Data())

``kt.lightning_trainer(**arguments)`` is ``lightning.Trainer(**arguments)`` with the knobs'
arguments (``precision``, ``accumulate_grad_batches``, on CUDA ``benchmark`` and
``deterministic``) and knobtune's callback: the burst's protocol driven from the training
batches (the device-side NaN guard on each batch's loss), the knobs read back from what the
Trainer built, and the script's validation metric (``val_accuracy``, or ``exp(-val_loss)``) as
the trial's accuracy. In a trial the Trainer trains the burst and stops; no validation,
checkpoint or logger runs inside it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from knobtune.spaces import libraries
from knobtune.trainers.common import roles
from knobtune.trainers.common.errors import WorkloadError
from knobtune.trainers.pytorch import knobs as K
from knobtune.trainers.pytorch.libraries import LibraryLoop

try:
    import lightning.pytorch as L
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is installed by make test
    raise WorkloadError("kt.lightning_trainer needs lightning: pip install 'knobtune[lightning]'") from exc

if TYPE_CHECKING:
    from knobtune.trainers.pytorch.tuned import Tuned

NO_VALIDATION = 10**9  # batches between validations inside fit: never, in a trial's burst


def trainer(kt: Tuned, arguments: dict[str, Any]) -> L.Trainer:
    """``lightning.Trainer(**arguments)`` with the knobs' arguments and knobtune's callback."""
    kt.used.add("lightning_trainer")
    cuda = kt.device.type == "cuda"
    own = dict(arguments)
    changes = libraries.lightning_arguments(kt.knobs, kt.explicit, cuda=cuda)
    if isinstance(kt.driver, roles.Measuring):
        # the burst and nothing else: stopped by the callback once measured, no validation,
        # checkpoint or logging inside it (the script's trainer.validate() afterwards scores it)
        changes.update(max_epochs=-1, max_steps=-1, num_sanity_val_steps=0, check_val_every_n_epoch=None,
                       val_check_interval=NO_VALIDATION, enable_checkpointing=False, logger=False)
    callback = Callback(kt, libraries.lightning_settings(own, cuda=cuda))
    callbacks = list(own.pop("callbacks", None) or [])
    try:
        built = L.Trainer(**{**own, **changes}, callbacks=[*callbacks, callback])
    except (TypeError, ValueError) as exc:
        shown = ", ".join(f"{k}={v!r}" for k, v in changes.items())
        raise WorkloadError(f"lightning.Trainer refused the arguments ({shown}): {exc}") from None
    callback.trainer = built
    kt.used.update({"prepare_optimizer", "autocast", "backward"})
    kt.integration = libraries.LIGHTNING
    return built


class Callback(L.Callback):
    """knobtune's side of a Lightning ``Trainer``: its events handed to the shared library loop."""

    def __init__(self, kt: Tuned, settings: dict[str, Any]) -> None:
        self.kt, self.settings = kt, settings
        self.loop = LibraryLoop(kt, "trainer.validate()")
        self.trainer: L.Trainer | None = None
        self.compiled = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        kt = self.kt
        loader = trainer.train_dataloader
        if id(loader) not in kt.made:
            raise WorkloadError("the LightningDataModule's train_dataloader() must return kt.dataloader(...): "
                                "knobtune sets the training DataLoader's knobs there")
        self.compiled = getattr(pl_module, "_compiler_ctx", None) is not None
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.loop.begin(pl_module, _Compiled() if self.compiled else pl_module, self._optimizer(trainer, optimizer),
                        loader, int(trainer.accumulate_grad_batches), trainer.precision, self.applied,
                        settings=self.settings)

    def _optimizer(self, trainer: L.Trainer, optimizer: Any) -> Any:
        """The module's optimizer with the ``optimizer_impl`` knob's implementation (same class,
        groups, options, state), unless a learning-rate scheduler already holds it."""
        kt = self.kt
        impl = kt.knobs["optimizer_impl"]
        if optimizer is None or impl == "default" or "optimizer_impl" not in kt.explicit or K.impl_used(optimizer) == impl:
            return optimizer
        if trainer.lr_scheduler_configs:
            kt.also_not_exercised["optimizer_impl"] = ("configure_optimizers returns a learning-rate scheduler, which "
                                                       "holds the optimizer: it is not rebuilt")
            return optimizer
        problem = K.impl_problem(optimizer, impl, kt.device)
        if problem is not None:
            kt.driver.refuse(problem, "; running with its default implementation instead")
            return optimizer
        twin = K.with_impl(optimizer, impl)
        trainer.strategy.optimizers = [twin, *trainer.optimizers[1:]]
        return twin

    def applied(self) -> dict[str, Any]:
        """What the Trainer itself used, for the trial's ``applied``."""
        built, seen = self.trainer, self.kt.observed_autocast
        assert built is not None
        optimizer = built.optimizers[0] if built.optimizers else None
        return {
            "integration": libraries.LIGHTNING,
            "autocast_dtype": str(seen.fast_dtype).replace("torch.", "") if seen and seen.fast_dtype else None,
            "precision": str(built.precision),
            "grad_scaler": getattr(built.precision_plugin, "scaler", None) is not None,
            "compiled": self.compiled,
            "optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "learning_rate": optimizer.param_groups[0]["lr"] if optimizer is not None else None,
        }

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.loop.micro_batch(loss, batch)
        if not self.loop.step(self.loop.micro):
            trainer.should_stop = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.loop.end()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.loop.evaluated(dict(trainer.callback_metrics))


class _Compiled:
    """Stands for the compiled steps of a module Lightning compiled (``trained is not model``)."""
