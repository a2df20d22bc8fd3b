"""Analysis: one package per study (`bcrit` with the B_crit fits and `python analysis/fit_bcrit.py`,
`joint`, `recommend`, `local_cbs`, `stability`, `schedules`, `branch_check`), each with its
computation, report and command side by side, and the rendering they share (`render`: the
render/publish pipeline; `plotting`). Reads results through `critbatch.results`; never imports
torch or `critbatch.training`.
"""
