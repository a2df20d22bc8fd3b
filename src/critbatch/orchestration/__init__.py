"""Running a study's sweep: the studies (`experiments`), their stages planned (`stages`,
`planned`), the plan's estimate (`estimate`), where it trains (`launch`: the local worker pool
`pool`, `workers`, or SLURM job arrays `slurm`), the reports (`reports`) and whether one is up
to date (`report_inputs`). The command is `python -m critbatch.sweep` (`sweep`)."""
