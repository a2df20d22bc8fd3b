#!/usr/bin/env python
"""Compare cooldown branches with separate wsd and cosine runs.

`critbatch-branch-check` is the same command; its options: --help, or the docstring of
`critbatch.analysis.branch_check.cli`, where the code is.
"""

import os
import sys

# the analysis runs BLAS on one thread (critbatch.analysis.render.one_blas_thread); told
# before they load, numpy's and scipy's OpenBLAS start one thread instead of one per core
# that would only wait (on 2 cores 0.06 s of the command's start; more cores, more threads)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

try:
    from critbatch.analysis.branch_check.cli import main
except ModuleNotFoundError as err:  # a python without critbatch: one line, not a traceback
    sys.exit(f"critbatch: error: {err} in {sys.executable}; run .venv/bin/python "
             "analysis/branch_check.py (`make install` creates .venv), or make report")

if __name__ == "__main__":
    main()
