"""The sweep's training workers: a few long-lived processes that train run after run.

`python -m critbatch.sweep` plans every run with Hydra (`stages.plan_stage` composes each
run's config and names its folder exactly as a Hydra multirun would), then hands the runs
to this pool instead of launching one multirun per stage and optimizer:

- one process per job slot for a stage, forked from a server that imported Python's
  modules, torch and the training loop once for the whole sweep (`worker_context`), so
  nothing is imported again per run or per stage;
- runs go out longest first (by the plan's estimate), so the cores stay busy until the last
  run rather than waiting on one long run at the end of every stage;
- one writer prints the progress: a line per finished run, `[k/N] run  val_loss  tokens/s
  elapsed  ETA`, while each run's own log lines, with timestamps, go to its train.log.

A run and its cooldown branches are one job (`loop.train_with_branches`); the local-CBS
branches, many per run, train as jobs of their own once their base run has forked them
(`pool.train_split`). A failed run is reported by the progress line, says why in its folder
(`failures.record`: failed.txt) and the sweep goes on. On SLURM each array task runs such a
pool on its share of the runs (`balance`, `slurm`); `python -m critbatch.train -m ...`
(Hydra's launchers) trains the same runs into the same folders.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from critbatch.results.errors import CritbatchError
from critbatch.training import failures
from critbatch.training.cli import disk_errors, finished_run
from critbatch.training.config import Config

log = logging.getLogger("critbatch")
LOG_FORMAT = "[%(asctime)s][%(levelname)s] - %(message)s"


@dataclass
class Outcome:
    """What a worker reports about one job (a run and its branches)."""

    run_dir: str
    ok: bool
    seconds: float  # wall time the job took in its worker
    # per run trained (the run, its branches): tokens, trained_tokens (a branch's from its
    # fork), val_loss, tokens_per_s, status
    trained: list[dict] = field(default_factory=list)
    error: str | None = None  # one line, when not ok
    gpu: str | None = None  # the CUDA_VISIBLE_DEVICES the worker was pinned to, if any


# Runs per GPU by model width when JOBS=auto: a width-128 model uses a sliver of a large GPU,
# so several share it. A starting table (arithmetic, not yet measured: `make gpu-check`
# prints the packing speed-up at k = 1, 2, 4 to correct it); JOBS=N overrides it.
RUNS_PER_GPU = ((192, 4), (320, 2), (10**9, 1))  # (widest width up to, runs per GPU)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, named as CUDA_VISIBLE_DEVICES names them (indices when
    it is unset); empty without CUDA."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def runs_per_gpu(width: int) -> int:
    return next(k for limit, k in RUNS_PER_GPU if width <= limit)


def gpu_slots(gpus: list[str], workers: int) -> list[str]:
    """The GPU each of `workers` workers is pinned to: round-robin over `gpus`, so k x n
    workers put k on each of n GPUs."""
    return [gpus[i % len(gpus)] for i in range(workers)]


def init_worker(threads: int | None, slots=None) -> None:
    """Each worker's torch threads (the cores split between the workers on a CPU) and, with
    `slots` (a queue of GPU names), its GPU: CUDA_VISIBLE_DEVICES is set before CUDA starts
    in this process, so `cuda` is that GPU alone."""
    if slots is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = slots.get()
    if threads:
        import torch

        torch.set_num_threads(threads)


def main_logged(module: str, argv: list[str], log_path: str, threads: int | None) -> None:
    """`python -m <module> <argv>` in a worker forked from the fork server (torch imported
    once there, where a fresh interpreter took ~2 s of a core to import it): everything the
    program prints, by Python or by a library at the file-descriptor level, goes to
    `log_path`; the worker's exit code is the program's."""
    with open(log_path, "w") as log_file:
        for fd in (1, 2):
            os.dup2(log_file.fileno(), fd)
    init_worker(threads)
    sys.argv = [module, *argv]
    importlib.import_module(module).main(argv)


@contextmanager
def job_output(log_path: Path) -> Iterator[None]:
    """The job's log lines (timestamped) and anything printed go to its train.log; nothing
    reaches the sweep's terminal, so progress bars stay off and lines never interleave."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(log_path, "a", buffering=1)  # noqa: SIM115 -- closed below
    handler = logging.StreamHandler(handle)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    saved = (sys.stdout, sys.stderr, log.handlers[:], log.level, log.propagate)
    log.handlers, log.propagate = [handler], False
    log.setLevel(logging.INFO)
    sys.stdout = sys.stderr = handle
    try:
        yield
    finally:
        sys.stdout, sys.stderr, log.handlers, level, log.propagate = saved
        log.setLevel(level)
        handle.close()


