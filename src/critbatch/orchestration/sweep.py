"""Run a whole experiment: its runs, the noise measurement, and the report.

`python -m critbatch.sweep batch --scale cpu --jobs 1 --opt adamw,muon` (what
`make sweep-batch` calls; likewise widths, stability, schedules and local_cbs) runs, in order:

1. the runs of the experiment's multiruns (`sweeps/<stage>.yaml`, one per optimizer), planned
   as Hydra would and trained on the sweep's workers (`pool`), or, with
   `hydra/launcher=slurm`, as SLURM array tasks of worker pools (`slurm`), skipping
   every run whose directory already holds a valid summary.json; a stage that carries a
   tuned lr gets the best lr of the tuning stage as `optim.lr`; in the batch and widths
   experiments the rounds of the lr search (`lr_search`) follow, each adding lrs where a
   cell's best lr lies on the edge of those tried;
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

This module runs those steps in order and is the command; the studies are defined in
`experiments`, their stages planned in `stages`, the plan printed with its estimate in
`estimate`, trained in `launch` and analysed in `reports`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from critbatch.orchestration import lr_search, slurm, workers
from critbatch.orchestration.estimate import job_seconds, print_plan
from critbatch.orchestration.experiments import EXPERIMENTS, Experiment
from critbatch.orchestration.launch import hydra_launcher, submitit_array, train_jobs
from critbatch.orchestration.planned import Job
from critbatch.orchestration.pool import gpu_jobs, job_threads
from critbatch.orchestration.reports import analyse_sweep, report_all
from critbatch.orchestration.stages import (
    check_finished,
    final_loss,
    missing_measurement,
    plan_experiment,
    replan_after_tuning,
    tuned_lr,
    unplanned_runs,
)
from critbatch.results import runs
from critbatch.results.errors import ConfigError, user_errors
from critbatch.training import branches as branching
from critbatch.training.config import KeepCheckpoint


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
    search = lr_search.extra_tokens(plan, exp.lr_search_stage)[:2] if exp.lr_search_stage \
        else (0.0, 0.0)
    seconds, estimated_s = print_plan(experiment, scale, plan, jobs_at_once, device, search,
                                      noise=bool(exp.noise_stage))
    if dry_run:
        if exp.tuning_stage and any(tuned_lr(plan, exp.tuning_stage, o) is None
                                    for o in optimizers):
            print(f"  {' and '.join(s for s in exp.stages if s != exp.tuning_stage)} wait for "
                  f"the best lr of {exp.tuning_stage}: estimated here at its grid's middle lr")
        if array is not None and (todo := [j for j in plan if not j.done]):
            for line in slurm.shard(todo, array, device, seconds)[1]:
                print(f"  SLURM array (submitit {array.cluster}) {line}")
        if exp.lr_search_stage:
            for line in lr_search.worst_case(plan, exp.lr_search_stage):
                print(f"  {line}")
        print("dry run: nothing trained, no noise measured, no report written")
        return before
    problems, outcomes = [], []
    if exp.tuning_stage:
        outcomes += train_jobs([j for j in plan if j.stage == exp.tuning_stage], jobs_at_once,
                               device, seconds, array)
        plan, problems = replan_after_tuning(exp, scale, optimizers, extra, plan)
    outcomes += train_jobs(plan, jobs_at_once, device, seconds, array)
    searches = exp.lr_search_stage and lr_search.settings(plan, exp.lr_search_stage)
    if searches and (failed := [j for j in plan if not j.done]):
        # a failed run leaves a hole the search would fill with a near-duplicate of it
        problems.append(f"the lr search did not start: {len(failed)} run(s) of the grid "
                        "failed; rerun the sweep to train them (they resume from their "
                        "checkpoints), and the search follows")
        print(f"== lr search: not started, {len(failed)} run(s) of the grid failed; rerun the "
              "sweep to train them", flush=True)
    elif searches:
        def train_round(new: list[Job]) -> None:
            # a round whose runs a rerun finds trained times nothing (no worker, no torch)
            todo = [j for j in new if not j.done]
            timed = {} if not todo or hydra_launcher(todo) else job_seconds(
                todo, job_threads(jobs_at_once) if device == "cpu" else None)
            outcomes.extend(train_jobs(todo, jobs_at_once, device, timed, array))

        plan = lr_search.search(plan, exp.lr_search_stage, train_round,
                                after_round=lambda p: held.extend(hold_for_noise(exp, p)))
    failed = [j for j in plan if not j.done]
    problems += [f"run did not complete: {j.run_dir} ({j.failure or 'no reason recorded'}; "
                 "see its train.log)" for j in failed]
    if failed and exp.noise_stage:  # its run is the best of a grid not all in
        problems.append(f"the noise measurement did not start: {len(failed)} run(s) failed; "
                        "rerun the sweep to train them, and it follows")
    else:
        problems += measure_noise(exp, plan, optimizers, jobs_at_once, array)
    release_after_noise(held)

    notes = [f"{folder} holds {len(extra_runs)} finished run(s) outside this plan (e.g. "
             f"{extra_runs[0].name}); the report reads every run in the folder"
             for folder, extra_runs in unplanned_runs(
                 [j for j in plan if j.stage != exp.tuning_stage]).items()]  # its own folders
    report_dir = Path("runs") / exp.report_stage / scale / "report"
    sweep_dirs = sorted({str(j.run_dir.parent) for j in plan if j.run_dir.parent.exists()})
    modes = {str(j.cfg.logger.mode) for j in plan}
    if not analyse_sweep(exp, sweep_dirs, report_dir, "analysis",
                         wandb_mode=modes.pop() if len(modes) == 1 else None):
        problems.append("the analysis failed (its message is above)")
    wall_s = time.perf_counter() - t0
    print(f"\nsweep-{experiment} scale={scale}: {len(plan) - len(failed)}/{len(plan)} runs "
          f"complete in {wall_s / 60:.1f} min"
          + (f" (estimated {estimated_s / 60:.1f} min before it began)" if estimated_s else ""))
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


def measure_noise(exp: Experiment, plan: list[Job], optimizers: list[str],
                  jobs_at_once: int, array: slurm.Array | None = None) -> list[str]:
    """The noise program (`python -m critbatch.noise`) on each optimizer's noise target, side
    by side (output in the run's noise.log): here in workers forked from the training
    workers' server, or as tasks of an `array`; returns the problems."""
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
    else:  # forked from the workers' server, where torch is imported already
        threads = job_threads(min(jobs_at_once, len(optimizers)))
        context, started = workers.worker_context(), []
        for target in targets:
            started.append(context.Process(target=workers.main_logged, args=(
                "critbatch.noise", slurm.noise_args(target.run_dir),
                str(target.run_dir / "noise.log"), threads)))
            started[-1].start()
        for proc in started:
            proc.join()
        succeeded = [proc.exitcode == 0 for proc in started]
    problems = []
    for target, ok in zip(targets, succeeded, strict=True):
        # the final checkpoint's B_noise stands where the peak-lr one after it failed
        if not ok and not (target.run_dir / "noise.json").exists():
            problems.append(f"the noise measurement failed on {target.run_dir} (see its "
                            "noise.log)")
            continue
        noise = runs.read_noise(target.run_dir) or {}
        b = noise.get("b_noise_tokens")
        print(f"== noise (optim={target.optimizer}): B_noise "
              + (f"{b:,.0f} tokens" if b else "not resolved")
              + f" at val_loss {noise.get('val_loss', float('nan')):.4f} nats/token")
        if (target.run_dir / branching.PEAK_CHECKPOINT).exists():  # measured there too
            problems += noise_at_peak_lr(target)
    return problems


def noise_at_peak_lr(target: Job) -> list[str]:
    """What the noise program read at the run's peak-lr checkpoint
    (`train.gns.peak_checkpoint`), beside the online tracker's reading there
    (noise_peak_lr.json); returns the problems."""
    if not (target.run_dir / "noise_peak_lr.json").exists():
        return [f"the noise measurement at the peak lr failed on {target.run_dir} (see its "
                "noise.log)"]
    doc = json.loads((target.run_dir / "noise_peak_lr.json").read_text())
    print(f"== noise (optim={target.optimizer}) at the peak lr, step {doc['step']:,}: the "
          f"program {fmt_or_dash(doc['b_noise'])}, the online tracker "
          f"{fmt_or_dash(doc.get('online_b_noise'))} sequences"
          + {True: " (68% intervals overlap)", False: " (68% intervals do NOT overlap)",
             None: ""}[doc.get("tracker_agrees")])
    return []


def fmt_or_dash(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


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
