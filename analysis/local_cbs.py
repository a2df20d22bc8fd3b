#!/usr/bin/env python
"""Report the local critical batch size of branched training.

`critbatch-local-cbs` is the same command; its options: --help, or the docstring of
`critbatch.analysis.local_cbs_cli`, where the code is.
"""

from critbatch.analysis.local_cbs_cli import main

if __name__ == "__main__":
    main()
