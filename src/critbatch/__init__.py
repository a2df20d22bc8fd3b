"""critbatch: measure the critical batch size of language-model training."""

__version__ = "0.1.0"
