"""The names of the built-in workloads and of each framework's module, framework-free, so that the
engine can check a study file without importing a framework (tests/ check the workloads against
each trainer's registry, trainers/<framework>/builtin.py)."""
from __future__ import annotations

BUILTIN_WORKLOADS: dict[str, tuple[str, ...]] = {
    "pytorch": ("charlm", "digits-cnn", "digits-mlp", "digits-resnet", "mnist-mlp"),
    "tensorflow": ("charlm", "digits-cnn", "digits-mlp", "digits-resnet", "mnist-mlp"),
}

# The Python module each framework's trainer needs (checked with importlib.util.find_spec).
FRAMEWORK_MODULES: dict[str, str] = {"pytorch": "torch", "tensorflow": "tensorflow"}
