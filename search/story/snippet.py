"""``knobtune export NAME --format snippet``: the winner as the lines to change in a training
script, for a user who does not adopt the Tuned API. Generated from the export document (the
knobs and the learning rate the winner was measured with); framework-free text."""
from __future__ import annotations

from typing import Any

AUTOTUNE = "autotune"


def snippet(doc: dict[str, Any]) -> str:
    """Python source for the export ``doc``'s framework, headed by what it was measured as."""
    framework = doc.get("framework")
    if framework == "pytorch":
        body = pytorch(doc["knobs"], doc)
    elif framework == "tensorflow":
        body = tensorflow(doc["knobs"], doc)
    else:
        raise ValueError(f"export of framework {framework!r}: expected 'pytorch' or 'tensorflow'")
    return _header(doc) + body


def headline_speedup(doc: dict[str, Any]) -> str | None:
    """``1.46x the baseline (median of 8 paired rounds)``: the export's headline speedup, and which
    figure it is (an export written before 0.2 has only the search trial's, ``metrics.speedup``)."""
    found = doc.get("speedup") or {}
    if found.get("value"):
        return f"{found['value']:.2f}x the baseline ({found['figure']})"
    searched = (doc.get("metrics") or {}).get("speedup")
    return f"{searched:.2f}x the baseline (one search trial each)" if searched else None


def _header(doc: dict[str, Any]) -> str:
    confirmed = doc.get("confirmed") or {}
    speedup = headline_speedup(doc)
    if confirmed.get("baseline_won"):
        verdict = "no configuration beat your current settings: these are the baseline's"
    elif speedup:
        verdict = speedup
    else:
        verdict = "the best trial"
    lines = [
        f"# knobtune: study {doc.get('study')!r}, trial #{doc.get('trial')}: {verdict}.",
        "# The lines to change in your training script (names in angle brackets are yours:",
        "# train_set, model, loss_fn, optimizer, device, epochs; files, parse_fn, augment_fn for tf.data).",
    ]
    skipped = {k: v for k, v in (doc.get("not_applied") or {}).items() if v}
    if skipped:
        lines.append("# Not applied when measured (left out here): "
                     + "; ".join(f"{k}: {why}" for k, why in sorted(skipped.items())))
    return "\n".join(lines) + "\n"


def _applied(knobs: dict[str, Any], doc: dict[str, Any], name: str) -> bool:
    return name in knobs and name not in (doc.get("not_applied") or {})


def _learning_rate(doc: dict[str, Any], setter: str) -> list[str]:
    scale, lr = doc.get("lr_scale") or 1.0, doc.get("learning_rate")
    if scale == 1.0 or lr is None:
        return []
    return [f"# measured with the learning rate rescaled by {scale:.4g} ([study] lr_scaling = "
            f"{doc.get('lr_scaling')!r}) for its effective batch:", setter.format(lr=repr(lr)), ""]


