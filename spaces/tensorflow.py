"""TensorFlow's knobs (the seeds' tf.data and tf.function advice, made searchable): each one's
choices, gating, how the child applies it and reads it back, and its lines in the export snippet.

Parallelism knobs take a number or "autotune" (tf.data.AUTOTUNE); 0 means sequential
(``num_parallel_calls`` unset) and, for ``prefetch``, no prefetch at all.
"""
from __future__ import annotations

from typing import Any, Mapping

from knobtune.spaces.knobs import (
    Context,
    Knob,
    Lines,
    Shown,
    Space,
    accumulation_knob,
    batch_size_knob,
    core_counts,
    fits_cores,
    hardware,
    one_of,
    positive,
    threads_knob,
)

AUTOTUNE = "autotune"
_hw = hardware


def _count(value: Any) -> bool:
    """A whole number of calls, files or threads (not a bool, not "autotune")."""
    return isinstance(value, int) and not isinstance(value, bool)


def _parallelism(value: Any) -> str | None:
    if value == AUTOTUNE or (_count(value) and value >= 0):
        return None
    return f"expected 0 (sequential), a number of parallel calls or {AUTOTUNE!r}, got {value!r}"


def _cycle(value: Any) -> str | None:
    if value == AUTOTUNE or (_count(value) and value >= 1):
        return None
    return f"expected a number of files >= 1 or {AUTOTUNE!r}, got {value!r}"


def _parallel_choices(ctx: Context) -> list[Any]:
    return core_counts(ctx) + [AUTOTUNE]


def _precision_choices(ctx: Context) -> list[str]:
    hw = _hw(ctx)
    return ["float32"] + (["mixed_bfloat16"] if hw.get("bf16") else []) + (["mixed_float16"] if hw.get("gpu") else [])


def _precision_value(value: Any, ctx: Context) -> str | None:
    if value == "mixed_float16" and not _hw(ctx).get("gpu"):
        return "mixed_float16 (with loss scaling) needs a GPU"
    if value == "mixed_bfloat16" and not _hw(ctx).get("bf16"):
        return "this device does not support bfloat16"
    return None


def _no_tf32(ctx: Context) -> str | None:
    if not _hw(ctx).get("gpu"):
        return "TF32 is a GPU tensor-core format; this machine has no GPU"
    return None if _hw(ctx).get("tf32") else "this GPU has no TF32 tensor cores (before Ampere)"


def _mixed(values: Any) -> str | None:
    policy = values.get("mixed_precision", "float32")
    return None if policy == "float32" else f"mixed_precision={policy} computes in 16 bits: fp32 precision does not apply"


def _no_gpu(ctx: Context) -> str | None:
    return None if _hw(ctx).get("gpu") else "sets how TensorFlow launches GPU kernels; this machine has no GPU"


def _whole_step_compiled(values: Any) -> str | None:
    if values.get("jit_compile"):
        return "jit_compile=True compiles the whole train step with XLA: auto-clustering has nothing left to cluster"
    return None


def _maps_parallel(values: Any) -> str | None:
    calls = values.get("map_parallel_calls", 0)
    return None if not calls else (f"map_parallel_calls={calls!r} already runs the maps in parallel: "
                                   f"map_parallelization only rewrites sequential maps")


def _nothing_parallel(values: Any) -> str | None:
    if any(values.get(k, 0) for k in ("interleave_parallel_calls", "map_parallel_calls", "prefetch")):
        return None
    if values.get("map_parallelization", True):
        return None  # the sequential stateless maps run on the pool
    return "no tf.data op runs in parallel or ahead (no parallel calls, no prefetch): no thread pool to size"


def _executions_value(value: Any, ctx: Context) -> str | None:
    """A script's own step (kt.step) runs several steps per call only when its loop hands each batch
    to the step untouched; the probe's dry run of the loop says when it does not. Under
    MirroredStrategy, only with an all-reduce that runs them."""
    why = (ctx.get("workload") or {}).get("step_uses_batch")
    if why and int(value) > 1:
        return why
    multi = _group(ctx).get("multi_step_ops")
    if multi and int(value) > 1 and all(multi.values()):
        return f"no all-reduce of MirroredStrategy here runs several steps per call ({next(iter(multi.values()))})"
    return None


