"""Benchmarks: throughput, MFU and trainer overhead (`python -m critbatch.bench`): the section
registry and command (`suite`), the timing primitives they share (`timing`), the
training-speed sections (`training_speed`), the device's peak and sharing (`capacity`), the
data path and analysis (`data_and_analysis`); their printed table (`table`), and the GPU
acceptance check (`gpu_check`)."""
