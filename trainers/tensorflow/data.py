"""tf.data for the built-in workloads: TFRecord shards, parsing, augmentation, the pipeline."""
from __future__ import annotations

import hashlib
import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import tensorflow as tf

from knobtune.trainers.common.augment import MAX_ROTATION_DEG, MAX_SHIFT_PX
from knobtune.trainers.common.errors import WorkloadError

SHARDS = 8
AUTOTUNE = "autotune"


def _example(feature_bytes: bytes, label: int, key: str) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={
        key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[feature_bytes])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    })).SerializeToString()


def write_shards(root: Path, records: Iterable[tuple[bytes, int]], key: str, shards: int = SHARDS) -> list[str]:
    """Write ``records`` round-robin into ``shards`` TFRecord files under ``root`` (once, atomically)."""
    names = [root / f"train-{i:05d}-of-{shards:05d}.tfrecord" for i in range(shards)]
    if all(n.exists() for n in names):
        return [str(n) for n in names]
    staging = root.with_name(f".{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    writers = [tf.io.TFRecordWriter(str(staging / n.name)) for n in names]
    for i, (payload, label) in enumerate(records):
        writers[i % shards].write(_example(payload, label, key))
    for w in writers:
        w.close()
    try:
        os.rename(staging, root)
    except OSError:  # another process finished first with identical files
        shutil.rmtree(staging, ignore_errors=True)
    return [str(n) for n in names]


def digits_shards(train_files: Sequence[Any]) -> list[str]:
    """The digits training PNGs (trainers.common.digits) as TFRecord shards of PNG bytes."""
    first = Path(train_files[0].path)
    root = first.parent.parent / f"tfrecord-{SHARDS}"
    return write_shards(root, ((Path(s.path).read_bytes(), s.label) for s in train_files), key="png")


def parse_png(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """One digits record -> (28x28x1 float32 image in [0, 1], int64 label)."""
    parsed = tf.io.parse_single_example(serialized, {
        "png": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)})
    image = tf.io.decode_png(parsed["png"], channels=1)
    image = tf.cast(image, tf.float32) / 255.0
    return tf.ensure_shape(image, (28, 28, 1)), parsed["label"]


def mnist_shards(directory: Path, images: np.ndarray, labels: np.ndarray) -> list[str]:
    """MNIST idx arrays as TFRecord shards of raw 28x28 bytes, cached by source path and size."""
    from knobtune.trainers.common.paths import cache_dir

    tag = hashlib.sha1(f"{directory.resolve()}:{images.shape}:{labels.sum()}".encode()).hexdigest()[:12]
    root = cache_dir() / f"mnist-{tag}" / f"tfrecord-{SHARDS}"
    root.parent.mkdir(parents=True, exist_ok=True)
    return write_shards(root, ((img.tobytes(), lab) for img, lab in zip(images, labels)), key="raw")


def parse_raw28(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_single_example(serialized, {
        "raw": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)})
    image = tf.reshape(tf.io.decode_raw(parsed["raw"], tf.uint8), (28, 28, 1))
    return tf.cast(image, tf.float32) / 255.0, parsed["label"]


def random_affine(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Rotate by up to +-10 degrees and shift by up to +-2 pixels (bilinear, black fill), as the
    PyTorch twin does with Pillow."""
    angle = tf.random.uniform([], -MAX_ROTATION_DEG, MAX_ROTATION_DEG) * (math.pi / 180.0)
    tx = tf.random.uniform([], -MAX_SHIFT_PX, MAX_SHIFT_PX)
    ty = tf.random.uniform([], -MAX_SHIFT_PX, MAX_SHIFT_PX)
    height, width = tf.cast(tf.shape(image)[0], tf.float32), tf.cast(tf.shape(image)[1], tf.float32)
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    cos, sin = tf.cos(angle), tf.sin(angle)
    # Output pixel (x, y) samples the input at R^-1 ((x, y) - c - t) + c.
    transform = tf.stack([cos, sin, cx - cos * (cx + tx) - sin * (cy + ty),
                          -sin, cos, cy + sin * (cx + tx) - cos * (cy + ty), 0.0, 0.0])
    out = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[tf.newaxis], transforms=transform[tf.newaxis],
        output_shape=tf.shape(image)[:2], fill_value=0.0, interpolation="BILINEAR", fill_mode="CONSTANT")
    return out[0], label


def count_records(files: Sequence[str]) -> int:
    """Records in ``files``, reading each one fully: a corrupt file is named in the error."""
    total = 0
    for name in files:
        try:
            total += sum(1 for _ in tf.data.TFRecordDataset(name))
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as exc:
            raise WorkloadError(f"TFRecord file {name} is corrupt: {exc.message.splitlines()[0]}") from None
        except tf.errors.NotFoundError:
            raise WorkloadError(f"TFRecord file {name} does not exist") from None
    return total


AUTOTUNE_PREFETCH_GUESS = 16  # batches assumed held by prefetch(AUTOTUNE), which cannot be read back


def read_ahead(knobs: dict[str, Any]) -> int:
    """Batches the pipeline can hold ready ahead of the train step: the prefetch buffer, plus
    the elements in flight in the parallel map (in batches)."""
    prefetch = knobs.get("prefetch") or 0
    batches = AUTOTUNE_PREFETCH_GUESS if prefetch == AUTOTUNE else int(prefetch)
    calls = knobs.get("map_parallel_calls") or 0
    if calls:
        per_call = 2 * (16 if calls == AUTOTUNE else int(calls))  # parallel map buffers ~2x its calls
        batches += -(-per_call // int(knobs["batch_size"]))
    return batches


def _calls(value: Any) -> int | None:
    """A parallelism knob as tf.data wants it: None (sequential), AUTOTUNE or a number."""
    if value == AUTOTUNE:
        return tf.data.AUTOTUNE
    return int(value) if value else None


def pipeline_options(knobs: dict[str, Any]) -> tf.data.Options | None:
    """The tf.data Options the knobs change from TensorFlow's defaults (None: none):
    ``map_parallelization`` (on by default) and ``private_threadpool_size`` (0: the shared pool)."""
    options, changed = tf.data.Options(), False
    if not knobs.get("map_parallelization", True):
        options.experimental_optimization.map_parallelization, changed = False, True
    threads = int(knobs.get("private_threadpool_size") or 0)
    if threads:
        options.threading.private_threadpool_size, changed = threads, True
    return options if changed else None


def options_knobs(ds: tf.data.Dataset) -> dict[str, Any]:
    """The Options knobs read back from the pipeline's merged ``options()`` (unset: TensorFlow's default)."""
    options = ds.options()
    parallelize = options.experimental_optimization.map_parallelization
    return {"map_parallelization": True if parallelize is None else bool(parallelize),
            "private_threadpool_size": int(options.threading.private_threadpool_size or 0)}


def build_pipeline(files: Sequence[str], parse_fn: Callable, augment_fn: Callable | None, knobs: dict[str, Any],
                   shuffle_buffer: int, seed: int | None, repeat: bool = True,
                   drop_remainder: bool = True) -> tf.data.Dataset:
    """list_files [with_options] -> interleave(TFRecordDataset) -> map(parse/decode) -> [cache] ->
    map(augment) -> [shuffle] -> [repeat] -> batch -> [prefetch], every knob applied (Options,
    set at the source, hold for the whole pipeline). A trial's burst repeats the data and drops
    the last partial batch (every step the same shape); production runs epochs of the data as a
    script's own pipeline would. ``shuffle_buffer`` 0: no shuffle."""
    deterministic = bool(knobs["deterministic"])

    def parallel(calls: int | None) -> dict[str, Any]:
        # ``deterministic`` only means something (and is only accepted quietly) with parallel calls
        return {"num_parallel_calls": calls, "deterministic": deterministic} if calls else {}

    ds = tf.data.Dataset.from_tensor_slices(list(files))  # the file names, in order
    options = pipeline_options(knobs)
    if options is not None:
        ds = ds.with_options(options)
    cycle = tf.data.AUTOTUNE if knobs["cycle_length"] == AUTOTUNE else int(knobs["cycle_length"])
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=cycle, block_length=1,
                       **parallel(_calls(knobs["interleave_parallel_calls"])))
    map_calls = _calls(knobs["map_parallel_calls"])
    ds = ds.map(parse_fn, **parallel(map_calls))
    if knobs["cache"]:
        ds = ds.cache()
    if augment_fn is not None:
        ds = ds.map(augment_fn, **parallel(map_calls))
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.batch(int(knobs["batch_size"]), drop_remainder=drop_remainder)
    prefetch = knobs["prefetch"]
    if prefetch:
        ds = ds.prefetch(_calls(prefetch))
    return ds


