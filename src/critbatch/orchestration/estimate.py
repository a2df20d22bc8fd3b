"""The plan as the sweep prints it before training: runs and branches per stage, the tokens
left, the time they should take (tokens/s measured now with the trainer's own step, spread
over the jobs at once), the token caches to build first, and the checkpoints' peak disk."""

from __future__ import annotations

import shutil
from pathlib import Path

from critbatch.orchestration import workers
from critbatch.orchestration.launch import hydra_launcher
from critbatch.orchestration.planned import Job
from critbatch.orchestration.pool import job_threads
from critbatch.orchestration.workers import makespan
from critbatch.results.errors import ConfigError
from critbatch.science.model_size import param_count
from critbatch.training import config as schema
from critbatch.training.config import Config, micro_batch_size

RUN_OVERHEAD_S = 1.0  # per run or branch: set-up, W&B, evals, checkpoints (in a warm worker)
# Measured on the 2-core machine (2026-12-06; smoke and cpu batch sweeps, load 1-3): beside
# training, the noise stage (the program at the final and the peak-lr checkpoints, both
# optimizers side by side) and the timing of each lr-search round took 35-40 s, the analysis
# and its plots 18-19 s; the training itself ran 6-12% slower than the tokens/s measured
# before it.
NOISE_S = 40.0
REPORT_S = 20.0
SLOWER, FASTER = 1.25, 0.9  # the range printed around the training time: the load's sway


TIMED_STEPS = 20  # steps that time a model well enough once they take a fifth of the box


def measure_tokens_per_s(cfg: Config, seconds: float = 0.5, threads: int | None = None) -> float:
    """Training tokens/s of `cfg` (model, batch, optimizer) on random tokens, on the device,
    precision and compile setting the run itself resolves to (`resolve_device`: bf16 and
    torch.compile on CUDA), with `threads` torch threads (as each of several jobs at once
    will have). The first step, the compilation when compiled, is left out. Timed for
    `seconds`, or a fifth of them once TIMED_STEPS steps are done (a small model's steps: a
    smoke sweep times eight such models).

    Times the trainer's own step as the benchmark does, so the estimate and `make bench`
    measure the same thing.
    """
    import torch  # slow to import: only when a plan is estimated

    from critbatch.bench.timing import step_timer
    from critbatch.training.step import resolve_device

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        micro_batches = cfg.train.batch_size // micro_batch_size(cfg)
        device, dtype, compiled = resolve_device(cfg)
        step = step_timer(cfg, device, dtype=dtype, compiled=compiled,
                          track_micro_norms=cfg.train.gns.enabled and micro_batches >= 2)
        step()  # warm-up (and compilation)
        steps, elapsed = 0, 0.0
        while elapsed < seconds and not (steps >= TIMED_STEPS and elapsed >= seconds / 5):
            elapsed += sum(step())
            steps += 1
    finally:
        torch.set_num_threads(before)
    return steps * cfg.train.batch_size * cfg.model.seq_len / elapsed


