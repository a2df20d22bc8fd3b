#!/usr/bin/env python
"""The batch size and learning rate for a larger run, predicted from your own sweep.

`critbatch-recommend` is the same command; its options: --help, or the docstring of
`critbatch.analysis.recommend.cli`, where the code is.
"""

import os
import sys

# the analysis runs BLAS on one thread (critbatch.analysis.render.one_blas_thread); told
# before they load, numpy's and scipy's OpenBLAS start one thread instead of one per core
# that would only wait (on 2 cores 0.06 s of the command's start; more cores, more threads)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

try:
    from critbatch.analysis.recommend.cli import main
except ModuleNotFoundError as err:  # a python without critbatch: one line, not a traceback
    sys.exit(f"critbatch: error: {err} in {sys.executable}; run .venv/bin/python "
             "analysis/recommend.py (`make install` creates .venv), or make recommend")

if __name__ == "__main__":
    main()
