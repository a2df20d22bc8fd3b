"""Analyse the small-batch stability study and write its report (science.md section 6).

    critbatch-stability [PATHS...] [--out DIR] [--wandb offline|online|disabled]

(`python analysis/stability.py` is the same command.) PATHS are run directories or folders
searched recursively for summary.json (default: the stability stages of the most recently
written scale: runs/stability_lr/<scale>, runs/stability/<scale>, runs/stability_accum/<scale>,
whichever exist). Writes report.md, stability.json and the plots to --out (default:
runs/stability/<scale>/report). The work is done by
`critbatch.analysis.stability.report.run_analysis`; this module only parses arguments.
"""

from __future__ import annotations

import argparse

from critbatch.analysis.render import add_wandb_arguments
from critbatch.analysis.stability.report import run_analysis
from critbatch.results.errors import user_errors


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="run directories or stability sweep folders")
    parser.add_argument("--out", help="report folder (default: runs/stability/<scale>/report)")
    add_wandb_arguments(parser)
    args = parser.parse_args(argv)
    with user_errors():
        run_analysis(args.paths, args.out, wandb_mode=args.wandb_mode,
                     project=args.project)
