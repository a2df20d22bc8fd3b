from critbatch.training.cli import main

main()
