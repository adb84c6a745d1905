"""knobtune export NAME"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from knobtune.search.errors import UserError
from knobtune.search.storage.database import open_storage, resolve_url
from knobtune.search.story.export import best_config, load_existing
from knobtune.search.story.results import PICKS
from knobtune.search.story.snippet import headline_speedup, snippet


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="write a study's winner as JSON (knobtune.best/1)",
        description="Write the fastest trial that passed the accuracy guard, in the knobtune.best/1 format.",
    )
    p.add_argument("name", help="study name")
    p.add_argument("--storage", metavar="URL", help="Optuna storage URL (default: sqlite:///knobtune.db)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of standard output")
    p.add_argument("--format", choices=("json", "snippet"), default="json", dest="fmt",
                   help="json: the knobtune.best/1 document Tuned.load reads (default); snippet: the lines to "
                        "change in a training script that does not use the Tuned API")
    p.add_argument("--pick", choices=PICKS, default=None,
                   help="pareto studies: which point of the front (default fastest-feasible)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    study = load_existing(open_storage(resolve_url(args.storage)), args.name)
    document = best_config(study, args.pick)
    text = snippet(document) if args.fmt == "snippet" else json.dumps(document, indent=2) + "\n"
    if args.output:
        path = Path(args.output)
        if not path.parent.exists():
            raise UserError(f"cannot write {path}: directory {path.parent} does not exist")
        path.write_text(text)
        m = document["metrics"]
        headline = headline_speedup(document)
        speedup = f", {headline}" if headline else ""
        how = ""
        if document.get("confirmed"):
            how = (" (the baseline: no candidate beat it in the confirmation runs)"
                   if document["confirmed"].get("baseline_won") else " (the confirmed winner)")
        sys.stderr.write(f"knobtune: wrote {path}: trial #{document['trial']}{how}, "
                         f"{m['samples_per_second']:,.0f} samples/s{speedup}\n")
    else:
        sys.stdout.write(text)
    return 0
