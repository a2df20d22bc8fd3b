"""The branch check: do cooldown branches reach the loss of runs planned for their budget
(`branch_check`), and `python analysis/branch_check.py` (`cli`)."""
