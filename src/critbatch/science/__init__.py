"""The science of critbatch: pure functions of numbers, no torch, no files.

- `noise`: the gradient noise scale B_noise from squared gradient norms at two batch sizes,
  its moving average during training and its jackknife error bar;
- `fits`: the best lr of a grid, final loss versus tokens (power law, monotone inverse),
  log-linear least squares and the lr-scaling power law;
- `laws`: B_crit per run (tokens-equivalent), the steps/examples Pareto fit, Kaplan's
  B_crit(L) law;
- `rules`: batch sizes as doublings of the micro-batch, the linear ramp, the noise-adaptive
  controller and the lr scaling rules;
- `synthetic`: the McCandlish world the fits assume, so tests know the answer.

The formulas, units and references are in docs/science.md.
"""