def train_job(cfg: Config, run_dir: str, overrides: list[str],
              with_branches: bool = True) -> Outcome:
    """Train a planned run and its branches (unless not `with_branches`) in this worker (a
    finished run is skipped, its missing branches trained); never raises."""
    from critbatch.training.loop import train, train_with_branches  # preloaded by the server

    start, folder = time.perf_counter(), Path(run_dir)
    failures.clear(folder)
    with job_output(folder / "train.log"):
        try:
            with disk_errors():
                finished = finished_run(folder, cfg)
                if with_branches:
                    summaries = train_with_branches(cfg, folder, overrides,
                                                    skip_finished=finished)
                else:
                    summaries = [] if finished else [train(cfg, folder, overrides)]
        except CritbatchError as err:
            log.error(str(err))
            error = str(err)
        except Exception as err:  # a bug: the traceback goes to the log, one line here
            log.exception("the run failed")
            first = (str(err).splitlines() or [""])[0]
            error = f"{type(err).__name__}: {first} (traceback in {folder}/train.log)"
        else:
            error = None
    if error is not None:
        failures.record(folder, error)
        return Outcome(run_dir, False, time.perf_counter() - start, error=error)
    trained = [{**{k: s[k] for k in ("tokens", "val_loss", "tokens_per_s", "status")},
                "trained_tokens": s["tokens"] - (s.get("branch_at_tokens") or 0)}
               for s in summaries]
    return Outcome(run_dir, True, time.perf_counter() - start, trained,
                   gpu=os.environ.get("CUDA_VISIBLE_DEVICES"))


@dataclass
class Progress:
    """The sweep's one progress writer: a line per finished job with the time left, from the
    plan's estimates corrected by how long the finished jobs really took."""

    total: int
    estimates: dict[str, float]  # run_dir -> estimated seconds on one worker
    workers: int
    start: float = field(default_factory=time.perf_counter)
    done: int = 0
    spent_s: float = 0.0  # worker seconds of the finished jobs
    planned_s: float = 0.0  # their estimates

    def line(self, outcome: Outcome, name: str) -> str:
        self.done += 1
        self.spent_s += outcome.seconds
        self.planned_s += self.estimates.get(outcome.run_dir, 0.0)
        self.estimates.pop(outcome.run_dir, None)
        ratio = self.spent_s / self.planned_s if self.planned_s > 0 else 1.0
        left_s = sum(self.estimates.values()) * ratio / self.workers
        elapsed = time.perf_counter() - self.start
        if outcome.ok and outcome.trained:
            main = outcome.trained[0]
            what = (f"val_loss {main['val_loss']:.4f} nats/token, "
                    f"{main['tokens_per_s'] / 1e3:,.1f}k tokens/s"
                    + (f", +{len(outcome.trained) - 1} branch(es)"
                       if len(outcome.trained) > 1 else ""))
            if main["status"] != "completed":
                what = f"{main['status']}; " + what
        elif outcome.ok:
            what = "already complete"
        else:
            what = f"FAILED: {outcome.error}"
        eta = f", ETA {left_s / 60:.1f} min" if self.done < self.total else ""
        return (f"[{self.done}/{self.total}] {name}: {what} ({outcome.seconds:.0f} s); "
                f"elapsed {elapsed / 60:.1f} min{eta}")


def run_name(run_dir: Path) -> str:
    """A run folder as the progress lines name it: relative to ./runs when inside it."""
    folder, root = Path(run_dir).absolute(), Path("runs").absolute()
    return str(folder.relative_to(root)) if folder.is_relative_to(root) else str(folder)


def unprepared_corpora(cfgs: list[Config]) -> list:
    """The distinct data configs of `cfgs` whose token cache is not built yet."""
    from dataclasses import asdict

    from critbatch.training.token_cache import is_prepared

    distinct = {repr(sorted(asdict(cfg.data).items())): cfg.data for cfg in cfgs}
    return [data for data in distinct.values() if not is_prepared(data)]


