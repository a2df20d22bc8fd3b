#!/usr/bin/env python
"""Analyse the small-batch stability study and write its report.

`critbatch-stability` is the same command; its options: --help, or the docstring of
`critbatch.analysis.stability.cli`, where the code is.
"""

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # why: analysis.render.one_blas_thread

try:
    from critbatch.analysis.stability.cli import main
except ModuleNotFoundError as err:  # a python without critbatch: one line, not a traceback
    sys.exit(f"critbatch: error: {err} in {sys.executable}; run .venv/bin/python "
             "analysis/stability.py (`make install` creates .venv), or make report")

if __name__ == "__main__":
    main()