def pytorch(knobs: dict[str, Any], doc: dict[str, Any]) -> str:
    on = lambda name: _applied(knobs, doc, name)  # noqa: E731
    out = ["import torch", "from torch.utils.data import DataLoader", ""]
    if on("expandable_segments") and knobs["expandable_segments"]:
        out[:0] = ["import os", "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'  # before torch "
                   "allocates CUDA memory"]
    if on("intra_op_threads") and knobs["intra_op_threads"]:
        out.append(f"torch.set_num_threads({int(knobs['intra_op_threads'])})")
    if on("cudnn_benchmark"):
        out.append(f"torch.backends.cudnn.benchmark = {bool(knobs['cudnn_benchmark'])}")
    if on("cudnn_deterministic"):
        out.append(f"torch.backends.cudnn.deterministic = {bool(knobs['cudnn_deterministic'])}")
    if on("matmul_precision") and knobs["matmul_precision"] != "highest":
        out.append(f"torch.set_float32_matmul_precision({knobs['matmul_precision']!r})")
    workers = int(knobs.get("num_workers") or 0) if on("num_workers") else 0
    args = ([f"batch_size={int(knobs['batch_size'])}"] if on("batch_size") else []) + ["shuffle=True"]
    if workers:
        args.append(f"num_workers={workers}")
        if on("prefetch_factor"):
            args.append(f"prefetch_factor={int(knobs['prefetch_factor'])}")
        if on("persistent_workers"):
            args.append(f"persistent_workers={bool(knobs['persistent_workers'])}")
        if on("dataloader_in_order") and knobs["dataloader_in_order"] is False:
            args.append("in_order=False")
    pinned = on("pin_memory") and bool(knobs["pin_memory"])
    if pinned:
        args.append("pin_memory=True")
    out += ["", f"train_loader = DataLoader(train_set, {', '.join(args)})", "", "model = model.to(device)"]
    if on("channels_last") and knobs["channels_last"]:
        out.append("model = model.to(memory_format=torch.channels_last)")
    compile_mode = knobs.get("compile", "off") if on("compile") else "off"
    trained = "model"
    if compile_mode != "off":
        trained = "trained"
        mode = "" if compile_mode == "default" else f", mode={compile_mode!r}"
        out.append(f"trained = torch.compile(model{mode})  # evaluate with `model`: it shares the weights")
    out.append("")
    impl = knobs.get("optimizer_impl", "default") if on("optimizer_impl") else "default"
    if impl != "default":
        out += [f"# measured with the optimizer built with {impl}=True, e.g. torch.optim.Adam(model.parameters(), "
                f"lr=..., {impl}=True)", ""]
    out += _learning_rate(doc, "for group in optimizer.param_groups:\n    group['lr'] = {lr}")
    amp = knobs.get("amp", "off") if on("amp") else "off"
    k = int(knobs.get("accumulation_steps") or 1) if on("accumulation_steps") else 1
    if amp == "fp16":
        out.append("scaler = torch.amp.GradScaler(device.type)")
    autocast = ({"bf16": "torch.bfloat16", "fp16": "torch.float16"}[amp] if amp != "off" else None)
    copy = ", non_blocking=True" if pinned else ""
    loss = "loss / " + str(k) if k > 1 else "loss"
    out += ["for epoch in range(epochs):", f"    {trained}.train()",
            "    for step, (x, y) in enumerate(train_loader):",
            f"        x, y = x.to(device{copy}), y.to(device{copy})"]
    if on("channels_last") and knobs["channels_last"]:
        out.append("        x = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x")
    if autocast:
        out += [f"        with torch.autocast(device_type=device.type, dtype={autocast}):",
                f"            loss = loss_fn({trained}(x), y)"]
    else:
        out.append(f"        loss = loss_fn({trained}(x), y)")
    if amp == "fp16":
        out.append(f"        scaler.scale({loss}).backward()")
        step = ["scaler.step(optimizer)", "scaler.update()", "optimizer.zero_grad(set_to_none=True)"]
    else:
        out.append(f"        ({loss}).backward()" if k > 1 else "        loss.backward()")
        step = ["optimizer.step()", "optimizer.zero_grad(set_to_none=True)"]
    if k > 1:
        out.append(f"        if (step + 1) % {k} == 0:  # accumulation_steps = {k}")
        out += [f"            {s}" for s in step]
    else:
        out += [f"        {s}" for s in step]
    return "\n".join(out) + "\n"


def _calls(value: Any) -> str:
    return "tf.data.AUTOTUNE" if value == AUTOTUNE else str(int(value))


def _options(knobs: dict[str, Any], on: Any) -> list[str]:
    """The tf.data Options lines (none at TensorFlow's defaults)."""
    lines = []
    if on("map_parallelization") and knobs["map_parallelization"] is False:
        lines.append("options.experimental_optimization.map_parallelization = False")
    if on("private_threadpool_size") and knobs["private_threadpool_size"]:
        lines.append(f"options.threading.private_threadpool_size = {int(knobs['private_threadpool_size'])}")
    return ["options = tf.data.Options()", *lines, "ds = ds.with_options(options)"] if lines else []


