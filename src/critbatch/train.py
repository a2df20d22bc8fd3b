"""`python -m critbatch.train [hydra overrides]`: one training run (critbatch/training/)."""

from critbatch.training.cli import main

if __name__ == "__main__":
    main()