def _group(ctx: Context) -> Mapping[str, Any]:
    """The probe's word on a data-parallel study (``[study] nproc`` > 1): MirroredStrategy's
    devices, the all-reduces that run here, and why XLA or accumulation cannot; empty for one replica."""
    return (ctx.get("workload") or {}).get("distributed") or {}


def _no_group(ctx: Context) -> str | None:
    return None if _group(ctx) else "a one-replica trial has no MirroredStrategy ([study] nproc = 1)"


# cross_device_ops -> its tf.distribute class (None: MirroredStrategy's own choice, its CollectiveAllReduce: NCCL
# between physical GPUs, a ring elsewhere); the child makes and reads back the strategy with these
CROSS_DEVICE_OPS: dict[str, str | None] = {"collective": None, "reduction_to_one_device": "ReductionToOneDevice",
                                           "hierarchical_copy": "HierarchicalCopyAllReduce", "nccl": "NcclAllReduce"}


def _ops(ctx: Context) -> list[str]:
    return list(_group(ctx).get("cross_device_ops") or ["collective"])


def _ops_value(value: Any, ctx: Context) -> str | None:
    if value in _ops(ctx):
        return None
    why = (_group(ctx).get("refused_ops") or {}).get(value)
    return f"MirroredStrategy's {value} all-reduce does not run here" + (f": {why}" if why else "")


def _ops_problem(value: Any, knobs: Mapping[str, Any], hw: Mapping[str, Any]) -> str | None:
    if value == "nccl" and not hw.get("gpu"):
        return f"cross_device_ops={value!r} all-reduces between GPUs; this process has none"
    return None


def _refused_in_group(ctx: Context, what: str, key: str) -> str | None:
    """Why MirroredStrategy cannot train with ``what`` here, as the probe found (``key``: its reason)."""
    why = _group(ctx).get(key)
    return f"{what} under MirroredStrategy fails here: {why}" if why else None


def _jit_value(value: Any, ctx: Context) -> str | None:
    return _refused_in_group(ctx, "XLA (jit_compile=True)", "jit_compile") if value is True else None


def _accumulation_value(value: Any, ctx: Context) -> str | None:
    return _refused_in_group(ctx, "Keras' gradient accumulation", "accumulation") if int(value) > 1 else None


def _loop_value(value: Any, ctx: Context) -> str | None:
    if value == "custom" and _group(ctx):
        return "knobtune's own @tf.function loop trains one replica; MirroredStrategy trains through model.fit"
    return None


def invalid(values: Mapping[str, Any], ctx: Context) -> str | None:
    """Why a combination cannot train here: more parallel interleave calls than a fixed cycle
    length (tf.data refuses the pipeline), or several steps per call with an all-reduce the probe
    found cannot run them (MirroredStrategy's collective on logical CPU devices)."""
    calls, cycle = values.get("interleave_parallel_calls"), values.get("cycle_length", 1)
    if _count(calls) and _count(cycle) and calls > cycle:
        return (f"interleave_parallel_calls={calls} with cycle_length={cycle}: tf.data's interleave takes at most "
                f"cycle_length parallel calls when the cycle length is fixed (or {AUTOTUNE!r} for either)")
    steps = int(values.get("steps_per_execution") or 1)
    ops = values.get("cross_device_ops", "collective")
    why = (_group(ctx).get("multi_step_ops") or {}).get(ops) if steps > 1 else None
    return (f"steps_per_execution={steps} with cross_device_ops={ops!r}: MirroredStrategy fails here ({why})"
            if why else None)


def _non_negative(value: Any) -> str | None:
    return None if value >= 0 else f"must be >= 0 (0 = TensorFlow's shared pool), got {value}"


# Environment variables a knob's snippet lines set (its child side: trainers/tensorflow/knobs.py).
THREAD_MODE_ENV = "TF_GPU_THREAD_MODE"
XLA_FLAGS_ENV = "TF_XLA_FLAGS"
CPU_AUTO_JIT = "--tf_xla_cpu_global_jit"  # auto-clustering clusters CPU ops only with this flag


def _code(*lines: str) -> Lines:
    return Lines(code=lines)


def calls(value: Any) -> str:
    """A parallelism knob's value in the snippet's source."""
    return "tf.data.AUTOTUNE" if value == AUTOTUNE else str(int(value))


