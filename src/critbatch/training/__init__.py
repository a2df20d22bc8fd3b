"""Training: the typed config, data and token cache, the GPT model, optimizers, one optimizer
step (`step.py`), the loop (`loop.py`: `train()`), checkpoints, batch schedules, data
parallelism, the gradient-noise hooks and the offline `noise` program. Writes run directories
in the results format of `critbatch.results.runs`; uses `critbatch.science` for the maths.
"""
