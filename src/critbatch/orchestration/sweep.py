"""Run a whole experiment: its runs, the noise measurement, and the report.

`python -m critbatch.sweep batch --scale cpu --jobs 1 --opt adamw,muon` (what
`make sweep-batch` calls; likewise widths, stability, schedules and local_cbs) runs, in order:

1. the runs of the experiment's multiruns (`sweeps/<stage>.yaml`, one per optimizer), planned
   as Hydra would and trained on the sweep's workers (`pool`), or, with
   `hydra/launcher=slurm`, as SLURM array tasks of worker pools (`slurm`), skipping
   every run whose directory already holds a valid summary.json; a stage that carries a
   tuned lr gets the best lr of the tuning stage as `optim.lr`;
2. `python -m critbatch.noise` on the baseline's largest-budget run, per optimizer
   (batch and widths);
3. the experiment's analysis script over its run directories;

and prints where the report is. With `--dry-run` (`make sweep-batch DRY=1`) it prints the
plan (runs, tokens, estimated time and disk) and stops there. The schedules experiment's
`measured` arm follows the local-CBS report of its scale (`grid.schedules.measured_fits`);
when that file is missing, the local_cbs experiment runs first (saying so in one line), as
`make sweep-local-cbs` would. Run directories are `runs/<stage>/<scale>/<overrides>`,
named by their override values, so a second call trains nothing and an interrupted
call trains only what is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from critbatch.orchestration import pool, report_inputs, slurm, workers
from critbatch.orchestration.planned import Job
from critbatch.orchestration.pool import gpu_jobs, job_threads
from critbatch.orchestration.workers import makespan
from critbatch.results import runs
from critbatch.results.errors import ConfigError, ResultsError, user_errors
from critbatch.science.model_size import param_count
from critbatch.training import branches as branching
from critbatch.training import config as schema
from critbatch.training.cli import sweep_jobs
from critbatch.training.config import Config, KeepCheckpoint, micro_batch_size
from critbatch.training.config_checks import explain_compose_error, to_config

REPO = schema.CONF_DIR.parent
SWEEPS_DIR = REPO / "sweeps"
ANALYSIS_DIR = REPO / "analysis"


@dataclass(frozen=True)
class Experiment:
    stages: tuple[str, ...]  # sweeps/<stage>.yaml, run in this order
    analysis: str  # analysis/<script> over the stages' folders
    noise_stage: str | None = None  # its largest-budget run gets the offline B_noise
    tuning_stage: str | None = None  # the later stages train at its best optim.lr
    middle_lr: bool = False  # the stages train at the middle lr of the batch grid (grid.lrs)
    report: str = ""  # the stage whose folder holds the report (runs/<it>/<scale>/report)
    # an experiment whose report the analysis draws for comparison when it exists at the same
    # scale (passed as --batch-sweep runs/<it>/<scale>)
    compare_with: str | None = None

    @property
    def report_stage(self) -> str:
        return self.report or self.stages[-1]


EXPERIMENTS = {
    "batch": Experiment(("batch", "batch_seeds"), "fit_bcrit.py", noise_stage="batch",
                        report="batch"),
    "widths": Experiment(("widths", "widths_seeds"), "fit_bcrit.py", noise_stage="widths",
                         report="widths"),
    "stability": Experiment(("stability_lr", "stability", "stability_accum"), "stability.py",
                            tuning_stage="stability_lr", report="stability"),
    "schedules": Experiment(("schedules",), "schedules.py"),
    "branches": Experiment(("batch", "branch_check"), "branch_check.py", tuning_stage="batch",
                           report="branch_check"),
    "local_cbs": Experiment(("local_cbs",), "local_cbs.py", middle_lr=True,
                            compare_with="batch"),
}
RUN_OVERHEAD_S = 1.0  # per run or branch: set-up, W&B, evals, checkpoints (in a warm worker)
NOISE_OVERHEAD_S = 10.0  # per noise measurement: a process start and its W&B run
REPORT_S = 20.0  # the analysis and its plots


def resolve_scale(scale: str) -> str:
    """`auto` is `gpu` when CUDA is available, else `cpu`."""
    if scale != "auto":
        return scale
    import torch

    chosen = "gpu" if torch.cuda.is_available() else "cpu"
    print(f"SCALE=auto -> {chosen} ({'CUDA found' if chosen == 'gpu' else 'no CUDA device'})")
    return chosen


def check_cuda(scale: str, overrides: list[str]) -> None:
    """SCALE=gpu trains here only with CUDA here, or when asked to with train.device=cpu; a
    Hydra launcher (hydra/launcher=...) trains elsewhere, so it is not checked."""
    if scale != "gpu" or any(o.startswith(("train.device=", "hydra/launcher=")) for o in overrides):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("SCALE=gpu needs CUDA and none is available here; use SCALE=cpu for "
                          "this machine, ARGS=train.device=cpu to force the gpu scale onto the "
                          "CPU, or a launcher (ARGS=hydra/launcher=...) to train elsewhere")


@contextlib.contextmanager
def sweep_composer() -> Iterator[Callable[[str, list[str]], DictConfig]]:
    """`compose(stage, overrides)` of sweeps/<stage>.yaml with conf/ on the search path (as
    the `--config-dir sweeps` launch has it) and Hydra's config; a Hydra error in the block
    becomes a one-line ConfigError."""
    from hydra import compose, initialize_config_dir

    schema.register_configs()
    search = [f"hydra.searchpath=[file://{schema.CONF_DIR}]"]  # as `--config-dir sweeps` does
    try:
        with initialize_config_dir(str(SWEEPS_DIR), version_base="1.3"):
            yield lambda stage, overrides: compose(stage, overrides=search + overrides,
                                                   return_hydra_config=True)
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(explain_compose_error(err)) from None


def plan_stage(stage: str, scale: str, optimizer: str, extra: list[str]) -> list[Job]:
    """Expand one multirun exactly as Hydra's basic sweeper will, with each job's run dir."""
    cli = [f"scale={scale}", f"optim={optimizer}", *extra]
    with sweep_composer() as compose:
        root = compose(stage, cli)
        swept = root.hydra.sweeper.params or {}
        check_swept(stage, swept, extra)
        params = [f"{k}={v}" for k, v in swept.items()]
        jobs = []
        for overrides in sweep_jobs(params + cli):
            cfg = compose(stage, overrides)
            run_dir = Path(cfg.hydra.sweep.dir) / cfg.hydra.job.override_dirname
            del cfg.hydra
            task = [o for o in overrides if not o.startswith(("hydra.", "hydra/"))]  # as Hydra
            jobs.append(Job(stage, optimizer, task, run_dir, to_config(cfg), list(extra)))
    return jobs


# where a stage sweeps a key, the grid key a user sets instead (the sweep's own values)
SWEPT_BY = {"train.seed": "grid.seed (the grid's runs) and grid.baseline_seeds (the extra seeds)",
            "train.batch_size": "grid.batch_sizes (and grid.seeded_batch_sizes)",
            "optim.lr": "grid.lrs.<optimizer> (and grid.seeded_lrs.<optimizer>)",
            "model.width": "grid.widths"}


def check_swept(stage: str, swept, extra: list[str]) -> None:
    """ConfigError where an override fixes a key the stage sweeps over: Hydra would let it
    win, and the stage would train one value where it meant several (`train.seed=10` made
    the seeds stage train the grid's seed again)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(swept, resolve=False) if OmegaConf.is_config(swept) else swept
    for override in extra:
        key = override.split("=", 1)[0].lstrip("+~")
        # a stage that sweeps `optim.lr: ${optim.lr}` takes its one value from the override
        if key in swept and raw[key] != f"${{{key}}}":
            instead = SWEPT_BY.get(key, f"the grid key behind {key}")
            raise ConfigError(f"{override}: the {stage} stage sweeps {key} over {swept[key]}; "
                              f"set {instead} instead")


def measure_tokens_per_s(cfg: Config, seconds: float = 0.5, threads: int | None = None) -> float:
    """Training tokens/s of `cfg` (model, batch, optimizer) on random tokens, on the device,
    precision and compile setting the run itself resolves to (`resolve_device`: bf16 and
    torch.compile on CUDA), with `threads` torch threads (as each of several jobs at once
    will have). The first step, the compilation when compiled, is left out.

    Times the trainer's own step as the benchmark does, so the estimate and `make bench`
    measure the same thing.
    """
    import torch  # slow to import: only when a plan is estimated

    from critbatch.bench.suite import step_timer
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
        while elapsed < seconds:
            elapsed += sum(step())
            steps += 1
    finally:
        torch.set_num_threads(before)
    return steps * cfg.train.batch_size * cfg.model.seq_len / elapsed


def job_seconds(jobs: list[Job], threads: int | None = None) -> dict[Path, float]:
    """Seconds each job takes on one worker: its tokens left (run and branch cooldowns) at
    the tokens/s measured now for its model, batch, micro-batch and optimizer, plus
    RUN_OVERHEAD_S per run and branch."""
    rates: dict[tuple, float] = {}
    seconds = {}
    for job in jobs:
        m, t = job.cfg.model, job.cfg.train
        key = (m.width, m.depth, m.heads, m.seq_len, t.batch_size, micro_batch_size(job.cfg),
               job.cfg.data.vocab_size, job.cfg.optim.name)
        if key not in rates:
            rates[key] = measure_tokens_per_s(job.cfg, threads=threads)
        runs_left = (not job.finished) + sum(not b.done for b in job.branches)
        seconds[job.run_dir] = job.tokens_to_train / rates[key] + RUN_OVERHEAD_S * runs_left
    return seconds


def unplanned_runs(jobs: list[Job]) -> dict[Path, list[Path]]:
    """Finished run directories in the plan's stage folders that the plan does not name (an
    older grid, a different lr_scaling): {folder: [run dirs]}, for the folders that have any."""
    planned = {d.resolve() for j in jobs for d in [j.run_dir, *(b.run_dir for b in j.branches)]}
    found = {}
    for folder in sorted({j.run_dir.parent for j in jobs}):
        finished = runs.find_run_dirs([folder])[0] if folder.exists() else []
        extra = [d for d in finished if d.resolve() not in planned]
        if extra:
            found[folder] = extra
    return found


def check_finished(jobs: list[Job]) -> None:
    """ConfigError when a planned run directory holds a finished run of another config (its
    grid changed since): the sweep would skip it and the report would mix the two."""
    stale = [(j, keys) for j in jobs if (keys := j.differences)]
    if stale:
        job, keys = stale[0]
        raise ConfigError(
            f"{job.run_dir} holds a finished run of a different config ({', '.join(keys)})"
            + (f", and {len(stale) - 1} more run(s) like it" if len(stale) > 1 else "")
            + f"; move {job.run_dir.parent} away (or pass hydra.sweep.dir=...) to train this plan"
        )


def print_plan(experiment: str, scale: str, jobs: list[Job], jobs_at_once: int,
               device: str = "cpu") -> dict[Path, float]:
    """Print what the sweep will train and how long it should take; return each job's
    estimated seconds (for the progress lines)."""
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
        return {}
    if hydra_launcher(todo):  # timing here would time the submitting host, not the workers
        print(f"  {sum(j.tokens_to_train for j in todo) / 1e6:,.2f}M tokens to train; no time "
              "estimate: a Hydra launcher trains them elsewhere", flush=True)
        return {}
    threads = job_threads(jobs_at_once) if device == "cpu" else None
    print(f"  timing a few training steps per model on {_device_name()} for the estimate ...",
          flush=True)
    seconds = job_seconds(todo, threads)
    training = makespan(list(seconds.values()), jobs_at_once)
    tokens = sum(j.tokens_to_train for j in todo)
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
    need, kept = checkpoint_bytes(todo, jobs_at_once)
    free = check_disk(need, Path("runs"))
    keep = ",".join(sorted({str(j.cfg.train.keep_checkpoint) for j in todo}))
    print(f"  disk: ~{need / 1e9:,.2f} GB of checkpoints at the peak, ~{kept / 1e9:,.2f} GB "
          f"kept after (train.keep_checkpoint={keep}), {free / 1e9:,.0f} GB free")
    prepare = data_to_prepare([j.cfg for j in todo])
    data_part = f"{prepare / 60:.1f} min to prepare data + " if prepare else ""
    print(f"  {tokens / 1e6:,.2f}M tokens to train; estimated {data_part}{training / 60:.1f} "
          f"min of training + ~{(NOISE_OVERHEAD_S + REPORT_S) / 60:.1f} min of noise and "
          f"report (tokens/s measured now on {_device_name()}, {jobs_at_once} job(s) at once)",
          flush=True)
    return seconds


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


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "the CPU"


def hydra_launcher(jobs: list[Job]) -> bool:
    """The user chose a Hydra launcher (`hydra/launcher=slurm`, ...): the runs train elsewhere,
    as a submitit job array (`launcher_config`) or as Hydra multiruns, not on this machine."""
    return any(o.startswith(("hydra/launcher=", "hydra.launcher.")) for j in jobs
               for o in j.extra)


def submitit_array(jobs: list[Job], tasks: int | None = None) -> slurm.Array | None:
    """The array the sweep shards its runs into when the chosen Hydra launcher is a submitit
    one (`hydra/launcher=slurm`, `submitit_slurm`, `submitit_local`), with its fields
    (hydra.launcher, resolved); None for no launcher or another one (joblib), whose stages go
    to Hydra as multiruns."""
    if not hydra_launcher(jobs):
        return None
    job = jobs[0]
    with sweep_composer() as compose:
        root = compose(job.stage, [f"scale={job.cfg.scale}", f"optim={job.optimizer}",
                                   *job.extra])
        launcher = OmegaConf.to_container(root.hydra.launcher, resolve=True)
    return slurm.Array(launcher, tasks) if slurm.is_submitit(launcher) else None


def train_jobs(jobs: list[Job], jobs_at_once: int, device: str, seconds: dict[Path, float],
               array: slurm.Array | None = None) -> list[workers.Outcome]:
    """Train the jobs not done on `jobs_at_once` workers here (pool.train_here), or as one
    `array` of worker pools (slurm.train_array), or, with another Hydra launcher, as one
    multirun per stage and optimizer."""
    todo = [j for j in jobs if not j.done]
    if not todo:
        return []
    if array is not None:
        return slurm.train_array(todo, array, device, seconds)
    if hydra_launcher(todo):
        for stage, optimizer in dict.fromkeys((j.stage, j.optimizer) for j in todo):
            part = next(j for j in todo if (j.stage, j.optimizer) == (stage, optimizer))
            code = launch_stage(stage, part.cfg.scale, optimizer, part.extra, jobs_at_once,
                                device)
            if code:
                print(f"== the {stage} multirun (optim={optimizer}) exited with status {code}; "
                      "the runs it did not finish are listed at the end", flush=True)
        return []
    return pool.train_here(todo, jobs_at_once, device, seconds)


def launch_stage(stage: str, scale: str, optimizer: str, extra: list[str], jobs_at_once: int,
                 device: str) -> int:
    """Run one Hydra multirun in a child process (its launcher from `extra`); its jobs skip
    runs already complete and train missing branches."""
    cmd = [sys.executable, "-m", "critbatch.train", "--config-dir", str(SWEEPS_DIR),
           "--config-name", stage, f"scale={scale}", f"optim={optimizer}", *extra]
    env = dict(os.environ)
    if device == "cpu" and jobs_at_once > 1:  # split the cores between the jobs
        threads = job_threads(jobs_at_once)
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    print(f"\n== {stage} (optim={optimizer}): python {' '.join(cmd[1:])}", flush=True)
    return subprocess.call(cmd, env=env)


def final_loss(job: Job) -> float:
    """A finished job's final val loss (nats/token); inf when it diverged."""
    loss = runs.read_summary(job.run_dir)["val_loss"]
    return loss if math.isfinite(loss) else math.inf


def hold_for_noise(exp: Experiment, plan: list[Job]) -> list[Job]:
    """The runs the noise program may read (per optimizer, the noise stage's smallest batch at
    its largest budget) that keep_checkpoint=none would leave without one: they train under
    `final` instead, until `release_after_noise`. Returns them."""
    held = []
    for optimizer in dict.fromkeys(j.optimizer for j in plan):
        stage = [j for j in plan if (j.stage, j.optimizer) == (exp.noise_stage, optimizer)]
        batch = min((j.cfg.train.batch_size for j in stage), default=0)
        top = max((j.tokens for j in stage if j.cfg.train.batch_size == batch), default=0)
        held += [j for j in stage if (j.cfg.train.batch_size, j.tokens) == (batch, top)
                 and j.cfg.train.keep_checkpoint == "none"]
    for job in held:
        job.cfg.train.keep_checkpoint = KeepCheckpoint.final
    if held and hydra_launcher(plan) and submitit_array(plan) is None:  # a multirun
        raise ConfigError("train.keep_checkpoint=none under a Hydra launcher would delete the "
                          "checkpoint the noise program reads; use train.keep_checkpoint=final")
    return held


def release_after_noise(held: list[Job]) -> None:
    """Delete the checkpoints `hold_for_noise` kept, per optimizer once its noise.json exists."""
    for job in held:
        if any((j.run_dir / "noise.json").exists() for j in held if j.optimizer == job.optimizer):
            (job.run_dir / branching.CHECKPOINT).unlink(missing_ok=True)


def noise_target(jobs: list[Job], stage: str, optimizer: str) -> Job | None:
    """The run B_noise is measured at: among the stage's finished runs of the smallest batch
    (the baseline), the largest budget's best lr."""
    done = [j for j in jobs if j.stage == stage and j.optimizer == optimizer and j.finished]
    done = [j for j in done if j.cfg.train.batch_size == min(k.cfg.train.batch_size
                                                             for k in done)]
    if not done:
        return None
    top = max(j.tokens for j in done)
    return min((j for j in done if j.tokens == top), key=final_loss)


def tuned_lr(jobs: list[Job], stage: str, optimizer: str) -> float | None:
    """`optim.lr` of the tuning stage's best finished run at its smallest batch (lowest final
    val loss), or None while none of those has finished without diverging."""
    done = [j for j in jobs if j.stage == stage and j.optimizer == optimizer and j.done]
    done = [j for j in done if j.cfg.train.batch_size == min(k.cfg.train.batch_size
                                                             for k in done)]
    best = min(done, key=final_loss, default=None)
    if best is None or final_loss(best) == math.inf:
        return None
    return best.cfg.optim.lr


def middle_lr(scale: str, optimizer: str) -> float:
    """The middle lr of the scale's batch grid (`grid.lrs`) for `optimizer`."""
    from critbatch.training.cli import check_overrides

    lrs = check_overrides([f"scale={scale}", f"optim={optimizer}"]).grid.lrs[optimizer]
    values = [float(x) for x in str(lrs).split(",")]
    return values[len(values) // 2]


def stage_extra(exp: Experiment, stage: str, optimizer: str, plan: list[Job],
                extra: list[str], scale: str = "cpu") -> list[str] | None:
    """The overrides of one stage: `extra`, plus the tuned lr for the stages after a tuning
    stage (None when the tuning stage has no usable run yet), or the grid's middle lr."""
    if exp.middle_lr and not any(o.startswith("optim.lr=") for o in extra):
        return [*extra, f"optim.lr={middle_lr(scale, optimizer)!r}"]
    if exp.tuning_stage is None or stage == exp.tuning_stage:
        return extra
    lr = tuned_lr(plan, exp.tuning_stage, optimizer)
    return None if lr is None else [*extra, f"optim.lr={lr!r}"]


def plan_experiment(exp: Experiment, scale: str, optimizers: list[str], extra: list[str],
                    plan: list[Job] | None = None) -> list[Job]:
    """Every job of the experiment that can be planned now (a stage waiting for its tuned lr
    is planned at its tuning grid's middle lr, as an estimate, until the lr is known)."""
    jobs: list[Job] = []
    for stage, opt in itertools.product(exp.stages, optimizers):
        overrides = stage_extra(exp, stage, opt, (plan or []) + jobs, extra, scale)
        if overrides is None:
            grid = [j.cfg.optim.lr for j in jobs if (j.stage, j.optimizer) ==
                    (exp.tuning_stage, opt)]
            overrides = [*extra, f"optim.lr={grid[len(grid) // 2]!r}"] if grid else extra
        jobs += plan_stage(stage, scale, opt, overrides)
    return jobs


def missing_measurement(scale: str, extra: list[str]) -> Path | None:
    """The local-CBS report (fits.json) the schedules sweep's `measured` arm follows, when that
    arm is in the sweep and the file does not exist yet; else None."""
    with sweep_composer() as compose:
        root = compose("schedules", [f"scale={scale}", *extra])
        arms = str((root.hydra.sweeper.params or {}).get("arm", "")).split(",")
        fits = Path(root.grid.schedules.measured_fits)
    return fits if "measured" in arms and not fits.exists() else None


def run_experiment(experiment: str, scale: str, jobs_at_once: int | None,
                   optimizers: list[str], extra: list[str], dry_run: bool = False,
                   tasks: int | None = None) -> int:
    """Every stage of an experiment; returns how many runs or stages did not complete.

    The stages train together on one pool of workers, except that the stages after a tuning
    stage wait for its best lr; with a submitit launcher the pools are the tasks of a job
    array, `tasks` of them (slurm.train_array). The schedules experiment first runs the
    local_cbs one when the report its measured arm follows is missing. A `dry_run` prints the
    plan and stops before anything is trained, measured or written."""
    t0 = time.perf_counter()
    exp = EXPERIMENTS[experiment]
    scale = resolve_scale(scale)
    before = 0
    if experiment == "schedules" and (fits := missing_measurement(scale, extra)):
        print(f"== {fits} does not exist: the measured arm follows it, so the local_cbs "
              f"experiment runs first (make sweep-local-cbs SCALE={scale})", flush=True)
        before = run_experiment("local_cbs", scale, jobs_at_once, optimizers, extra, dry_run,
                                tasks)
        if dry_run:
            print(f"dry run: the schedules plan follows {fits}, once that experiment wrote it")
            return before
        print(f"\n== back to sweep-schedules at scale={scale}", flush=True)
    plan = plan_experiment(exp, scale, optimizers, extra)
    check_finished(plan)
    held = hold_for_noise(exp, plan)
    array = submitit_array(plan, tasks)
    jobs_at_once = jobs_at_once or (1 if hydra_launcher(plan) else gpu_jobs(plan))
    device = "cuda" if scale == "gpu" else "cpu"
    seconds = print_plan(experiment, scale, plan, jobs_at_once, device)
    if dry_run:
        if exp.tuning_stage and any(tuned_lr(plan, exp.tuning_stage, o) is None
                                    for o in optimizers):
            print(f"  {' and '.join(s for s in exp.stages if s != exp.tuning_stage)} wait for "
                  f"the best lr of {exp.tuning_stage}: estimated here at its grid's middle lr")
        if array is not None and (todo := [j for j in plan if not j.done]):
            for line in slurm.shard(todo, array, device, seconds)[1]:
                print(f"  SLURM array (submitit {array.cluster}) {line}")
        print("dry run: nothing trained, no noise measured, no report written")
        return before
    problems, outcomes = [], []
    if exp.tuning_stage:
        outcomes += train_jobs([j for j in plan if j.stage == exp.tuning_stage], jobs_at_once,
                               device, seconds, array)
        plan, problems = replan_after_tuning(exp, scale, optimizers, extra, plan)
    outcomes += train_jobs(plan, jobs_at_once, device, seconds, array)
    failed = [j for j in plan if not j.done]
    problems += [f"run did not complete: {j.run_dir} ({j.failure or 'no reason recorded'}; "
                 "see its train.log)" for j in failed]
    problems += measure_noise(exp, plan, optimizers, jobs_at_once, array)
    release_after_noise(held)

    notes = [f"{folder} holds {len(extra_runs)} finished run(s) outside this plan (e.g. "
             f"{extra_runs[0].name}); the report reads every run in the folder"
             for folder, extra_runs in unplanned_runs(
                 [j for j in plan if j.stage != exp.tuning_stage]).items()]  # its own folders
    report_dir = Path("runs") / exp.report_stage / scale / "report"
    sweep_dirs = sorted({str(j.run_dir.parent) for j in plan if j.run_dir.parent.exists()})
    if not analyse_sweep(exp, sweep_dirs, report_dir, "analysis"):
        problems.append("the analysis failed (its message is above)")
    wall_s = time.perf_counter() - t0
    print(f"\nsweep-{experiment} scale={scale}: {len(plan) - len(failed)}/{len(plan)} runs "
          f"complete in {wall_s / 60:.1f} min")
    # an array's wall time holds its queue waits: no efficiency to state
    use = workers.efficiency(outcomes, jobs_at_once, wall_s) if array is None else None
    if use:
        print(f"efficiency: {use['tokens'] / 1e6:,.2f}M tokens trained in {wall_s / 60:.1f} min "
              f"= {use['tokens_per_s'] / 1e3:,.1f}k tokens/s of wall time, "
              f"{use['efficiency']:.0%} of the {use['steady_tokens_per_s'] / 1e3:,.1f}k tokens/s "
              f"its runs trained at ({jobs_at_once} side by side; the rest is start-up, "
              "evaluation, noise and report)")
    for note in notes:
        print(f"note: {note}")
    for problem in problems:
        print(f"warning: {problem}")
    if (report_dir / "report.md").exists():
        print(f"report: {report_dir / 'report.md'}")
    return before + len(problems)


def replan_after_tuning(exp: Experiment, scale: str, optimizers: list[str], extra: list[str],
                        plan: list[Job]) -> tuple[list[Job], list[str]]:
    """The plan with the stages after the tuning stage at its best lr (per optimizer), and
    the stages that cannot run because every tuning run diverged or failed."""
    problems = []
    for stage, optimizer in itertools.product(exp.stages, optimizers):
        if stage == exp.tuning_stage:
            continue
        plan = [j for j in plan if (j.stage, j.optimizer) != (stage, optimizer)]
        overrides = stage_extra(exp, stage, optimizer, plan, extra, scale)
        if overrides is None:
            problems.append(f"{stage} (optim={optimizer}) not run: every run of "
                            f"{exp.tuning_stage} diverged or failed, so no lr to carry")
            continue
        plan += plan_stage(stage, scale, optimizer, overrides)
        print(f"== {stage} (optim={optimizer}): {overrides[-1]}, the best of "
              f"{exp.tuning_stage}")
    check_finished(plan)
    return plan, problems


def measure_noise(exp: Experiment, plan: list[Job], optimizers: list[str],
                  jobs_at_once: int, array: slurm.Array | None = None) -> list[str]:
    """`python -m critbatch.noise` on each optimizer's noise target, side by side (output in
    the run's noise.log), here or as tasks of an `array`; returns the problems."""
    if not exp.noise_stage:
        return []
    targets = []
    for optimizer in optimizers:
        target = noise_target(plan, exp.noise_stage, optimizer)
        if target is None:
            continue
        if (target.run_dir / "noise.json").exists():
            print(f"== noise (optim={optimizer}): {target.run_dir}/noise.json exists, skipped")
            continue
        print(f"== noise (optim={optimizer}) on {target.run_dir} (log: noise.log)", flush=True)
        targets.append(target)
    if array is not None:
        succeeded = slurm.measure_noise(array, [t.run_dir for t in targets])
    else:
        env = dict(os.environ, OMP_NUM_THREADS=str(job_threads(min(jobs_at_once,
                                                                   len(optimizers)))))
        started = []
        for target in targets:
            with open(target.run_dir / "noise.log", "w") as log_file:
                started.append(subprocess.Popen(
                    [sys.executable, "-m", "critbatch.noise", str(target.run_dir)],
                    stdout=log_file, stderr=subprocess.STDOUT, env=env))
        succeeded = [proc.wait() == 0 for proc in started]
    problems = []
    for target, ok in zip(targets, succeeded, strict=True):
        if not ok:
            problems.append(f"the noise measurement failed on {target.run_dir} (see its "
                            "noise.log)")
            continue
        noise = runs.read_noise(target.run_dir) or {}
        b = noise.get("b_noise_tokens")
        print(f"== noise (optim={target.optimizer}): B_noise "
              + (f"{b:,.0f} tokens" if b else "not resolved")
              + f" at val_loss {noise.get('val_loss', float('nan')):.4f} nats/token")
    return problems


def analyse_sweep(exp: Experiment, folders: list[str], out: Path, title: str,
                  force: bool = False) -> bool:
    """Run the experiment's analysis script over `folders` into `out`, unless (without
    `force`) the report there was written from the same inputs (`report_inputs`); True if it
    succeeded or was up to date."""
    script = ANALYSIS_DIR / exp.analysis
    args = [*folders, "--out", str(out)]
    if exp.compare_with:  # out is <runs>/<stage>/<scale>/report
        other = out.parents[2] / exp.compare_with / out.parent.name
        if (other / "report" / "fits.json").is_file():
            args += ["--batch-sweep", str(other)]
    stamp = report_inputs.fingerprint(folders, args, ANALYSIS_DIR)
    if not force and report_inputs.up_to_date(out, stamp):
        print(f"\n== {title}: {out / 'report.md'} is up to date (no run, noise measurement or "
              f"analysis code changed since it was written; `make report` redoes it)", flush=True)
        return True
    print(f"\n== {title}: python {script.relative_to(REPO)} {' '.join(args)}", flush=True)
    if subprocess.call([sys.executable, "-u", str(script), *args]) != 0:  # lines as they come
        return False
    report_inputs.record(out, stamp)
    return True


def report_all(runs_root: Path = Path("runs")) -> int:
    """Re-run the analysis of every experiment's sweeps found under `runs_root` (no
    training): one report per experiment and scale, where it stands after a sweep. Returns
    the number of analyses that failed."""
    done = failed = 0
    for name, exp in EXPERIMENTS.items():
        scales = sorted(d.name for d in (runs_root / exp.report_stage).glob("*") if d.is_dir())
        for scale in scales:
            folders = [str(runs_root / stage / scale) for stage in exp.stages
                       if (runs_root / stage / scale).is_dir()]
            out = runs_root / exp.report_stage / scale / "report"
            done += 1
            if not analyse_sweep(exp, folders, out, f"{name} at scale={scale}", force=True):
                failed += 1
                print(f"warning: the {name} analysis at scale={scale} failed (its message is "
                      "above)")
    if not done:
        raise ResultsError(f"no sweep folders under {runs_root}/ (runs/<stage>/<scale>); run a "
                           "sweep first, e.g. make sweep-batch")
    print(f"\n{done - failed}/{done} reports written")
    return failed


def parse_jobs(jobs: str, scale: str) -> int | None:
    """JOBS: a count, or `auto` = one single-threaded job per core on CPU; on a GPU None, for
    `gpu_jobs` to decide once the plan's widths are known.

    On CPU the cores are split into single-threaded jobs rather than given to one job:
    these small models gain less from a second thread than from a second job.
    """
    if jobs == "auto":
        return None if scale == "gpu" else max(1, os.cpu_count() or 1)
    if not jobs.isdigit() or int(jobs) < 1:
        raise ConfigError(f"JOBS={jobs} must be a positive number or auto")
    return int(jobs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m critbatch.sweep",
        description="Run an experiment's sweeps, the noise measurement and the report.",
    )
    parser.add_argument("experiment", choices=[*sorted(EXPERIMENTS), "report"],
                        help="an experiment to run, or `report`: re-analyse every sweep "
                             "under runs/ without training")
    parser.add_argument("--scale", default="auto", help="auto | smoke | cpu | gpu (default auto)")
    parser.add_argument("--jobs", default="auto",
                        help="training jobs at once; auto: one per core on CPU, k per GPU on CUDA "
                             "(by width)")
    parser.add_argument("--opt", default="adamw,muon", help="optimizers, comma-separated")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (runs, tokens, estimated time, disk) and exit "
                             "without training")
    parser.add_argument("--tasks", default="auto",
                        help="with hydra/launcher=slurm (or submitit_local): array tasks the "
                             "runs are sharded into, each a worker pool on its node; auto: about "
                             f"{slurm.RUNS_PER_WORKER} runs per worker (one task on "
                             "submitit_local)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_intermixed_args(argv)
    if args.experiment == "report":
        with user_errors():
            raise SystemExit(1 if report_all() else 0)
    with user_errors():
        optimizers = [o for o in args.opt.split(",") if o]
        for name in optimizers:
            if name not in ("adamw", "muon"):
                raise ConfigError(f"OPT={args.opt}: '{name}' is not adamw or muon")
        if args.scale not in ("auto", "smoke", "cpu", "gpu"):
            raise ConfigError(f"SCALE={args.scale} is not one of auto, smoke, cpu, gpu")
        scale = resolve_scale(args.scale)
        check_cuda(scale, args.overrides)
        if args.tasks != "auto" and (not args.tasks.isdigit() or int(args.tasks) < 1):
            raise ConfigError(f"--tasks {args.tasks} must be a positive number or auto")
        failed = run_experiment(args.experiment, scale, parse_jobs(args.jobs, scale), optimizers,
                                args.overrides, args.dry_run,
                                None if args.tasks == "auto" else int(args.tasks))
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
