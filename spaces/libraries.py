"""The PyTorch knobs as a trainer library's arguments: Hugging Face's ``TrainingArguments``
fields. Framework-free and defined once: the trial's child builds the arguments from these
(trainers/pytorch/huggingface.py), and the export snippet prints them.
"""
from __future__ import annotations

from typing import Any, Collection, Mapping

from knobtune.spaces.knobs import Shown

HF_OPTIMS = {"default": "adamw_torch", "fused": "adamw_torch_fused"}  # optimizer_impl -> TrainingArguments.optim
HF = "transformers.Trainer"


def hf_fields(values: Mapping[str, Any], names: Collection[str], *, cuda: bool, optim: str,
              sampling: str = "random") -> tuple[dict[str, Any], dict[str, str]]:
    """The ``TrainingArguments`` fields the knobs ``names`` set to ``values``, and knob -> why it
    is not a field here (the script's optimizer is not the Trainer's AdamW). ``optim`` and
    ``sampling``: the script's own ``optim`` and ``train_sampling_strategy``. Raises ValueError
    for a value the Trainer has no field for (optimizer_impl='foreach')."""
    out: dict[str, Any] = {}
    skipped: dict[str, str] = {}

    def wanted(name: str) -> bool:
        return name in names and values.get(name) is not None

    if wanted("batch_size"):
        out["per_device_train_batch_size"] = int(values["batch_size"])
    if wanted("accumulation_steps"):
        out["gradient_accumulation_steps"] = int(values["accumulation_steps"])
    if wanted("num_workers"):
        workers = int(values["num_workers"])
        out["dataloader_num_workers"] = workers
        # (the worker options only with workers: the Trainer refuses a prefetch_factor without them)
        out["dataloader_prefetch_factor"] = int(values.get("prefetch_factor") or 2) if workers else None
        out["dataloader_persistent_workers"] = bool(values.get("persistent_workers")) if workers else False
        out["dataloader_in_order"] = values.get("dataloader_in_order", True) is not False if workers else True
    if wanted("pin_memory") and cuda:
        out["dataloader_pin_memory"] = bool(values["pin_memory"])
    if wanted("amp"):
        out["bf16"], out["fp16"] = values["amp"] == "bf16", values["amp"] == "fp16"
        if values["amp"] == "bf16" and not cuda:
            out["use_cpu"] = True  # (the Trainer refuses bf16 without a GPU unless told it runs on the CPU)
    if wanted("compile"):
        mode = values["compile"]
        out["torch_compile"] = mode != "off"
        out["torch_compile_mode"] = None if mode in ("off", "default") else mode
    if wanted("matmul_precision") and cuda:  # (tf32=True raises on a machine without TF32)
        out["tf32"] = values["matmul_precision"] != "highest"
    if wanted("group_by_length"):
        if values["group_by_length"]:
            out["train_sampling_strategy"] = "group_by_length"
        elif sampling == "group_by_length":
            out["train_sampling_strategy"] = "random"
    if wanted("optimizer_impl"):
        impl = values["optimizer_impl"]
        if optim not in HF_OPTIMS.values():
            skipped["optimizer_impl"] = (f"TrainingArguments.optim is {optim!r}: the knob chooses between "
                                         f"{' and '.join(map(repr, HF_OPTIMS.values()))}")
        elif impl not in HF_OPTIMS:
            raise ValueError(f"optimizer_impl={impl!r}: the Trainer's AdamW is 'adamw_torch' (default) or "
                             f"'adamw_torch_fused' (fused); expected one of {', '.join(HF_OPTIMS)}")
        else:
            out["optim"] = HF_OPTIMS[impl]
    return out, skipped


def hf_settings(fields: Mapping[str, Any], *, cuda: bool) -> dict[str, Any]:
    """The knobs as a script's own ``TrainingArguments`` ``fields`` set them (the baseline)."""
    workers = int(fields.get("dataloader_num_workers") or 0)
    out: dict[str, Any] = {
        "batch_size": int(fields["per_device_train_batch_size"]),
        "accumulation_steps": int(fields["gradient_accumulation_steps"]),
        "num_workers": workers,
        "amp": "bf16" if fields.get("bf16") else "fp16" if fields.get("fp16") else "off",
        "compile": (fields.get("torch_compile_mode") or "default") if fields.get("torch_compile") else "off",
        "optimizer_impl": "fused" if fields.get("optim") == HF_OPTIMS["fused"] else "default",
        "group_by_length": fields.get("train_sampling_strategy") == "group_by_length",
    }
    if workers:
        out["prefetch_factor"] = int(fields.get("dataloader_prefetch_factor") or 2)
        out["persistent_workers"] = bool(fields.get("dataloader_persistent_workers"))
        out["dataloader_in_order"] = fields.get("dataloader_in_order", True) is not False
    if cuda:  # (on a CPU these fields do nothing: those knobs are not offered there)
        out["pin_memory"] = bool(fields.get("dataloader_pin_memory"))
        if fields.get("tf32") is not None:
            out["matmul_precision"] = "high" if fields["tf32"] else "highest"
    return out


