"""Compare batch-size schedules (constant, ramp, adaptive) at equal tokens and write the report.

    critbatch-schedules [PATHS...] [--out DIR] [--wandb offline|online|disabled]

(`python analysis/schedules.py` is the same command.) PATHS are run directories or folders
searched recursively for summary.json (default: the most recently written
runs/schedules/<scale> folder). Writes report.md, schedules.json and the plots to --out
(default: <that folder>/report/). The work is done by
`critbatch.analysis.schedules.report.run_analysis`; this module only parses arguments.
"""

from __future__ import annotations

import argparse

from critbatch.analysis.render import add_wandb_arguments
from critbatch.analysis.schedules.report import run_analysis
from critbatch.results.errors import user_errors


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="run directories or sweep folders")
    parser.add_argument("--out", help="report folder (default: <sweep dir>/report)")
    add_wandb_arguments(parser)
    args = parser.parse_args(argv)
    with user_errors():
        run_analysis(args.paths, args.out, wandb_mode=args.wandb_mode,
                     project=args.project)
