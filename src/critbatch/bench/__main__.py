"""`python -m critbatch.bench [--only SECTION ...]` (`make bench`): the throughput benchmarks."""

from critbatch.bench.suite import main

main()
