"""The stability study: its runs (`inputs`), verdicts per run (`stability`, by the `rules`),
gradient accumulation against the plain batch (`accumulation`), its report and pipeline
(`report`) and `python analysis/stability.py` (`cli`)."""
