"""The framework versions the trainers need, checked before anything else is imported.

An old framework otherwise fails in the middle of every trial (``torch.OutOfMemoryError`` is
missing before torch 2.5, so a real out-of-memory would be recorded as a crash), which a study
would report as a search of crashes instead of one clear line.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Requirement:
    module: str
    minimum: tuple[int, ...]
    why: str
    install: str

    @property
    def minimum_text(self) -> str:
        return ".".join(map(str, self.minimum))


REQUIREMENTS = {
    "pytorch": (Requirement("torch", (2, 5), "torch.OutOfMemoryError (2.5) and torch.amp.GradScaler(device) (2.3)",
                            "pip install 'torch>=2.5' (torch==2.13.0 is the tested CPU build)"),),
    "tensorflow": (Requirement("tensorflow", (2, 16), "Keras 3 (TensorFlow 2.16 and newer ship it)",
                               "pip install 'tensorflow>=2.16' (tensorflow-cpu==2.21.0 is the tested CPU build)"),
                   Requirement("keras", (3, 0), "the Keras 3 optimizer API (gradient_accumulation_steps)",
                               "pip install 'keras>=3'")),
}


def parse(version: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> (2, 13, 0); ``"2.5.0a0+git1234"`` -> (2, 5, 0)."""
    parts = []
    for piece in version.split("+")[0].split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
    return tuple(parts)


def too_old(requirement: Requirement, version: str) -> str | None:
    """The one-line error for ``version`` of the requirement's module, or None when it is new enough."""
    if parse(version) >= requirement.minimum:
        return None
    return (f"{requirement.module} {version} is too old: knobtune needs {requirement.module}>="
            f"{requirement.minimum_text} for {requirement.why}; {requirement.install}")


def check(framework: str) -> str | None:
    """Import the framework's modules and check their versions; the first problem, or None."""
    for requirement in REQUIREMENTS[framework]:
        module = importlib.import_module(requirement.module)
        problem = too_old(requirement, str(getattr(module, "__version__", "0")))
        if problem:
            return problem
    return None
