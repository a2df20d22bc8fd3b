#!/usr/bin/env python
"""Fit the critical batch size from finished runs and write the report.

`critbatch-fit` is the same command; its options: --help, or the docstring of
`critbatch.analysis.bcrit.cli`, where the code is.
"""

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # why: analysis.render.one_blas_thread

try:
    from critbatch.analysis.bcrit.cli import main
except ModuleNotFoundError as err:  # a python without critbatch: one line, not a traceback
    sys.exit(f"critbatch: error: {err} in {sys.executable}; run .venv/bin/python "
             "analysis/fit_bcrit.py (`make install` creates .venv), or make report")

if __name__ == "__main__":
    main()