def tensorflow(knobs: dict[str, Any], doc: dict[str, Any]) -> str:
    on = lambda name: _applied(knobs, doc, name)  # noqa: E731
    out = ["import keras", "import tensorflow as tf", ""]
    early = []  # environment TensorFlow reads when it starts: before any TensorFlow operation
    if on("gpu_thread_mode") and knobs["gpu_thread_mode"] != "global":
        early.append(f"os.environ['TF_GPU_THREAD_MODE'] = {knobs['gpu_thread_mode']!r}")
    if on("xla_auto_clustering") and knobs["xla_auto_clustering"]:
        early.append("os.environ['TF_XLA_FLAGS'] = os.environ.get('TF_XLA_FLAGS', '') + ' --tf_xla_cpu_global_jit'"
                     "  # CPU ops too")
        out.append("tf.config.optimizer.set_jit(True)  # XLA auto-clustering")
    if early:
        out[:0] = ["import os", *early]
    if on("intra_op_threads") and knobs["intra_op_threads"]:
        out.append(f"tf.config.threading.set_intra_op_parallelism_threads({int(knobs['intra_op_threads'])})")
    if on("tf32"):
        out.append(f"tf.config.experimental.enable_tensor_float_32_execution({bool(knobs['tf32'])})")
    policy = knobs.get("mixed_precision", "float32") if on("mixed_precision") else "float32"
    if policy != "float32":
        out.append(f"keras.mixed_precision.set_global_policy({policy!r})  # before the model is built")
    deterministic = bool(knobs.get("deterministic", True))

    def parallel(name: str) -> str:
        value = knobs.get(name, 0) if on(name) else 0
        if not value:
            return ""
        return f", num_parallel_calls={_calls(value)}" + ("" if deterministic else ", deterministic=False")

    cycle = knobs.get("cycle_length", 1) if on("cycle_length") else 1
    out += ["", "ds = tf.data.Dataset.from_tensor_slices(files)", *_options(knobs, on),
            f"ds = ds.interleave(tf.data.TFRecordDataset, cycle_length={_calls(cycle)}, block_length=1"
            f"{parallel('interleave_parallel_calls')})",
            f"ds = ds.map(parse_fn{parallel('map_parallel_calls')})"]
    if on("cache") and knobs["cache"]:
        out.append("ds = ds.cache()  # decoded images in memory after the first epoch")
    out += [f"ds = ds.map(augment_fn{parallel('map_parallel_calls')})",
            "ds = ds.shuffle(10_000).repeat()",
            f"ds = ds.batch({int(knobs['batch_size'])}, drop_remainder=True)"]
    prefetch = knobs.get("prefetch", 0) if on("prefetch") else 0
    if prefetch:
        out.append(f"ds = ds.prefetch({_calls(prefetch)})  # always last")
    out.append("")
    k = int(knobs.get("accumulation_steps") or 1) if on("accumulation_steps") else 1
    if k > 1:
        out.append(f"optimizer.gradient_accumulation_steps = {k}  # or pass it when you build the optimizer")
    out += _learning_rate(doc, "optimizer.learning_rate = {lr}")
    jit = bool(knobs.get("jit_compile", False)) if on("jit_compile") else False
    spe = int(knobs.get("steps_per_execution") or 1) if on("steps_per_execution") else 1
    out += [f"model.compile(optimizer=optimizer, loss=loss_fn, jit_compile={jit}, steps_per_execution={spe})",
            "model.fit(ds, epochs=epochs, steps_per_epoch=steps_per_epoch)"]
    if on("loop") and knobs.get("loop") == "custom":
        out.append("# the winner was measured with a custom @tf.function training loop, not model.fit")
    return "\n".join(out) + "\n"
