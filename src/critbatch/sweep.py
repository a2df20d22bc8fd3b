"""`python -m critbatch.sweep STUDY` (`critbatch-sweep`, what `make sweep-*` runs): plan, train and
analyse a study's sweep (critbatch/orchestration/)."""

from critbatch.orchestration.sweep import main

if __name__ == "__main__":
    main()
