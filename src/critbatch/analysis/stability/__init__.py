"""The stability study: verdicts per run (`stability`, by the `rules`), its report (`report`)
and `python analysis/stability.py` (`cli`)."""