def prepare_data_first(cfgs: list[Config]) -> None:
    """Build each corpus's token cache (BPE, encoding) here, before the workers start, so its
    progress lines (with an ETA) reach the console instead of the first runs' train.logs and
    the runs' timings exclude it; a cache that exists is only checked."""
    from critbatch.training.token_cache import prepare_data

    for data in unprepared_corpora(cfgs):
        print(f"== data={data.name} V{data.vocab_size}: building its token cache "
              "first (once per corpus and vocabulary; progress below)", flush=True)
        t0 = time.perf_counter()
        tokens = prepare_data(data)
        print(f"== data ready in {time.perf_counter() - t0:.0f} s: "
              f"{tokens.manifest['train_tokens']:,} train tokens in {tokens.directory}",
              flush=True)


# the module a worker trains with: imported by the fork server, not by the sweep's own process,
# which plans, waits and reports without torch
TRAINING_LOOP = "critbatch.training.loop"


def worker_context() -> multiprocessing.context.BaseContext:
    """How the workers start: forked from a fork server that has imported this module and the
    training loop (torch) once, so a stage's workers are ready in a fraction of a second instead
    of each importing torch (~2 s of a core apiece). The server is a fresh single-threaded
    process: never a fork of this one, which may hold threads (torch's, W&B's). Where there is
    no fork server (Windows), each worker is spawned and imports them itself."""
    # in the server's environment: tokenizers' own threads stay off in forked workers
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # torch._dynamo too: torch's optimizers import it when the first one is built (1.4-1.9 s
    # of a core in each worker of each stage)
    context.set_forkserver_preload([__name__, TRAINING_LOOP, "torch._dynamo"])
    return context


def run_jobs(jobs: list[tuple[Config, Path, list[str]]], workers: int, threads: int | None,
             estimates: dict[Path, float], name: Callable[[Path], str] = str,
             with_branches: bool = True, gpus: list[str] | None = None) -> list[Outcome]:
    """Train `jobs` (config, run folder, overrides) on `workers` processes, longest
    estimate first, printing a progress line as each one ends; returns their outcomes.
    Without `with_branches` each job is its run alone (its branches are forked, not trained).
    With `gpus`, each worker is pinned to one of them (`gpu_slots`)."""
    prepare_data_first([cfg for cfg, _, _ in jobs])
    order = sorted(jobs, key=lambda j: -estimates.get(j[1], 0.0))
    progress = Progress(len(order), {str(j[1]): estimates.get(j[1], 0.0) for j in order},
                        workers)
    outcomes = []
    context = worker_context()
    slots = None
    if gpus:
        slots = context.Queue()
        for gpu in gpu_slots(gpus, workers):
            slots.put(gpu)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=init_worker,
                             initargs=(threads, slots)) as pool:
        futures = [pool.submit(train_job, cfg, str(run_dir), overrides, with_branches)
                   for cfg, run_dir, overrides in order]
        for future in as_completed(futures):
            outcome = future.result()
            outcomes.append(outcome)
            print(progress.line(outcome, name(Path(outcome.run_dir))), flush=True)
    return outcomes


def balance(costs: dict, parts: int) -> list[list]:
    """Split the keys of `costs` (a job -> its estimated cost) into `parts` lists, longest
    first, each to the list with the least cost so far: the greedy rule `run_jobs` follows
    with its workers, used to shard a sweep into array tasks. Empty lists are dropped."""
    shards: list[list] = [[] for _ in range(max(1, parts))]
    load = [0.0] * len(shards)
    for key in sorted(costs, key=lambda k: -costs[k]):
        i = load.index(min(load))
        shards[i].append(key)
        load[i] += costs[key]
    return [s for s in shards if s]


def makespan(seconds: list[float], workers: int) -> float:
    """Wall time of jobs of these lengths handed out longest first to `workers` workers,
    each taking the next job when it is free (what `run_jobs` does)."""
    costs = dict(enumerate(seconds))
    return max((sum(costs[k] for k in part) for part in balance(costs, workers)), default=0.0)


def efficiency(outcomes: list[Outcome], workers: int, wall_s: float) -> dict | None:
    """How well a sweep kept its workers training: the tokens trained per second of the
    sweep's wall time over the rate the same runs trained at on their own (each run's
    tokens/s, `workers` of them side by side). None when nothing was trained."""
    trained = [t for o in outcomes for t in o.trained if t["tokens_per_s"] > 0]
    tokens = sum(t["trained_tokens"] for t in trained)
    if not tokens or wall_s <= 0:
        return None
    busy_s = sum(t["trained_tokens"] / t["tokens_per_s"] for t in trained) / max(1, workers)
    return {"tokens": tokens, "wall_s": wall_s, "tokens_per_s": tokens / wall_s,
            "steady_tokens_per_s": tokens / busy_s, "efficiency": busy_s / wall_s}
