"""`aiayn download multi30k`: fetch Multi30k task 1 from the dataset's official repository."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", choices=["multi30k"], help="the data set to fetch")
    p.add_argument("--out", required=True, help="directory for the files")
    p.add_argument("--langs", default="en,de,fr", help="comma-separated languages (default en,de,fr)")
    p.add_argument("--base-url", default=None,
                   help="fetch from this URL prefix (a mirror, or file:///path) instead")


def main(args: argparse.Namespace) -> int:
    from aiayn.errors import UserError
    from aiayn.recipes.download import MULTI30K_FILES, MULTI30K_URL, download_files

    langs = [x.strip() for x in args.langs.split(",") if x.strip()]
    files = {n: sha for n, (sha, _) in MULTI30K_FILES.items() if n.split(".")[-2] in langs}
    if not files:
        raise UserError(f"no Multi30k files for languages {args.langs!r} (have en, de, fr)")
    paths = download_files(files, args.base_url or MULTI30K_URL, args.out)
    print(f"{len(paths)} files verified in {args.out}")
    return 0
