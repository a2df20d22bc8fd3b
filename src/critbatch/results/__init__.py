"""The contract between training and analysis: the run-results format (`runs`: what a run
directory holds, written by training and read by analysis), atomic file writes (`files`) and
the user-facing errors every layer raises (`errors`). Imports nothing else of critbatch."""
