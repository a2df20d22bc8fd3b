"""What a run logs per step: metrics.jsonl rows (with the online noise scale) and W&B."""

from __future__ import annotations

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
    `branch` for a cooldown branch), its curves plotted against tokens."""
    import wandb  # slow to import: only when a run starts

    name = cfg.logger.name or (",".join(o for o in overrides if not o.startswith("hydra")) or
                               "defaults")
    run = wandb.init(
        id=run_id,
        resume="allow" if run_id else None,
        mode=cfg.logger.mode if main else "disabled",
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


def define_token_axis(run) -> None:
    """Every logged curve against `tokens` by default (not the step, which means something
    else at every batch size), so W&B's charts compare batch sizes with no manual edit."""
    run.define_metric("tokens")
    run.define_metric("*", step_metric="tokens")


def log_wandb_rows(wandb_run, rows: list[dict]) -> None:
    """Each metrics row at its step (W&B's x axis), nulls left out."""
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
