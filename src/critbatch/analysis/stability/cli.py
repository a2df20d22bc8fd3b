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

from critbatch.analysis.render import study_command
from critbatch.analysis.stability.report import run_analysis


def main(argv: list[str] | None = None) -> None:
    study_command(argv, __doc__, run_analysis,
                  paths_help="run directories or stability sweep folders",
                  out_help="report folder (default: runs/stability/<scale>/report)")