def hf_script(shown: Shown) -> str:
    """The export snippet for a ``Trainer`` script: the ``TrainingArguments`` fields to set."""
    names = [name for name in shown.knobs if shown.on(name)]
    fields, _ = hf_fields(shown.knobs, names, cuda=shown.cuda,
                          optim=HF_OPTIMS.get(str(shown.knobs.get("optimizer_impl")), HF_OPTIMS["default"]))
    fields = {k: v for k, v in fields.items() if v is not None}
    if fields:
        fields["logging_nan_inf_filter"] = False  # (an isnan().item() per step: knobtune measured without it)
    setup = shown.lines("expandable_segments", "intra_op_threads", "cudnn_benchmark", "cudnn_deterministic")
    body = ["import torch", "from transformers import Trainer, TrainingArguments", "", *setup.code, "",
            "args = TrainingArguments(", "    ...,  # your other arguments, as they are",
            *[f"    {name}={value!r}," for name, value in fields.items()], ")",
            *shown.learning_rate("args.learning_rate = {lr}"),
            "trainer = Trainer(model=model, args=args, train_dataset=train_dataset)  # and the rest of yours"]
    return shown.source(setup.env, body)


LIGHTNING = "lightning.Trainer"
LIGHTNING_PRECISIONS = {"off": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}  # amp -> Trainer(precision=)


def lightning_arguments(values: Mapping[str, Any], names: Collection[str], *, cuda: bool) -> dict[str, Any]:
    """The Lightning ``Trainer`` arguments the knobs ``names`` set to ``values`` (the DataLoader
    knobs are the DataModule's: it builds its training loader with ``kt.dataloader``; compile is
    ``kt.prepare(module)``)."""
    out: dict[str, Any] = {}
    if "amp" in names:
        out["precision"] = LIGHTNING_PRECISIONS[str(values["amp"])]
    if "accumulation_steps" in names:
        out["accumulate_grad_batches"] = int(values["accumulation_steps"])
    if cuda:  # (Lightning sets torch.backends.cudnn from these; on a CPU they do nothing)
        if "cudnn_benchmark" in names:
            out["benchmark"] = bool(values["cudnn_benchmark"])
        if "cudnn_deterministic" in names and values["cudnn_deterministic"]:
            out["deterministic"] = True
    return out


def lightning_settings(arguments: Mapping[str, Any], *, cuda: bool) -> dict[str, Any]:
    """The knobs as a script's own ``Trainer`` arguments set them (the baseline)."""
    precisions = {v: k for k, v in LIGHTNING_PRECISIONS.items()}
    precisions.update({"32": "off", "bf16": "bf16", "16": "fp16", "16-mixed": "fp16", "bf16-mixed": "bf16"})
    out: dict[str, Any] = {"accumulation_steps": int(arguments.get("accumulate_grad_batches") or 1)}
    precision = str(arguments.get("precision") or "32-true")
    if precision in precisions:
        out["amp"] = precisions[precision]
    if cuda:
        out["cudnn_benchmark"] = bool(arguments.get("benchmark"))
        out["cudnn_deterministic"] = bool(arguments.get("deterministic"))
    return out


def lightning_script(shown: Shown) -> str:
    """The export snippet for a Lightning script: the DataModule's loader arguments, the module
    compiled, and the ``Trainer`` arguments to set."""
    names = [name for name in shown.knobs if shown.on(name)]
    arguments = lightning_arguments(shown.knobs, names, cuda=shown.cuda)
    setup = shown.lines("expandable_segments", "intra_op_threads", "matmul_precision")
    loader = [*shown.lines("batch_size").code, "shuffle=True"]
    if int(shown.value("num_workers", 0) or 0):
        loader += shown.lines("num_workers", "prefetch_factor", "persistent_workers", "dataloader_in_order").code
    loader += shown.lines("pin_memory").code
    body = ["import lightning as L", "import torch", "from torch.utils.data import DataLoader", "", *setup.code, "",
            "# in your LightningDataModule:", "def train_dataloader(self):",
            f"    return DataLoader(self.train_set, {', '.join(loader)})", "",
            *_compiled(str(shown.value("compile", "off"))),
            "trainer = L.Trainer(", "    ...,  # your other arguments, as they are",
            *[f"    {name}={value!r}," for name, value in arguments.items()], ")",
            "trainer.fit(model, datamodule=datamodule)"]
    return shown.source(setup.env, body)


def _compiled(mode: str) -> list[str]:
    if mode == "off":
        return []
    return [f"model = torch.compile(model{'' if mode == 'default' else f', mode={mode!r}'})  # trainer.fit takes it"]
