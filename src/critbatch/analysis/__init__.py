"""Analysis: the results format (`results.py`: what training writes and analysis reads), results
tables (`tables.py`), and one module per study (B_crit: `bcrit.py`, `kaplan.py`,
`bcrit_report.py`; stability; batch schedules), all through one render/publish pipeline
(`render.py`). Never imports torch or `critbatch.training`.
"""
