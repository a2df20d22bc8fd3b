#!/usr/bin/env python
"""Compare cooldown branches with separate wsd and cosine runs.

`critbatch-branch-check` is the same command; its options: --help, or the docstring of
`critbatch.analysis.branch_check.cli`, where the code is.
"""

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # why: analysis.render.one_blas_thread

try:
    from critbatch.analysis.branch_check.cli import main
except ModuleNotFoundError as err:  # a python without critbatch: one line, not a traceback
    sys.exit(f"critbatch: error: {err} in {sys.executable}; run .venv/bin/python "
             "analysis/branch_check.py (`make install` creates .venv), or make report")

if __name__ == "__main__":
    main()
