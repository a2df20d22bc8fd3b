"""`python -m critbatch.noise RUN_DIR`: B_noise at a run's checkpoint (critbatch/training/)."""

from critbatch.training.noise_program import main

if __name__ == "__main__":
    main()