def _xla_lines(value: Any) -> Lines:
    if not value:
        return Lines()
    return Lines(env=(f"os.environ['{XLA_FLAGS_ENV}'] = os.environ.get('{XLA_FLAGS_ENV}', '') + ' {CPU_AUTO_JIT}'"
                      f"  # CPU ops too",),
                 code=("tf.config.optimizer.set_jit(True)  # XLA auto-clustering",))


def _pipeline_knob(name: str, kind: type, default: Any, help: str, **search: Any) -> Knob:
    return Knob(name, kind, default, help, applied_by="dataset", **search)



# Why this process's device cannot apply a value (in the child and in production): ``hw`` is
# trainers/tensorflow/env.hardware().

def _precision_problem(value: Any, knobs: Mapping[str, Any], hw: Mapping[str, Any]) -> str | None:
    if value == "mixed_float16" and not hw.get("gpu"):
        return "mixed_precision='mixed_float16' (with loss scaling) needs a GPU; this process has none"
    if value == "mixed_bfloat16" and not hw.get("bf16"):
        return "mixed_precision='mixed_bfloat16' is not supported by this GPU (before Ampere)"
    return None


def _thread_mode_problem(value: Any, knobs: Mapping[str, Any], hw: Mapping[str, Any]) -> str | None:
    if value != "global" and not hw.get("gpu"):
        return f"gpu_thread_mode={value!r} sets the GPU's launch threads; this process has no GPU"
    return None

KNOBS = (
    batch_size_knob(applied_by="dataset"),
    accumulation_knob("Keras 3 optimizer gradient_accumulation_steps", applied_by="compile",
                      value_unavailable=_accumulation_value,
                      lines=lambda v: _code(f"optimizer.gradient_accumulation_steps = {int(v)}  # or pass it when "
                                            f"you build the optimizer") if int(v or 1) > 1 else Lines()),
    _pipeline_knob("cycle_length", object, 1, "TFRecord files read at once by interleave (or 'autotune')",
                   choices=lambda ctx: [1, 2, 4, 8, AUTOTUNE], check=_cycle),
    _pipeline_knob("interleave_parallel_calls", object, 0, "interleave num_parallel_calls (0 = sequential)",
                   choices=_parallel_choices, check=_parallelism),
    _pipeline_knob("map_parallel_calls", object, 0, "decode/augment map num_parallel_calls (0 = sequential)",
                   choices=_parallel_choices, check=_parallelism),
    _pipeline_knob("prefetch", object, 0, "prefetch buffer after batching, always last (0 = none)",
                   choices=lambda ctx: [0, 1, 2, 4, AUTOTUNE], check=_parallelism,
                   lines=lambda v: _code(f"ds = ds.prefetch({calls(v)})  # always last") if v else Lines()),
    _pipeline_knob("deterministic", bool, True, "keep element order under parallelism",
                   choices=lambda ctx: [True, False]),
    _pipeline_knob("cache", bool, False,
                   "cache decoded images in memory after the first epoch (augmentation stays per epoch)",
                   choices=lambda ctx: [False, True],
                   lines=lambda v: _code("ds = ds.cache()  # decoded images in memory after the first epoch")
                   if v else Lines()),
    Knob("jit_compile", bool, False, "XLA compilation of the train step (Keras' 'auto': on with a GPU)",
         choices=lambda ctx: [False, True], default_in=lambda ctx: bool(_hw(ctx).get("gpu")),
         value_unavailable=_jit_value, applied_by="compile"),
    Knob("mixed_precision", str, "float32", "Keras dtype policy; mixed_float16 adds a LossScaleOptimizer",
         choices=_precision_choices, value_unavailable=_precision_value,
         check=one_of("float32", "mixed_bfloat16", "mixed_float16"),
         problem=_precision_problem,
         lines=lambda v: _code(f"keras.mixed_precision.set_global_policy({v!r})  # before the model is built")
         if v != "float32" else Lines()),
    Knob("steps_per_execution", int, 1, "train steps per host call",
         choices=lambda ctx: [1, 2, 4, 8, 16], check=positive, value_unavailable=_executions_value,
         applied_by="compile"),
    Knob("loop", str, "fit", "Keras model.fit, or a custom loop under @tf.function",
         choices=lambda ctx: ["fit", "custom"], check=one_of("fit", "custom"), value_unavailable=_loop_value,
         applied_by="fit",
         lines=lambda v: _code("# the winner was measured with a custom @tf.function training loop, not model.fit")
         if v == "custom" else Lines()),
    threads_knob("tf.config.threading intra-op threads", "TensorFlow",
                 lines=lambda v: _code(f"tf.config.threading.set_intra_op_parallelism_threads({int(v)})")
                 if v else Lines()),
    Knob("tf32", bool, True, "TF32 tensor cores for fp32 matmuls and convolutions (TensorFlow's default on Ampere+)",
         choices=lambda ctx: [True, False], unavailable=_no_tf32, inactive=_mixed,
         lines=lambda v: _code(f"tf.config.experimental.enable_tensor_float_32_execution({bool(v)})")),
    Knob("xla_auto_clustering", bool, False,
         "tf.config.optimizer.set_jit: XLA compiles clusters of the graphs jit_compile leaves alone",
         choices=lambda ctx: [False, True], inactive=_whole_step_compiled, lines=_xla_lines),
    Knob("gpu_thread_mode", str, "global",
         "TF_GPU_THREAD_MODE: gpu_private gives the GPU its own kernel-launch threads",
         choices=lambda ctx: ["global", "gpu_private"], unavailable=_no_gpu,
         check=one_of("global", "gpu_private", "gpu_shared"),
         problem=_thread_mode_problem,
         lines=lambda v: Lines(env=(f"os.environ['{THREAD_MODE_ENV}'] = {v!r}",)) if v != "global" else Lines()),
    _pipeline_knob("map_parallelization", bool, True,
                   "tf.data Options: run stateless sequential maps in parallel (default on)",
                   choices=lambda ctx: [True, False], inactive=_maps_parallel,
                   lines=lambda v: _code("options.experimental_optimization.map_parallelization = False")
                   if v is False else Lines()),
    _pipeline_knob("private_threadpool_size", int, 0,
                   "tf.data Options: the pipeline's own thread pool (0 = the shared pool)",
                   choices=core_counts, value_unavailable=fits_cores("threads"), check=_non_negative,
                   inactive=_nothing_parallel,
                   lines=lambda v: _code(f"options.threading.private_threadpool_size = {int(v)}") if v else Lines()),
    # Data-parallel trials ([study] nproc > 1): MirroredStrategy's all-reduce (Tuned starts the strategy).
    Knob("cross_device_ops", str, "collective",
         "MirroredStrategy's all-reduce of the replicas' gradients: collective (its own: NCCL on GPUs, a ring "
         "elsewhere), reduction_to_one_device, hierarchical_copy or nccl",
         choices=_ops, unavailable=_no_group, value_unavailable=_ops_value, check=one_of(*CROSS_DEVICE_OPS),
         problem=_ops_problem),
)

