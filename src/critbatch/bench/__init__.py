"""Benchmarks: throughput, MFU and trainer overhead (`suite`, `python -m critbatch.bench`), their
printed table (`table`), and the GPU acceptance check (`gpu_check`)."""
