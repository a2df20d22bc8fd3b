#!/usr/bin/env python
"""Compare batch-size schedules at equal tokens and write the report.

`critbatch-schedules` is the same command; its options: --help, or the docstring of
`critbatch.analysis.schedules_cli`, where the code is.
"""

from critbatch.analysis.schedules_cli import main

if __name__ == "__main__":
    main()
