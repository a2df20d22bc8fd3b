"""Reproduce public batch-size and lr sweeps from their own files.

    critbatch-peers [--peers-dir DIR] [--out DIR] [--docs FILE] [--resamples N]

(`make peers PEERS_DIR=DIR OUT=DIR` is the same command; `make docs-results` also writes the
tracked page docs/results/peers.md.) Reads Step Law's dense grid and its
bootstrap fits (Li et al. 2025) from DIR, or without --peers-dir downloads them at the commit
critbatch pins into the cache (~/.cache/critbatch/peers, or $CRITBATCH_CACHE/peers) and
checks their sha256; reads Zhang et al. 2025's steps-to-target rows from the copy shipped
with critbatch. Writes peers.md, peers.json and the figures to --out (default
runs/peers) and nowhere else; with --docs FILE the same page to FILE too (its figures in a
folder beside it). The work is done by `critbatch.peers.report`.
"""

from __future__ import annotations

import argparse

from critbatch.peers.report import run
from critbatch.results.errors import user_errors
from critbatch.science.grid_laws import BOOTSTRAP


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers-dir", help="a folder holding the sources' files (default: "
                                            "download them into the cache)")
    parser.add_argument("--out", default="runs/peers", help="report folder (default runs/peers)")
    docs = parser.add_mutually_exclusive_group()
    docs.add_argument("--docs", default=None, metavar="FILE",
                      help="also write the page here (make docs-results: "
                           "docs/results/peers.md)")
    docs.add_argument("--no-docs", dest="docs", action="store_const", const=None,
                      help="write no docs page (the default; kept for older scripts)")
    parser.add_argument("--resamples", type=int, default=BOOTSTRAP,
                        help=f"cell-bootstrap resamples of each law (default {BOOTSTRAP})")
    parser.add_argument("--cache", help="download cache folder (default ~/.cache/critbatch/"
                                        "peers or $CRITBATCH_CACHE/peers)")
    args = parser.parse_args(argv)
    if args.resamples < 10:
        parser.error("--resamples must be 10 or more")
    with user_errors():
        run(args.peers_dir, args.out, args.docs, args.resamples, args.cache)


if __name__ == "__main__":
    main()
