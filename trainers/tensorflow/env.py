"""TensorFlow's part of the fingerprint, and the hardware facts the knob space needs."""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from knobtune.trainers.common import hostinfo


def _gpus() -> list[dict[str, Any]]:
    out = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        out.append({"name": details.get("device_name", device.name),
                    "capability": ".".join(map(str, details.get("compute_capability", ()))) or None})
    return out


def fingerprint() -> dict[str, Any]:
    """Host facts plus TensorFlow, Keras, CUDA/cuDNN build and GPU details (child only)."""
    build = tf.sysconfig.get_build_info()
    gpus = _gpus()
    return {
        **hostinfo.host(),
        "framework": "tensorflow",
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "cuda_available": bool(gpus),
        "cuda_version": build.get("cuda_version"),
        "cudnn_version": build.get("cudnn_version"),
        "gpus": gpus,
        "hardware": hardware(gpus),
    }


def hardware(gpus: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What spaces.tensorflow decides on: device, bf16 support, usable cores."""
    gpus = _gpus() if gpus is None else gpus
    capability = float(gpus[0]["capability"]) if gpus and gpus[0].get("capability") else 0.0
    return {
        "device": "gpu" if gpus else "cpu",
        "gpu": bool(gpus),
        "cuda": bool(gpus),
        # bfloat16 on every CPU (oneDNN) and on GPUs from Ampere (8.0) on
        "bf16": (not gpus) or capability >= 8.0,
        "fp16": bool(gpus),
        "tf32": capability >= 8.0,  # TF32 tensor cores: Ampere and newer
        "usable_cores": hostinfo.usable_cores(),
        "gpu_count": len(gpus),
    }
