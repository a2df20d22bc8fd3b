from critbatch.train import main

main()
