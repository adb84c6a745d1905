"""The PyTorch trainer. ``Workload`` is the contract for user workloads."""
from __future__ import annotations

from trainers.pytorch.workload import Workload, accuracy, adam

__all__ = ["Workload", "accuracy", "adam"]
