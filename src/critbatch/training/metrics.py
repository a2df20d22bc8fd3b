"""What a run logs per step -- metrics.jsonl rows (with the online noise scale) and W&B -- and
its speed figures (the steady-state tokens/s, without the warm-up)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from critbatch.science.noise import NoiseEMA
from critbatch.training.config import Config, wandb_group
from critbatch.training.step import StepResult


@dataclass
class StepRecord:
    """One optimizer step, buffered by the loop until the next flush (its tensors stay on the
    device, so a step costs no host sync)."""

    step: int  # optimizer steps taken, this one included
    tokens: int  # training tokens seen, this step's included
    batch_size: int  # sequences this step
    lr: float  # the lr used (peak x schedule factor)
    time_s: float  # wall seconds since the run started (resumes included)
    result: StepResult


def metrics_rows(records: list[StepRecord], gns: NoiseEMA | None, parallel: bool) -> list[dict]:
    """metrics.jsonl rows of the buffered steps, read from the device in one host sync.

    `gns` (None = off) folds in every step that had small batches to compare (>= 2
    micro-batches, or ranks under torchrun); its estimates join that step's row.
    """
    if not records:
        return []
    values = torch.stack([torch.stack([r.result.loss.float(), r.result.grad_norm.float(),
                                       r.result.small_grad_sq.float()])
                          for r in records]).tolist()
    rows = []
    for r, (loss, grad_norm, small_grad_sq) in zip(records, values, strict=True):
        row = {"step": r.step, "tokens": r.tokens, "batch_size": r.batch_size, "lr": r.lr,
               "train_loss": loss, "grad_norm": grad_norm, "time_s": r.time_s}
        if gns is not None and (parallel or r.result.accum >= 2):
            # |g_B|^2 is the pre-clipping norm of the accumulated gradient
            row.update(gns.update(small_grad_sq, grad_norm**2, loss, big=r.batch_size))
        rows.append(row)
    return rows


def start_wandb(cfg: Config, resolved: dict, run_dir: Path, overrides: list[str],
                run_id: str | None, main: bool, branch: bool = False):
    """The run's W&B run (offline unless logger.mode=online; disabled off rank 0); a resumed
    run continues the W&B run `run_id`. Tagged by optimizer, width, batch, scale (and
    `branch` for a cooldown branch), its curves plotted against tokens. Where nothing is
    logged (logger.mode=disabled, or off rank 0) a `NoRun`, without importing wandb."""
    if cfg.logger.mode == "disabled" or not main:
        return NoRun()
    import wandb  # slow to import: only when a run logs

    name = cfg.logger.name or (",".join(o for o in overrides if not o.startswith("hydra")) or
                               "defaults")
    run = wandb.init(
        id=run_id,
        resume="allow" if run_id else None,
        mode=cfg.logger.mode,
        project=cfg.logger.project,
        group=wandb_group(cfg),
        job_type=cfg.logger.job_type,
        name=name,
        dir=str(run_dir),
        config=resolved,
        tags=[cfg.optim.name, f"width{cfg.model.width}", f"batch{cfg.train.batch_size}",
              cfg.scale, *(["branch"] if branch else [])],
        settings=wandb.Settings(console="off", silent=True),
    )
    define_token_axis(run)
    return run


class NoRun:
    """The W&B run of a run that logs nowhere: every call does nothing. wandb's own disabled
    run does the same after importing wandb and starting, about 1 s of CPU per training
    process; the test suite and sweeps with logger.mode=disabled start hundreds."""

    id = None

    def __init__(self) -> None:
        self.summary: dict = {}

    def log(self, *args, **kwargs) -> None:
        pass

    def define_metric(self, *args, **kwargs) -> None:
        pass

    def finish(self, exit_code: int = 0) -> None:
        pass


def define_token_axis(run) -> None:
    """Every logged curve against `tokens` by default (not the step, which means something
    else at every batch size), so W&B's charts compare batch sizes with no manual edit."""
    run.define_metric("tokens")
    run.define_metric("*", step_metric="tokens")


