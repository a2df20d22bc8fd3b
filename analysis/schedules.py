#!/usr/bin/env python
"""Compare batch-size schedules (constant, ramp, adaptive) at equal tokens and write the report.

    python analysis/schedules.py [PATHS...] [--out DIR]

PATHS are run directories or folders searched recursively for summary.json (default: the
most recently written runs/schedules/<scale> folder). Writes report.md, schedules.json and
the plots to --out (default: <that folder>/report/). The work is done by
`critbatch.schedules.run_report`; this file only parses arguments.
"""

from __future__ import annotations

import argparse

from critbatch.errors import user_errors
from critbatch.schedules import run_report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="run directories or sweep folders")
    parser.add_argument("--out", help="report folder (default: <sweep dir>/report)")
    args = parser.parse_args(argv)
    with user_errors():
        run_report(args.paths, args.out)


if __name__ == "__main__":
    main()
