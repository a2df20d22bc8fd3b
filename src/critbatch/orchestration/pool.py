"""Train planned jobs on this machine's worker pool: the sweep's own path, and what each SLURM
array task runs on its node.

A run and its cooldown branches are one job; runs with local-CBS branches train in two
rounds, the base runs (which fork the branches) and then every forked branch as a job of its
own (`train_split`). The workers are `workers.run_jobs`: long-lived processes, longest
estimate first, one progress line per finished job.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from critbatch.analysis.parallel import cores
from critbatch.orchestration import workers
from critbatch.orchestration.planned import Job
from critbatch.training import branches as branching
from critbatch.training.config import Config


@dataclass(frozen=True)
class Placement:
    """Where the workers run: torch threads each (CPU), or the GPUs they are pinned to."""

    threads: int | None
    gpus: list[str] | None


def job_threads(jobs_at_once: int) -> int:
    """CPU threads each of `jobs_at_once` jobs gets: the cores split between them."""
    return max(1, cores() // jobs_at_once)


def gpu_jobs(plan: list[Job]) -> int:
    """JOBS=auto on CUDA: on every visible GPU as many workers as its widest planned model
    allows (`workers.runs_per_gpu`), each pinned to its GPU."""
    gpus = workers.visible_gpus()
    per_gpu = workers.runs_per_gpu(max(j.cfg.model.width for j in plan))
    print(f"JOBS=auto -> {per_gpu} run(s) on each of {len(gpus)} GPU(s)", flush=True)
    return max(1, per_gpu * len(gpus))


def train_here(jobs: list[Job], jobs_at_once: int, device: str, seconds: dict[Path, float],
               threads: int | None = None) -> list[workers.Outcome]:
    """Train the jobs not done on `jobs_at_once` workers of this machine (on `device`: with
    `threads` torch threads each, by default the cores split between them; or pinned to the
    visible GPUs)."""
    todo = [j for j in jobs if not j.done]
    place = Placement((threads or job_threads(jobs_at_once)) if device == "cpu" else None,
                      workers.visible_gpus() if device == "cuda" else None)
    name = workers.run_name
    split = [j for j in todo if any(b.fields for b in j.branches)]  # local-CBS bases
    whole = [j for j in todo if j not in split]
    outcomes = []
    if whole:
        outcomes += run_pool(f"{len(whole)} runs on {jobs_at_once} worker(s); each run's log is "
                             "its train.log",
                             [(j.cfg, j.run_dir, j.overrides, seconds.get(j.run_dir, 0.0))
                              for j in whole], jobs_at_once, place, name)
    if split:
        outcomes += train_split(split, jobs_at_once, place, seconds, name)
    return outcomes


def train_split(jobs: list[Job], jobs_at_once: int, place: Placement,
                seconds: dict[Path, float], name) -> list[workers.Outcome]:
    """Runs with local-CBS branches: the base runs first (they fork the branches), then every
    branch forked and not finished as a job of its own, so the workers share them."""
    per_token = {j.run_dir: seconds.get(j.run_dir, 0.0) / max(1, j.tokens_to_train)
                 for j in jobs}
    bases = [j for j in jobs if not j.finished]
    outcomes = []
    if bases:
        outcomes += run_pool(f"{len(bases)} base run(s) on {jobs_at_once} worker(s), forking "
                             "their local-CBS branches; each run's log is its train.log",
                             [(j.cfg, j.run_dir, j.overrides, per_token[j.run_dir] * j.tokens)
                              for j in bases], jobs_at_once, place, name, with_branches=False)
    forked = [(j, b) for j in jobs for b in branching.pending(j.cfg, j.run_dir, j.overrides)
              if (b.run_dir / "checkpoint.pt").exists()]  # a failed base forked none
    if forked:
        outcomes += run_pool(f"{len(forked)} local-CBS branches on {jobs_at_once} worker(s)",
                             [(b.cfg, b.run_dir, b.overrides,
                               per_token[j.run_dir] * (b.tokens - b.fork_tokens))
                              for j, b in forked], jobs_at_once, place, name)
    for job in jobs:  # the base's own checkpoint under keep_checkpoint=none, now its branches ended
        branching.retire(job.cfg, job.run_dir, job.overrides)
    return outcomes


def run_pool(title: str, items: list[tuple[Config, Path, list[str], float]],
             jobs_at_once: int, place: Placement, name,
             with_branches: bool = True) -> list[workers.Outcome]:
    """Announce `title`, then train `items` (config, run folder, overrides, estimated
    seconds) on the workers (`workers.run_jobs`)."""
    print(f"\n== training {title}", flush=True)
    return workers.run_jobs([(c, d.absolute(), o) for c, d, o, _ in items], jobs_at_once,
                            place.threads, {d.absolute(): est for _, d, _, est in items}, name,
                            with_branches, gpus=place.gpus)

