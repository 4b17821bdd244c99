"""`aiayn download`: fetch a public data set from its official source, with checksums, resumably.

A download that breaks off continues where it stopped when the command is run again.
"""

from __future__ import annotations

import argparse
import sys

from aiayn.commands.common import add_no_progress_argument, set_examples
from aiayn.errors import UserError
from aiayn.recipes.download import MULTI30K_FILES, MULTI30K_URL, download_files


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn download multi30k --out data/multi30k            # Multi30k task 1 (en, de, fr)",
                 "aiayn download wmt14 --pair en-de --out data/wmt14-en-de  # the paper's WMT 2014 data",
                 about=__doc__.split("\n\n", 1)[1])
    p.add_argument("dataset", choices=["multi30k", "wmt14"], help="the data set to fetch")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the files")
    p.add_argument("--langs", default="en,de,fr",
                   help="multi30k: comma-separated languages (default en,de,fr)")
    p.add_argument("--pair", choices=["en-de", "en-fr"], default="en-de",
                   help="wmt14: the language pair (default en-de: 4.5M pairs, 1.7 GB of archives; "
                        "en-fr: 41M pairs, 6.7 GB)")
    p.add_argument("--base-url", default=None,
                   help="fetch every file from this URL prefix (a mirror, or file:///path) instead")
    add_no_progress_argument(p)


def main(args: argparse.Namespace) -> int:
    progress = not args.no_progress
    if args.dataset == "wmt14":
        from aiayn.recipes.wmt14 import download_wmt14  # loads numpy: here, so that --help answers at once

        record = download_wmt14(args.pair, args.out, args.base_url, progress=progress,
                                log=lambda msg: print(msg, file=sys.stderr, flush=True))
        for name, f in record["files"].items():
            print(f"{args.out}/{name}: {f['lines']} lines")
        return 0
    langs = [x.strip() for x in args.langs.split(",") if x.strip()]
    files = {n: sha for n, (sha, _) in MULTI30K_FILES.items() if n.split(".")[-2] in langs}
    if not files:
        raise UserError(f"no Multi30k files for languages {args.langs!r} (have en, de, fr)")
    paths = download_files(files, args.base_url or MULTI30K_URL, args.out, progress)
    print(f"{len(paths)} files verified in {args.out}")
    return 0