def log_wandb_rows(wandb_run, rows: list[dict]) -> None:
    """Each metrics row at its step (W&B's x axis), nulls left out.

    Called once per flush of metrics.jsonl with the rows buffered since the last one (the
    loop's `log_steps`), never on the per-step path; a step's eval point, logged after the
    flush at the same step, joins that step's W&B row.
    """
    for row in rows:
        wandb_run.log({k: v for k, v in row.items() if k != "step" and v is not None},
                      step=row["step"])


@contextmanager
def finishing(wandb_run):
    """Finish the W&B run on the way out; after an error, marked failed and without the
    traceback that wandb's own `with` prints (the error itself becomes one line)."""
    try:
        yield wandb_run
    except BaseException:
        wandb_run.finish(exit_code=1)
        raise
    wandb_run.finish()


WARMUP_STEPS_EXCLUDED = 3  # a session's first optimizer steps, left out of tokens_per_s


def sync_device(device: torch.device) -> None:
    """Wait until the device has run the work queued on it (CUDA, MPS); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@dataclass
class SpeedClock:
    """summary.json's speed figures: tokens/s in steady state, and with the warm-up.

    A session (one process's share of a run: the whole run, what a resume trains, or a
    branch from its fork) spends its first optimizer steps on work done once: torch.compile's
    tracing and compilation, the allocator's first allocations, the first data reads. Its
    warm-up ends with its WARMUP_STEPS_EXCLUDED-th step, once the device has run it (one host
    sync), at time t_w on the run's clock (seconds, earlier sessions included, like
    metrics.jsonl's `time_s`), N_w training tokens in. With T the run's `wall_time_s`, t_0 the
    session's start on that clock, N the tokens at the end, and E the eval seconds (the
    curve's `eval_time_s`; an eval at step s follows step s's mark):

        tokens_per_s = (N - N_w) / (T - t_w - E[evals from step w on])
        warmup_s     = t_w - t_0 - E[evals before step w]

    so a resumed run's tokens_per_s and warmup_s are its last session's alone.
    `tokens_per_s_with_warmup` is the whole-run figure tokens_per_s was before (results.
    build_summary): every token since the start (a branch's since its fork) over all of
    `wall_time_s` less every eval, resumed sessions and their warm-ups included. Checkpoint
    saves and forks count as training time in both; a recompilation later in the run (a
    scheduled batch's new shape) stays in tokens_per_s. A session with no step after its
    warm-up has no steady rate: tokens_per_s is then the whole-run figure and warmup_s all the
    session's training seconds.
    """

    t0: float  # time.perf_counter() at the run's clock's zero
    start_step: int  # optimizer steps before this session
    start_s: float  # the session's start on the run's clock (the resumed elapsed_s)
    end_step: int | None = None  # the step that ended the warm-up (None: not reached)
    end_tokens: int = 0  # training tokens through it
    end_s: float = 0.0  # when it ended, on the run's clock

    def tick(self, step: int, tokens: int, device: torch.device) -> None:
        """After each optimizer step: the session's WARMUP_STEPS_EXCLUDED-th ends the warm-up."""
        if self.end_step is None and step == self.start_step + WARMUP_STEPS_EXCLUDED:
            sync_device(device)
            self.end_step, self.end_tokens = step, tokens
            self.end_s = time.perf_counter() - self.t0

    def fields(self, wall_time_s: float, tokens: int, curve: list[dict],
               with_warmup_tokens_per_s: float) -> dict:
        """tokens_per_s, tokens_per_s_with_warmup, warmup_s (the class's formulas)."""
        def eval_s(first: int, last: float) -> float:
            return sum(p["eval_time_s"] for p in curve if first <= p["step"] <= last)

        if self.end_step is None or tokens <= self.end_tokens:  # no steady step
            session_s = wall_time_s - self.start_s - eval_s(self.start_step + 1, float("inf"))
            return {"tokens_per_s": with_warmup_tokens_per_s,
                    "tokens_per_s_with_warmup": with_warmup_tokens_per_s,
                    "warmup_s": max(0.0, session_s)}
        steady_s = wall_time_s - self.end_s - eval_s(self.end_step, float("inf"))
        warmup_s = self.end_s - self.start_s - eval_s(self.start_step + 1, self.end_step - 1)
        return {"tokens_per_s": (tokens - self.end_tokens) / max(1e-9, steady_s),
                "tokens_per_s_with_warmup": with_warmup_tokens_per_s,
                "warmup_s": max(0.0, warmup_s)}
