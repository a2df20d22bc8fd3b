"""critbatch: measure the critical batch size of language-model training.

Three layers, imports going one way:

- `critbatch.science`: the maths (noise-scale estimators, B_crit fits, lr and batch rules);
  numpy and scipy only;
- `critbatch.training`: config, data, model, optimizers, the training loop and the noise
  program; writes run directories in the results format;
- `critbatch.analysis`: the results format (`analysis.results`) and one module per study,
  turning run directories into reports; never imports torch or training.

Entry points: `python -m critbatch.train`, `critbatch.noise`, `critbatch.sweep`,
`critbatch.bench`, and the scripts in the repository's analysis/ folder.
"""

__version__ = "0.1.0"
