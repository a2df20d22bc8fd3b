#!/usr/bin/env python
"""Compare cooldown branches with separate wsd and cosine runs.

`critbatch-branch-check` is the same command; its options: --help, or the docstring of
`critbatch.analysis.branch_check_cli`, where the code is.
"""

from critbatch.analysis.branch_check_cli import main

if __name__ == "__main__":
    main()
