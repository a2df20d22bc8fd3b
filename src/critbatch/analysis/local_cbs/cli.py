"""Report the local critical batch size of branched training (Merrill et al. 2025).

    critbatch-local-cbs [RUN_DIRS...] [--out DIR] [--tolerance 0.01]
                        [--confidence 0.95] [--batch-sweep runs/batch/<scale>]

(`python analysis/local_cbs.py` is the same command.) RUN_DIRS are base run folders (each with
local_cbs/tokens=<t>/k=<k>/ branch folders) or folders above them (default: the most recently
written runs/local_cbs/<scale>). Per optimizer and checkpoint: the local B_crit as a one-sided
confidence-bound decision (tolerance in nats/token, one-sided confidence), the paper's EMA rule
beside it, Kaplan's B_crit(L) over the local points and what the branches cost. --batch-sweep
draws the batch sweep's per-run and Pareto B_crit (its report/fits.json) on the same loss axis.
Writes report.md, fits.json and plots to --out (default: <last RUN_DIR>/report/) and logs them
to W&B (offline by default). The work is done by `local_cbs.py` beside it; this module only
parses arguments.
"""

from __future__ import annotations

import argparse

from critbatch.analysis.local_cbs.report import run_analysis
from critbatch.analysis.render import add_wandb_arguments
from critbatch.results.errors import user_errors
from critbatch.science.local_cbs import CONFIDENCE, TOLERANCE


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="base run folders or folders above them")
    parser.add_argument("--out", help="report folder (default: <last RUN_DIR>/report)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help=f"largest excess loss still 'the same', nats/token "
                             f"(default {TOLERANCE})")
    parser.add_argument("--confidence", type=float, default=CONFIDENCE,
                        help=f"one-sided level of the upper bound (default {CONFIDENCE})")
    parser.add_argument("--batch-sweep", metavar="DIR",
                        help="batch sweep folder (or its report/fits.json) to compare with")
    add_wandb_arguments(parser)
    args = parser.parse_args(argv)
    with user_errors():
        run_analysis(args.paths, args.out, args.tolerance, args.confidence, args.batch_sweep,
                     args.wandb_mode, args.project)
