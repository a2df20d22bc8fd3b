#!/usr/bin/env python
"""Report the local critical batch size of branched training.

`critbatch-local-cbs` is the same command; its options: --help, or the docstring of
`critbatch.analysis.local_cbs.cli`, where the code is.
"""

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # why: analysis.render.one_blas_thread

try:
    from critbatch.analysis.local_cbs.cli import main
except ModuleNotFoundError as err:  # a python without critbatch: one line, not a traceback
    sys.exit(f"critbatch: error: {err} in {sys.executable}; run .venv/bin/python "
             "analysis/local_cbs.py (`make install` creates .venv), or make report")

if __name__ == "__main__":
    main()
