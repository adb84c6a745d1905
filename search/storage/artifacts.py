"""Per-trial artifacts (files optuna-dashboard lists and previews on the trial): the child's
full output, the request it ran, and a chart of its window rates.

They go to Optuna's file-system artifact store: beside the SQLite file by default
(``knobtune.db`` -> ``knobtune-artifacts/``), or a directory the user names (``--artifacts``).
Several machines share one directory (a network file system) or use Optuna's S3/GCS stores.
"""
from __future__ import annotations

import html
import os
import tempfile
from pathlib import Path
from typing import Any

import optuna

from knobtune.search.errors import UserError
from knobtune.search.storage.database import sqlite_file

SUFFIX = "-artifacts"


def default_dir(url: str) -> Path | None:
    """``<file>-artifacts`` beside a SQLite file; None for a server database (no obvious place)."""
    path = sqlite_file(url)
    if path is None:
        return None
    return path.with_name(path.stem + SUFFIX)


def resolve(url: str, option: str | None) -> Path | None:
    """The directory to use: ``option`` (``--artifacts``; "none" turns artifacts off), else the
    default for ``url``."""
    if option is not None:
        return None if option.lower() == "none" else Path(option)
    return default_dir(url)


def prepare(directory: Path) -> Path:
    """Create ``directory`` if needed and check that it takes files: one line if it does not."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".knobtune-write-check-"):
            pass
    except OSError as exc:
        raise UserError(f"artifact directory {directory}: not writable ({exc.strerror or exc}); name another with "
                        f"--artifacts DIR, or --artifacts none") from None
    return directory


def store(directory: Path) -> Any:
    from optuna.artifacts import FileSystemArtifactStore

    return FileSystemArtifactStore(str(directory))


def window_chart(rates: list[float], title: str) -> str:
    """A small SVG bar chart of a trial's window rates (samples/s), with their median."""
    width, height, pad, top = 360, 180, 48, 28
    if not rates:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="60"><text x="8" y="30" '
                f'font-family="sans-serif" font-size="13">{html.escape(title)}: no window measured</text></svg>')
    peak = max(rates) * 1.1 or 1.0
    inner_w, inner_h = width - pad - 10, height - top - 24
    step = inner_w / len(rates)
    ordered = sorted(rates)
    middle = ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1]
                                                                  + ordered[len(ordered) // 2]) / 2
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="8" y="16" font-size="13">{html.escape(title)}</text>']
    for i, value in enumerate(rates):
        h = inner_h * value / peak
        x, y = pad + i * step + step * 0.15, top + inner_h - h
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{step * 0.7:.1f}" height="{h:.1f}" fill="#4c78a8">'
                     f'<title>window {i + 1}: {value:,.0f} samples/s</title></rect>')
        parts.append(f'<text x="{x + step * 0.35:.1f}" y="{top + inner_h + 14}" text-anchor="middle">{i + 1}</text>')
    y = top + inner_h - inner_h * middle / peak
    parts.append(f'<line x1="{pad}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e45756" '
                 f'stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{pad - 4}" y="{y + 4:.1f}" text-anchor="end" fill="#e45756">{middle:,.0f}</text>')
    parts.append(f'<text x="{pad - 4}" y="{top + inner_h + 4}" text-anchor="end">0</text>')
    parts.append(f'<text x="{width - 10}" y="{height - 2}" text-anchor="end">window (median dashed)</text></svg>')
    return "".join(parts)


def attach(study: optuna.Study, trial: optuna.Trial, kept: Path, window_rates: list[float] | None,
           artifact_store: Any) -> int:
    """Upload a running trial's files (before it is told): ``kept`` holds the child's
    ``output.log`` and ``request.json``; the window chart is drawn from ``window_rates``. Returns how
    many were stored; a file that cannot be stored is skipped (the measurement matters more)."""
    from optuna.artifacts import upload_artifact

    files: list[tuple[Path, str]] = []
    for name, mimetype in (("output.log", "text/plain"), ("request.json", "application/json")):
        source = kept / name
        if source.exists():
            target = kept / f"trial-{trial.number}-{name}"
            os.replace(source, target)
            files.append((target, mimetype))
    chart = kept / f"trial-{trial.number}-window-rates.svg"
    chart.write_text(window_chart(list(window_rates or []),
                                  f"trial #{trial.number}: window rates (samples/s)"))
    files.append((chart, "image/svg+xml"))
    stored = 0
    for path, mimetype in files:
        try:
            upload_artifact(artifact_store=artifact_store, file_path=str(path), study_or_trial=trial,
                            mimetype=mimetype, encoding="utf-8" if mimetype.startswith("text") else None)
            stored += 1
        except Exception:  # noqa: BLE001 - a storage or store error: skip the file, keep the measurement
            continue
    return stored

