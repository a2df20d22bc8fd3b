"""The B_crit study: best-lr cells (`best_lr`), per-run and Pareto B_crit (`bcrit`, `pareto`),
Kaplan's law (`kaplan`), their agreement (`consistency`), the online B_noise series
(`online_noise`), results tables (`tables`), bootstrap draws (`draws`), synthetic sweeps for
tests (`synthetic`), the report (`report`; its report.md `markdown`, its figures `plots`) and
`python analysis/fit_bcrit.py` (`cli`)."""
