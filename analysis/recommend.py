#!/usr/bin/env python
"""The batch size and learning rate for a larger run, predicted from your own sweep.

`critbatch-recommend` is the same command; its options: --help, or the docstring of
`critbatch.analysis.recommend.cli`, where the code is.
"""

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # why: analysis.render.one_blas_thread

try:
    from critbatch.analysis.recommend.cli import main
except ModuleNotFoundError as err:  # a python without critbatch: one line, not a traceback
    sys.exit(f"critbatch: error: {err} in {sys.executable}; run .venv/bin/python "
             "analysis/recommend.py (`make install` creates .venv), or make recommend")

if __name__ == "__main__":
    main()