def describe_pipeline(ds: tf.data.Dataset) -> list[dict[str, Any]]:
    """The pipeline as built, last op first: each dataset op and its parallelism settings."""
    out = []
    node: Any = ds
    while node is not None:
        entry: dict[str, Any] = {"op": type(node).__name__.lstrip("_")}
        for attr in ("_batch_size", "_buffer_size", "_num_parallel_calls", "_cycle_length", "_deterministic",
                     "_drop_remainder"):
            if hasattr(node, attr):
                value = getattr(node, attr)
                value = value.numpy().item() if hasattr(value, "numpy") else value
                entry[attr.lstrip("_")] = value
        out.append(entry)
        node = getattr(node, "_input_dataset", None)
    return out


def pipeline_knobs(description: list[dict[str, Any]]) -> dict[str, Any]:
    """The pipeline knobs read back from ``describe_pipeline`` (AUTOTUNE shows as -1 there)."""
    def calls(value: Any) -> Any:
        return AUTOTUNE if value == -1 else (value or 0)

    ops = {e["op"]: e for e in description}
    parallel = [e for e in description if e.get("deterministic") in ("true", "false")]
    interleave = ops.get("ParallelInterleaveDataset") or ops.get("InterleaveDataset") or {}
    maps = [e for e in description if e["op"] in ("ParallelMapDataset", "MapDataset")]
    prefetch = ops.get("PrefetchDataset")
    return {
        "batch_size": ops.get("BatchDataset", {}).get("batch_size"),
        "cycle_length": calls(interleave.get("cycle_length")),
        "interleave_parallel_calls": calls(interleave.get("num_parallel_calls", 0)),
        "map_parallel_calls": calls(maps[-1].get("num_parallel_calls", 0)) if maps else 0,
        "prefetch": calls(prefetch["buffer_size"]) if prefetch else 0,
        "cache": "CacheDataset" in ops,
        # sequential ops keep order whatever was asked; parallel ones say what they were built with
        "deterministic": all(e["deterministic"] == "true" for e in parallel) if parallel else True,
    }