def measured_rates(cfgs: list[Config], threads: int | None = None) -> tuple[list[float], str]:
    """`measure_tokens_per_s` of each config and the device's name, measured in one process
    forked from the workers' server (`workers.worker_context`, which has imported torch and
    the training loop): the sweep's own process imports neither torch's compiler for it
    (about 3 s of a core) nor, on a GPU, holds a CUDA context and the timed models' memory
    while its workers train."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=workers.worker_context()) as pool:
        return pool.submit(_time_models, cfgs, threads).result()


def _time_models(cfgs: list[Config], threads: int | None) -> tuple[list[float], str]:
    return [measure_tokens_per_s(cfg, threads=threads) for cfg in cfgs], _device_name()


def job_seconds(jobs: list[Job], threads: int | None = None) -> dict[Path, float]:
    """Seconds each job takes on one worker: its tokens left (run and branch cooldowns) at
    the tokens/s measured now for its model, batch, micro-batch and optimizer, plus
    RUN_OVERHEAD_S per run and branch."""
    return timed_jobs(jobs, threads)[0]


def timed_jobs(jobs: list[Job], threads: int | None = None) -> tuple[dict[Path, float], str]:
    """`job_seconds`, and the name of the device they were timed on."""
    models: dict[tuple, Config] = {}
    for job in jobs:
        models.setdefault(_model_key(job.cfg), job.cfg)
    rates, device = measured_rates(list(models.values()), threads) if models else ([], "")
    rate = dict(zip(models, rates, strict=True))
    seconds = {}
    for job in jobs:
        runs_left = (not job.finished) + sum(not b.done for b in job.branches)
        seconds[job.run_dir] = (job.tokens_to_train / rate[_model_key(job.cfg)]
                                + RUN_OVERHEAD_S * runs_left)
    return seconds, device


def _model_key(cfg: Config) -> tuple:
    """What a training step's speed depends on: the model, the batch and its micro-batches,
    the vocabulary, the optimizer."""
    m, t = cfg.model, cfg.train
    return (m.width, m.depth, m.heads, m.seq_len, t.batch_size, micro_batch_size(cfg),
            cfg.data.vocab_size, cfg.optim.name)


def print_plan(experiment: str, scale: str, jobs: list[Job], jobs_at_once: int,
               device: str = "cpu", search: tuple[float, float] = (0.0, 0.0),
               noise: bool = True) -> tuple[dict[Path, float], float]:
    """Print what the sweep will train and how long it should take: the training measured
    now, the lr search's `search` = (expected, at most) tokens, the noise stage (`noise`) and
    the report, with the range the load and the search span. Returns each job's estimated
    seconds (for the progress lines) and the estimated total seconds (0: not estimated)."""
    todo = [j for j in jobs if not j.done]
    n_cooldown = sum(len(j.cfg.train.branch_budgets) for j in jobs)
    n_local = sum(len(j.branches) for j in jobs) - n_cooldown
    print(f"sweep-{experiment} at scale={scale}: {len(jobs)} runs"
          + (f" (+{n_cooldown} cooldown branches)" if n_cooldown else "")
          + (f" (+{n_local} local-CBS branches)" if n_local else "")
          + f", {len(jobs) - len(todo)} already complete, {len(todo)} to train")
    for stage, optimizer in dict.fromkeys((j.stage, j.optimizer) for j in jobs):
        part = [j for j in jobs if (j.stage, j.optimizer) == (stage, optimizer)]
        left = sum(not j.done for j in part)
        print(f"  {stage:<15} optim={optimizer:<6} {len(part):>3} runs ({left} to train) "
              f"-> {part[0].run_dir.parent}")
    if not todo:
        return {}, 0.0
    if hydra_launcher(todo):  # timing here would time the submitting host, not the workers
        print(f"  {sum(j.tokens_to_train for j in todo) / 1e6:,.2f}M tokens to train; no time "
              "estimate: a Hydra launcher trains them elsewhere", flush=True)
        return {}, 0.0
    threads = job_threads(jobs_at_once) if device == "cpu" else None
    print("  timing a few training steps per model for the estimate ...", flush=True)
    seconds, device_name = timed_jobs(todo, threads)
    training = makespan(list(seconds.values()), jobs_at_once)
    tokens = sum(j.tokens_to_train for j in todo)
    print_shape(jobs)
    need, kept = checkpoint_bytes(todo, jobs_at_once)
    free = check_disk(need, Path("runs"))
    keep = ",".join(sorted({str(j.cfg.train.keep_checkpoint) for j in todo}))
    print(f"  disk: ~{need / 1e9:,.2f} GB of checkpoints at the peak, ~{kept / 1e9:,.2f} GB "
          f"kept after (train.keep_checkpoint={keep}), {free / 1e9:,.0f} GB free")
    prepare = data_to_prepare([j.cfg for j in todo])
    per_token = training / tokens if tokens else 0.0
    expected_search, most_search = (x * per_token for x in search)
    rest = NOISE_S * noise + REPORT_S
    total = prepare + training + expected_search + rest
    low = prepare + FASTER * training + rest
    high = prepare + SLOWER * (training + most_search) + rest
    parts = [f"{prepare / 60:.1f} preparing data"] if prepare else []
    parts += [f"{training / 60:.1f} training"]
    parts += [f"{expected_search / 60:.1f} lr search"] if search[0] else []
    parts += [f"{rest / 60:.1f} {'noise and report' if noise else 'report'}"]
    print(f"  {tokens / 1e6:,.2f}M tokens to train"
          + (f" (+~{search[0] / 1e6:,.1f}M expected from the lr search)" if search[0] else "")
          + f"; estimated {total / 60:.1f} min: {' + '.join(parts)}; likely {_minutes(low)}-"
          f"{_minutes(high)} min (tokens/s measured now on {device_name}, {jobs_at_once} "
          f"job(s) at once, sway with the load"
          + (f"; the lr search adds 0-{_minutes(most_search)} min" if search[1] else "") + ")",
          flush=True)
    return seconds, total


def print_shape(jobs: list[Job]) -> None:
    """The plan's fewest optimizer steps and its local-CBS windows, when it has them."""
    fewest = min((b.cfg for j in jobs for b in j.branches
                  if b.cfg.train.batch_schedule == "constant"), default=None,
                 key=lambda c: schema.total_steps(c))
    if fewest is not None:
        print(f"  fewest optimizer steps of any run: {schema.total_steps(fewest)} (batch "
              f"{fewest.train.batch_size}, {schema.token_budget(fewest):,} tokens; warmup "
              f"{fewest.train.warmup_steps} steps)")
    widest = max((b for j in jobs for b in j.branches if b.fields), default=None,
                 key=lambda b: b.cfg.train.batch_size)
    if widest is not None:
        t, window = widest.cfg.train, widest.tokens - widest.fork_tokens
        seq_len = widest.cfg.model.seq_len
        print(f"  local-CBS windows of {window:,} tokens: {window // (t.batch_size * seq_len)} "
              f"optimizer steps of the largest branch (batch {t.batch_size}), "
              f"{window // (t.batch_size_start * seq_len)} of k = 1")