def _strategy_line(shown: Shown) -> list[str]:
    """A data-parallel winner's MirroredStrategy, with its all-reduce (none for one replica)."""
    if shown.nproc <= 1:
        return []
    ops = shown.value("cross_device_ops", "collective")
    argument = f"cross_device_ops=tf.distribute.{CROSS_DEVICE_OPS[ops]}()" if CROSS_DEVICE_OPS.get(ops) else ""
    return [f"strategy = tf.distribute.MirroredStrategy({argument})  # measured as {shown.nproc} replicas, one per "
            f"GPU", "global_batch = batch_size * strategy.num_replicas_in_sync  # batch_size: per replica"]


def _pipeline(shown: Shown) -> tuple[Lines, list[str]]:
    """The process settings (env, code) and the tf.data pipeline with the shown knobs' lines in
    their places (the parallelism knobs and deterministic shape the pipeline's calls), up to the
    optimizer's lines."""
    setup = shown.lines("gpu_thread_mode", "xla_auto_clustering", "intra_op_threads", "tf32", "mixed_precision")
    out = ["import keras", "import tensorflow as tf", "", *setup.code]
    deterministic = bool(shown.knobs.get("deterministic", True))

    def parallel(name: str) -> str:
        value = shown.value(name, 0)
        if not value:
            return ""
        return f", num_parallel_calls={calls(value)}" + ("" if deterministic else ", deterministic=False")

    options = shown.lines("map_parallelization", "private_threadpool_size").code
    out += ["", "ds = tf.data.Dataset.from_tensor_slices(files)",
            *(["options = tf.data.Options()", *options, "ds = ds.with_options(options)"] if options else []),
            f"ds = ds.interleave(tf.data.TFRecordDataset, cycle_length={calls(shown.value('cycle_length', 1))}, "
            f"block_length=1{parallel('interleave_parallel_calls')})",
            f"ds = ds.map(parse_fn{parallel('map_parallel_calls')})", *shown.lines("cache").code,
            f"ds = ds.map(augment_fn{parallel('map_parallel_calls')})",
            "ds = ds.shuffle(10_000).repeat()",
            *([f"batch_size = {int(shown.knobs['batch_size'])}", *_strategy_line(shown),
               "ds = ds.batch(global_batch, drop_remainder=True)"] if shown.nproc > 1 else
              [f"ds = ds.batch({int(shown.knobs['batch_size'])}, drop_remainder=True)"]),
            *shown.lines("prefetch").code,
            "", *shown.lines("accumulation_steps").code, *shown.learning_rate("optimizer.learning_rate = {lr}")]
    return setup, out


