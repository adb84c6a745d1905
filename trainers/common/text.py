"""The charlm corpus: the Python standard library's own source files, cut into fixed windows.

Every Python installation ships its standard library as source, so this is real text that needs
no download. The top-level ``*.py`` files of ``sysconfig``'s stdlib directory are read in name
order; every tenth file (from the sixth on) is held out, so the held-out split is a fixed set of
*other* files, never a slice of a training file. Characters are bytes below 128 (ASCII, whose
NUL never occurs in source); any other byte is token 0. The text is cut into non-overlapping
windows of ``context + 1`` tokens (inputs are the first ``context``, targets the last
``context``): one window is one sample. The arrays are written once per corpus and context under
the data cache, and are identical for both frameworks.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from knobtune.trainers.common.errors import WorkloadError
from knobtune.trainers.common.factory import require_ints
from knobtune.trainers.common.paths import cache_dir

VERSION = "charlm-v1"
VOCAB = 128
HELD_OUT_EVERY, HELD_OUT_FIRST = 10, 5


@dataclass(frozen=True)
class Corpus:
    """Windows of ``context + 1`` uint8 tokens: ``train`` (N, context + 1) and ``val``."""

    root: Path
    train: np.ndarray
    val: np.ndarray
    train_files: list[str]
    val_files: list[str]


def source_files(directory: Path | None = None) -> tuple[list[Path], list[Path]]:
    """The training and held-out files of ``directory`` (default: this Python's stdlib)."""
    directory = directory or Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in directory.glob("*.py") if p.is_file())
    if len(files) < HELD_OUT_EVERY:
        raise WorkloadError(f"charlm needs the standard library's source files; {directory} has {len(files)} "
                            f"*.py files, expected at least {HELD_OUT_EVERY}")
    val = [p for i, p in enumerate(files) if i % HELD_OUT_EVERY == HELD_OUT_FIRST]
    return [p for p in files if p not in val], val


def encode(text: bytes) -> np.ndarray:
    """Bytes as tokens: ASCII as itself, any other byte as 0."""
    tokens = np.frombuffer(text, dtype=np.uint8).copy()
    tokens[tokens >= VOCAB] = 0
    return tokens


def windows(files: list[Path], context: int, limit: int) -> np.ndarray:
    """The files' text, joined by newlines, as non-overlapping windows of ``context + 1`` tokens,
    at most ``limit`` characters of it."""
    text = b"\n".join(p.read_bytes() for p in files)[:limit]
    count = len(text) // (context + 1)
    return encode(text[:count * (context + 1)]).reshape(count, context + 1)


def _spread(rows: np.ndarray, count: int) -> np.ndarray:
    """``count`` rows spread evenly over ``rows`` (every held-out file contributes)."""
    if count >= len(rows):
        return rows
    return rows[np.linspace(0, len(rows) - 1, count).round().astype(int)]


def prepare(context: int, train_chars: int, eval_windows: int, directory: Path | None = None) -> Corpus:
    """The corpus for ``context``, written under the data cache once (safe under concurrency)."""
    require_ints("charlm", 1, context=context, eval_windows=eval_windows)
    require_ints("charlm", 1000, train_chars=train_chars)
    train_files, val_files = source_files(directory)
    key = json.dumps([VERSION, sys.version_info[:2], context, train_chars, eval_windows,
                      [(p.name, p.stat().st_size) for p in train_files + val_files]])
    root = cache_dir() / f"{VERSION}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    if not (root / "index.json").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = root.with_name(f".{root.name}.tmp-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        val = _spread(windows(val_files, context, sys.maxsize), eval_windows)
        np.save(staging / "train.npy", windows(train_files, context, train_chars))
        np.save(staging / "val.npy", val)
        (staging / "index.json").write_text(json.dumps({"train": [p.name for p in train_files],
                                                        "val": [p.name for p in val_files]}))
        try:
            os.rename(staging, root)
        except OSError:  # another process finished first; its files are identical
            shutil.rmtree(staging, ignore_errors=True)
    index = json.loads((root / "index.json").read_text())
    return Corpus(root=root, train=np.load(root / "train.npy"), val=np.load(root / "val.npy"),
                  train_files=index["train"], val_files=index["val"])
