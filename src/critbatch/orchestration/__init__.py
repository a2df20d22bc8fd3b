"""Running a study's sweep: its plan and stages (`sweep`, `planned`), the local worker pool
(`pool`, `workers`), SLURM job arrays (`slurm`) and whether a report is up to date
(`report_inputs`). The command is `python -m critbatch.sweep`."""
