"""Compare cooldown branches with separate wsd and cosine runs of the same budgets.

    critbatch-branch-check [PATHS...] [--scale SCALE] [--out DIR]

(`python analysis/branch_check.py` is the same command.) PATHS: the batch sweep's folder and
the check's (default: runs/batch/<scale> and runs/branch_check/<scale> of the scale given by
--scale, cpu by default). Writes report.md and branch_check.json to --out (default: <the
check's folder>/report/). The work is done by `branch_check.run_analysis`; this
module only parses arguments.
"""

from __future__ import annotations

import argparse

from critbatch.analysis.branch_check.branch_check import run_analysis
from critbatch.results.errors import user_errors


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="the batch sweep's and the check's folders")
    parser.add_argument("--scale", default="cpu", help="scale of the default folders")
    parser.add_argument("--out", help="report folder (default: <check folder>/report)")
    args = parser.parse_args(argv)
    paths = args.paths or [f"runs/batch/{args.scale}", f"runs/branch_check/{args.scale}"]
    with user_errors():
        run_analysis(paths, args.out)
