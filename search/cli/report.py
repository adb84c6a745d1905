"""knobtune report NAME [NAME_B]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from knobtune.search.errors import UserError
from knobtune.search.storage.database import open_storage, resolve_url
from knobtune.search.story.export import load_existing

DEFAULT_OUTPUT = "report.html"


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", help="write a study's report: one HTML file that opens with no network",
        description="One self-contained HTML file (plotly.js inlined) with the study's summary, its charts and "
                    "every trial; with two studies of one workload, the comparison first, then each study. "
                    "Everything is read from the storage.",
    )
    p.add_argument("name", metavar="NAME", help="study name")
    p.add_argument("name_b", metavar="NAME_B", nargs="?", help="a second study of the same workload to compare with")
    p.add_argument("--storage", metavar="URL", help="Optuna storage URL (default: sqlite:///knobtune.db)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help=f"the HTML file to write (default: {DEFAULT_OUTPUT}, unless only --csv is asked for)")
    p.add_argument("--csv", metavar="FILE", help="also (or, without -o, only) write the trials table as CSV")
    p.add_argument("--force", action="store_true", help="with two studies: compare even across workloads or machines")
    p.set_defaults(func=main)


def _writable(option: str, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if not path.parent.exists():
        raise UserError(f"cannot write {option} {path}: directory {path.parent} does not exist")
    if path.is_dir():
        raise UserError(f"cannot write {option} {path}: it is a directory; expected a file name")
    return path


def main(args: argparse.Namespace) -> int:
    from knobtune.search.story import htmlreport

    output = _writable("-o", args.output or (None if args.csv else DEFAULT_OUTPUT))
    csv = _writable("--csv", args.csv)
    if args.force and not args.name_b:
        raise UserError("--force applies to a comparison (knobtune report A B); got one study")
    url = resolve_url(args.storage)
    storage = open_storage(url)
    studies = [load_existing(storage, name) for name in filter(None, (args.name, args.name_b))]
    if output is not None:
        text = (htmlreport.comparison_report(*studies, url, force=args.force) if len(studies) == 2
                else htmlreport.study_report(studies[0], url))
        output.write_text(text, encoding="utf-8")
        sys.stderr.write(f"knobtune: wrote {output} ({len(text.encode()) / 1e6:.1f} MB; it opens in a browser "
                         f"with no network)\n")
    if csv is not None:
        for study in studies:
            htmlreport.check_finished(study)
        frame = htmlreport.comparison_frame(*studies) if len(studies) == 2 else htmlreport.trials_frame(studies[0])
        frame.to_csv(csv, index=False)
        sys.stderr.write(f"knobtune: wrote {csv} ({len(frame)} trials, {len(frame.columns)} columns)\n")
    return 0
