#!/usr/bin/env python
"""Compare batch-size schedules at equal tokens and write the report.

`critbatch-schedules` is the same command; its options: --help, or the docstring of
`critbatch.analysis.schedules.cli`, where the code is.
"""

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # why: analysis.render.one_blas_thread

try:
    from critbatch.analysis.schedules.cli import main
except ModuleNotFoundError as err:  # a python without critbatch: one line, not a traceback
    sys.exit(f"critbatch: error: {err} in {sys.executable}; run .venv/bin/python "
             "analysis/schedules.py (`make install` creates .venv), or make report")

if __name__ == "__main__":
    main()
