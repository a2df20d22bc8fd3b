#!/usr/bin/env python
"""Fit the critical batch size from finished runs and write the report.

`critbatch-fit` is the same command; its options: --help, or the docstring of
`critbatch.analysis.fit_bcrit_cli`, where the code is.
"""

from critbatch.analysis.fit_bcrit_cli import main

if __name__ == "__main__":
    main()