def data_to_prepare(cfgs: list[Config]) -> float:
    """Print a line per corpus whose token cache is not built yet (the sweep builds it before
    the first run) and return the estimated seconds of all of them (a hub download: none)."""
    from critbatch.training.corpus import prepare_estimate

    seconds = 0.0
    for data in workers.unprepared_corpora(cfgs):
        size, estimate = prepare_estimate(data)
        what = f"data={data.name} V{data.vocab_size}: its token cache is built first"
        if estimate is None:
            print(f"  {what}: a hub download, not estimated (make data DATA={data.name} "
                  "builds it ahead)")
            continue
        print(f"  {what}: {size / 1e6:,.1f} MB of text, ~{estimate / 60:.1f} min (BPE and "
              "encoding)")
        seconds += estimate
    return seconds


CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights + AdamW's two moments (Muon's state is smaller)


def checkpoint_bytes(jobs: list[Job], jobs_at_once: int = 1) -> tuple[int, int]:
    """(peak, kept): the disk the checkpoints of `jobs` (one checkpoint.pt per run and branch
    not yet finished, CHECKPOINT_BYTES_PER_PARAM per parameter) add at most while the sweep
    trains them, and what stays after, under each job's `train.keep_checkpoint`.

    A job (a run and its branches) holds all its checkpoints until the last is finished, then
    drops those it does not keep: the peak is what every job keeps, plus the rest of the
    `jobs_at_once` largest jobs (side by side at the end), plus every local-CBS branch's (all
    base runs fork theirs before any branch trains)."""
    kept, together, held = 0, 0, []
    for job in jobs:
        m, keep = job.cfg.model, job.cfg.train.keep_checkpoint
        params = param_count(m.width, m.depth, m.seq_len, job.cfg.data.vocab_size)[0]
        size = params * CHECKPOINT_BYTES_PER_PARAM
        own, forked = (not job.finished) * size, sum(not b.done for b in job.branches) * size
        stays = own * (keep != "none") + forked * (keep == "all")
        kept += stays
        if any(b.fields for b in job.branches):
            together += own + forked - stays
        else:
            held.append(own + forked - stays)
    return kept + together + sum(sorted(held, reverse=True)[:jobs_at_once]), kept


def check_disk(need: int, folder: Path) -> int:
    """The free bytes where `folder` is (or will be); a one-line error when `need` is more."""
    where = folder.absolute()
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    if need > free:
        raise ConfigError(f"the sweep's checkpoints need ~{need / 1e9:,.1f} GB and {where} has "
                          f"{free / 1e9:,.1f} GB free; free some space or run the sweep where "
                          "there is more")
    return free


def _minutes(seconds: float) -> str:
    """Minutes to one decimal below ten, whole ones above."""
    return f"{seconds / 60:.1f}" if seconds < 600 else f"{seconds / 60:.0f}"


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "the CPU"
