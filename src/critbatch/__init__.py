"""critbatch: measure the critical batch size of language-model training.

Layers, imports going one way (docs/architecture.md draws them):

- `critbatch.science`: the maths (noise-scale estimators, B_crit fits, lr and batch rules);
  numpy and scipy only;
- `critbatch.results`: the contract between training and analysis: the run-results format,
  atomic file writes and user-facing errors;
- `critbatch.training`: config, data, model, optimizers, the training loop and the noise
  program; writes run directories in the results format;
- `critbatch.analysis`: one package per study, turning run directories and tables into
  reports; never imports torch or training;
- `critbatch.peers`: public sweeps read into the analysis;
- `critbatch.orchestration`: a sweep's plan, its worker pool, SLURM arrays, report freshness;
- `critbatch.bench`: throughput benchmarks and the GPU check.

The modules at the top are the commands: `python -m critbatch.train`, `.noise`, `.sweep`,
`.report`, `.data`, `.local_cbs`, `.wandb_sync`, `.bench`, and the scripts in the
repository's analysis/ folder.
"""

__version__ = "0.1.0"
