#!/usr/bin/env python
"""The batch size and learning rate for a larger run, predicted from your own sweep.

`critbatch-recommend` is the same command; its options: --help, or the docstring of
`critbatch.analysis.recommend_cli`, where the code is.
"""

from critbatch.analysis.recommend_cli import main

if __name__ == "__main__":
    main()
