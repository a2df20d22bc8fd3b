"""Compare batch-size schedules (constant, ramp, adaptive) at equal tokens and write the report.

    critbatch-schedules [PATHS...] [--out DIR] [--wandb offline|online|disabled]

(`python analysis/schedules.py` is the same command.) PATHS are run directories or folders
searched recursively for summary.json (default: the most recently written
runs/schedules/<scale> folder). Writes report.md, schedules.json and the plots to --out
(default: <that folder>/report/). The work is done by
`critbatch.analysis.schedules.report.run_analysis`; this module only parses arguments.
"""

from __future__ import annotations

from critbatch.analysis.render import study_command
from critbatch.analysis.schedules.report import run_analysis


def main(argv: list[str] | None = None) -> None:
    study_command(argv, __doc__, run_analysis, paths_help="run directories or sweep folders",
                  out_help="report folder (default: <sweep dir>/report)")