def script(shown: Shown) -> str:
    """The export snippet: a tf.data pipeline and model.fit with the shown knobs' lines in their
    places."""
    setup, out = _pipeline(shown)
    jit = bool(shown.value("jit_compile", False))
    spe = int(shown.value("steps_per_execution", 1) or 1)
    compile_line = f"model.compile(optimizer=optimizer, loss=loss_fn, jit_compile={jit}, steps_per_execution={spe})"
    if shown.nproc > 1:  # the model, its optimizer and compile under the strategy's scope
        out += ["with strategy.scope():", "    model = build_model()", f"    {compile_line}"]
    else:
        out += [compile_line]
    out += ["model.fit(ds, epochs=epochs, steps_per_epoch=steps_per_epoch)", *shown.lines("loop").code]
    return shown.source(setup.env, out)


STEP = "kt.step"  # the integration of a script's own train step (applied["integration"])


def step_script(shown: Shown) -> str:
    """The export snippet of a script's own train step (``kt.step``): the same pipeline, the
    optimizer under mixed_float16's loss scaling, the step's ``tf.function`` with the winner's
    XLA setting, and with steps_per_execution N > 1 N steps pulled inside one call."""
    setup, out = _pipeline(shown)
    jit = bool(shown.value("jit_compile", False))
    spe = int(shown.value("steps_per_execution", 1) or 1)
    if shown.knobs.get("mixed_precision") == "mixed_float16":
        out += ["optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # scale: optimizer.scale_loss(loss)"]
    out += ["", f"@tf.function(jit_compile={jit})"]
    if spe > 1:
        out += ["def train_steps(iterator):  # your step's body, once per batch",
                f"    for _ in tf.range({spe}):  # steps_per_execution: {spe} steps in one call",
                "        inputs, labels = next(iterator)",
                "        loss = step_body(inputs, labels)",
                "    return loss", "",
                "iterator = iter(ds)",
                f"for _ in range(steps_per_epoch // {spe}):",
                "    loss = train_steps(iterator)"]
    else:
        out += ["def train_step(inputs, labels): ...  # your step, unchanged", "",
                "for inputs, labels in ds.take(steps_per_epoch):",
                "    loss = train_step(inputs, labels)"]
    return shown.source(setup.env, out)


def advice(ctx: Context) -> dict[str, Any]:
    """What the seeds tell a TensorFlow user to do by hand (shared/seeds/004_*)."""
    return {
        "cycle_length": 4,                      # "interleave(..., cycle_length=4, num_parallel_calls=AUTOTUNE)"
        "interleave_parallel_calls": AUTOTUNE,
        "map_parallel_calls": AUTOTUNE,         # "map(parse_function, num_parallel_calls=AUTOTUNE)"
        "prefetch": AUTOTUNE,                   # "prefetch last, with AUTOTUNE"
        "loop": "custom",                       # "@tf.function on the training step"
    }


def input_variants(ctx: Context) -> dict[str, dict[str, Any]]:
    return {"all AUTOTUNE": {"cycle_length": AUTOTUNE, "interleave_parallel_calls": AUTOTUNE,
                             "map_parallel_calls": AUTOTUNE, "prefetch": AUTOTUNE}}


SPACE = Space("tensorflow", KNOBS, advice=advice, input_variants=input_variants, invalid=invalid, script=script,
              integrations={STEP: step_script},
              learning_knobs=("batch_size", "accumulation_steps", "mixed_precision", "tf32"))
