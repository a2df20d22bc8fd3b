"""`critbatch-report` (what `make report` runs): re-run the analysis of every sweep under runs/
without training, each report where its sweep wrote it (runs/<stage>/<scale>/report).

The work is `orchestration.reports.report_all`, as `python -m critbatch.sweep report`; this
module only gives it a command of its own.
"""

from __future__ import annotations

import argparse

from critbatch.orchestration.reports import report_all
from critbatch.results.errors import user_errors


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.parse_args(argv)
    with user_errors():
        raise SystemExit(1 if report_all() else 0)


if __name__ == "__main__":
    main()
