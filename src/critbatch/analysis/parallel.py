"""Spreading independent refits (bootstrap replicates) over the CPU cores.

`process_map(jobs)` returns a `map` to hand to the science layer's bootstrap functions,
which draw each replicate from its own seed so that where it runs changes nothing. On Linux
the workers are forked (they start in milliseconds with everything imported); elsewhere they
are spawned.

Before it forks, the process freezes its objects (`gc.freeze`, as Python's gc documentation
advises for a fork without exec): the workers' collections leave the inherited objects alone,
and so do this process's own to its end, its last ones at exit included (recommend --table on
Step Law's grid exits about 0.1 s sooner). An object alive then that later becomes
unreachable only through a reference cycle is not reclaimed: nothing for a command that
exits after its analysis; a long-lived caller can `gc.unfreeze()` after.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor


def cores() -> int:
    """The CPU cores this process may run on (a SLURM task's allocation, a taskset), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def process_map(jobs: int | None = None, meanwhile: Callable[[], object] | None = None
                ) -> Callable:
    """A `map(fn, items)` over `jobs` worker processes (None: every core this process may
    use, so `taskset -c 0` makes it one), returning a list in the items' order; the builtin
    `map` for one job and inside a worker process (a coverage study's world: no pool within a
    pool). The items must pickle; so must `fn` where the workers are spawned rather than
    forked (a module-level function, or a partial of one).
    `meanwhile` is called in this process once the workers are busy (work that would
    otherwise wait for them, such as importing the plotting library)."""
    jobs = cores() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    if jobs == 1 or multiprocessing.parent_process() is not None:
        return map

    def spread(fn: Callable, items: Iterable) -> list:
        items = list(items)
        if len(items) < 2:
            return list(map(fn, items))
        workers = min(jobs, len(items))
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        if method == "fork":
            gc.freeze()  # see the module's docstring
        # `fn` (with the data it closes over: a bootstrap's cells) goes to each worker once,
        # inherited at the fork (pickled once a worker where spawned); the items are small,
        # so chunks can be small too and the workers end together
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                                 initializer=_hold, initargs=(fn,)) as pool:
            results = pool.map(_call, items, chunksize=math.ceil(len(items) / (16 * workers)))
            if meanwhile is not None:
                meanwhile()
            return list(results)

    return spread


_held: list[Callable] = []  # in a worker of `process_map`: the function it maps


def _hold(fn: Callable) -> None:
    _held[:] = [fn]


def _call(item):
    return _held[0](item)
