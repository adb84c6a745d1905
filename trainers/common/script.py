"""Running a user's training script inside a trial's (or the probe's) child process.

The script runs as ``__main__`` with its own ``sys.argv``, in this process, so that its
``Tuned.load()`` finds the trial that the child activated. The API stops the script early by
raising ``ScriptDone`` (a BaseException, so a script's ``except Exception`` does not swallow it):
after the burst, once the accuracy is reported (the remaining epochs are not run), and in the
probe, at the first batch.
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping

from knobtune.trainers.common.errors import WorkloadError

# a trainer library a script may import -> the knobtune extra that installs it
EXTRAS = {"transformers": "transformers", "accelerate": "transformers", "lightning": "lightning",
          "pytorch_lightning": "lightning"}


class ScriptDone(BaseException):
    """Raised inside the user's script by the API when the trial (or the probe) has what it needs."""


def run(path: str, args: list[str]) -> None:
    """Run the script at ``path`` with ``args`` until it ends or the API stops it.

    A missing script is a WorkloadError; ``sys.exit(0)`` is a normal end; any other exception
    (and a non-zero exit) propagates, so the child crashes with the script's traceback."""
    script = Path(path)
    if not script.is_file():
        raise WorkloadError(f"script {path!r}: no such file")
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *map(str, args)]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except ScriptDone:
        pass
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        raise WorkloadError(f"the script {path} imports {exc.name!r}, which this Python does not have: "
                            f"pip install 'knobtune[{extra}]'") from None
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def leaves(batch: Any) -> Iterator[Any]:
    """The leaves of a batch (tuples, lists, dicts nested), depth first."""
    if isinstance(batch, Mapping):  # dicts, and Hugging Face's BatchEncoding (a UserDict)
        for value in batch.values():
            yield from leaves(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from leaves(value)
    else:
        yield batch


def batch_length(batch: Any, leading: Any) -> int:
    """Samples in a batch: the batch dimension of its first array leaf (``leading(leaf)`` gives
    it, or None for a leaf that is not an array). Dict batches (Hugging Face style) and nested
    ones count the same way; a batch with no array at all is refused in one line."""
    for leaf in leaves(batch):
        size = leading(leaf)
        if size is not None:
            return int(size)
    raise WorkloadError(f"cannot count the samples of a batch of type {type(batch).__name__}: expected tensors "
                        f"(alone, or in tuples, lists or dicts) with a batch dimension")
