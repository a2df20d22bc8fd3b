#!/usr/bin/env python
"""Analyse the small-batch stability study and write its report.

`critbatch-stability` is the same command; its options: --help, or the docstring of
`critbatch.analysis.stability_cli`, where the code is.
"""

from critbatch.analysis.stability_cli import main

if __name__ == "__main__":
    main()
