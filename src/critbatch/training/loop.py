"""One training run: `python -m critbatch.train [hydra overrides]` calls `train()`.

The step sequence -- lr, micro-steps, noise measurement, clipping, optimizer step, eval,
log -- reads top to bottom in `train()`. The step itself is `step.train_step` (the one the
benchmark times), the set-up `trainer.build_trainer`; each helper below does one thing
of the loop: log the buffered steps, evaluate, pick the next batch, save, summarise.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from critbatch.results import files, runs
from critbatch.results.errors import ResultsError
from critbatch.training import branches, checkpoint, local_cbs
from critbatch.training.config import Config, lr_batch_size
from critbatch.training.data import sample_batch, sample_chunks
from critbatch.training.distributed import launched_ranks, rank_share, shutdown
from critbatch.training.evaluation import (
    eval_tokens,
    evaluate,
    evaluate_per_sequence,
    is_diverged,
)
from critbatch.training.metrics import (
    SpeedClock,
    StepRecord,
    finishing,
    log_wandb_rows,
    metrics_rows,
    start_wandb,
)
from critbatch.training.optim import batch_lr_ratio
from critbatch.training.schedule import (
    constant_lr_reading_steps,
    lr_factor,
    lr_factor_by_tokens,
)
from critbatch.training.step import train_step
from critbatch.training.trainer import (
    Trainer,
    build_trainer,
    dtype_name,
    log_start,
    lr_words,
)

log = logging.getLogger("critbatch")


def train(cfg: Config, run_dir: Path, overrides: list[str] | None = None) -> dict:
    """Train one model as `cfg` says, write the run directory, and return summary.json's dict.

    The process holds the folder meanwhile (`checkpoint.sole_writer`; rank 0 under torchrun):
    a second one started on it stops with a one-line error."""
    if not launched_ranks().main:
        return _train(cfg, run_dir, overrides)
    with checkpoint.sole_writer(run_dir):
        return _train(cfg, run_dir, overrides)


def _train(cfg: Config, run_dir: Path, overrides: list[str] | None) -> dict:
    tr = build_trainer(cfg, run_dir, list(overrides or []))  # resumes a checkpoint if any
    t, seq_len, state, plan = cfg.train, cfg.model.seq_len, tr.state, tr.plan
    log_start(tr)
    if tr.ranks.main:
        files.write_json_atomic(run_dir / "config.json",
                                {"config": tr.resolved, "overrides": tr.overrides})
        runs.truncate_metrics(tr.metrics_path, state.step)  # rows after the checkpoint go
    wandb_run = start_wandb(cfg, tr.resolved, run_dir, tr.overrides, state.wandb_run_id,
                            tr.ranks.main, branch=state.branch_of is not None)
    state.wandb_run_id = wandb_run.id  # a resumed run continues this W&B run
    saver = checkpoint.Every(t.checkpoint_every_steps, t.checkpoint_every_minutes, state.step)
    forks: dict[int, list[branches.Branch]] = {}  # step -> the branches forked after it
    for b in branches.plan_branches(cfg, run_dir, tr.overrides):
        if b.fork_step > state.step and tr.ranks.main:
            forks.setdefault(b.fork_step, []).append(b)
    eval_at = [x for x in eval_tokens(plan.budget, plan.start * seq_len, t.eval_points)
               if x > state.tokens]
    read_at = set(constant_lr_reading_steps(tr.steps, t) if tr.gns_on and tr.steps else [])
    pending: list[StepRecord] = []  # steps not logged yet
    heartbeat = Heartbeat(tr.steps, plan.budget, state.tokens)
    t0 = time.perf_counter() - state.elapsed_s
    speed = SpeedClock(t0, state.step, state.elapsed_s)  # tokens/s without the warm-up
    # a scheduled batch's last known batch: a change at a resume (a local-CBS branch's switch
    # at its fork) is recorded like any other
    known = state.batch_changes[-1]["batch_size"] if state.batch_changes else plan.start
    batch_size = next_batch(tr, known) if state.status == "completed" else 0
    with finishing(wandb_run), logging_redirect_tqdm():
        with progress_bar(tr) as bar:
            while batch_size:  # 0 once the budget is spent or the run diverged
                factor = lr_factor_at(tr, batch_size)
                batch = draw_batch(tr, batch_size)
                batch = rank_share(batch, tr.ranks).to(tr.device, non_blocking=True)  # (B, T+1)
                result = train_step(tr.stepper, batch, factor)
                state.step, state.tokens = state.step + 1, state.tokens + batch_size * seq_len
                pending.append(StepRecord(state.step, state.tokens, batch_size, factor * tr.lr,
                                          time.perf_counter() - t0, result))
                speed.tick(state.step, state.tokens, tr.device)
                bar.update(1 if tr.steps else batch_size * seq_len)

                last = plan.is_last(state.tokens)
                eval_now = last or (eval_at and state.tokens >= eval_at[0])
                save_now = tr.ranks.main and not last and saver.due(state.step)  # after a flush
                forked = forks.get(state.step, [])
                read_now = state.step in read_at
                if (save_now or eval_now or last or forked or read_now
                        or state.step % t.log_every == 0 or plan.decides(state.step)):
                    log_steps(tr, wandb_run, pending)  # metrics, B_noise, divergence
                    pending.clear()
                    bar.set_postfix(train_loss=f"{state.losses[-1]:.3f}")
                    heartbeat.tick(state, bar.disable)
                if forked and state.status == "completed":
                    branches.fork(forked, tr.stepper.model, tr.stepper.optimizers, tr.gns, state,
                                  run_dir)
                if eval_now and state.status == "completed":
                    eval_at = [x for x in eval_at if x > state.tokens]
                    evaluate_and_log(tr, wandb_run, factor * tr.lr, batch_size)
                if read_now and state.status == "completed":
                    noise_reading(tr, wandb_run, factor * tr.lr)
                if state.status == "diverged":
                    break
                batch_size = next_batch(tr, batch_size)
                if save_now:
                    save_checkpoint(tr, saver, time.perf_counter() - t0)

        wall_time = time.perf_counter() - t0
        if tr.ranks.main:  # the final checkpoint: the weights other programs read, and the state
            save_checkpoint(tr, saver, wall_time)
        if tr.ranks.main and t.batch_schedule == "switch" and state.status == "completed":
            write_val_sequences(tr)  # before summary.json: a finished run has both
        summary = summarize(tr, wall_time, saver, wandb_run.id, speed)
        if tr.ranks.main:
            files.write_json_atomic(run_dir / "summary.json", summary)
        wandb_run.summary.update(
            {k: v for k, v in summary.items() if isinstance(v, int | float | str)}
        )
    shutdown(tr.ranks)
    log.info(
        f"{state.status}: val_loss {summary['val_loss']:.4f} nats/token "
        f"({summary['val_loss_per_byte']:.4f} nats/byte) after {state.tokens / 1e6:.3f}M "
        f"tokens in {wall_time:.1f}s ({summary['tokens_per_s']:,.0f} tokens/s after a "
        f"{summary['warmup_s']:.1f}s warm-up); "
        f"{lr_words(tr.cfg, summary['lr'], tr.cfg.train.batch_size)}; {run_dir}"
    )
    return summary


def train_with_branches(cfg: Config, run_dir: Path, overrides: list[str] | None = None,
                        skip_finished: bool = True) -> list[dict]:
    """Train the run in `run_dir` (unless it finished and `skip_finished`), then its cooldown
    and local-CBS branches that are not finished (training/branches.py), one after the other,
    then delete the checkpoints `train.keep_checkpoint` does not keep (`branches.retire`: only
    when something was trained here); returns the summaries trained here."""
    overrides = list(overrides or [])
    summaries = []
    if not (skip_finished and (run_dir / "summary.json").exists()):
        summaries.append(train(cfg, run_dir, overrides))
    for branch in branches.pending(cfg, run_dir, overrides):
        if not (branch.run_dir / "checkpoint.pt").exists():
            verb = "cool down" if branch.what == "cooldown branch" else "branch"
            raise ResultsError(
                f"{branch.run_dir} has no checkpoint to {verb} from (the run finished "
                f"without forking it, or the folder was removed); delete {run_dir} to train "
                "the run and its branches again")
        log.info(f"{branch.what} to {branch.tokens / 1e6:.3f}M tokens, from step "
                 f"{branch.fork_step} of {run_dir}")
        with branches.log_file(branch.run_dir / "train.log"):
            summaries.append(train(branch.cfg, branch.run_dir, branch.overrides))
    gone = branches.retire(cfg, run_dir, overrides) if summaries and launched_ranks().main else []
    if gone:
        log.info(f"train.keep_checkpoint={cfg.train.keep_checkpoint}: deleted {len(gone)} "
                 f"checkpoint(s) under {run_dir}, no longer needed")
    return summaries


class Heartbeat:
    """Without a terminal (SLURM, nohup, a sweep worker) there is no progress bar: a log line
    every HEARTBEAT_S seconds says where the run is instead."""

    HEARTBEAT_S = 60.0

    def __init__(self, steps: int | None, budget: int, tokens: int) -> None:
        self.steps, self.budget = steps, budget
        self.start_tokens, self.start = tokens, time.perf_counter()
        self.last = self.start

    def tick(self, state: checkpoint.TrainState, quiet_bar: bool) -> None:
        now = time.perf_counter()
        if not quiet_bar or now - self.last < self.HEARTBEAT_S:
            return
        self.last = now
        rate = (state.tokens - self.start_tokens) / max(1e-9, now - self.start)
        left_s = (self.budget - state.tokens) / rate if rate > 0 else float("nan")
        log.info(f"step:{state.step}/{self.steps or '?'} tokens:{state.tokens / 1e6:.3f}M "
                 f"({state.tokens / self.budget:.0%}) train_loss:{state.losses[-1]:.4f} "
                 f"{rate:,.0f} tokens/s, about {left_s / 60:.1f} min left")


def progress_bar(tr: Trainer) -> tqdm:
    """Steps, or tokens when the step count is not known ahead (a scheduled batch)."""
    return tqdm(total=tr.steps or tr.plan.budget,
                initial=tr.state.step if tr.steps else tr.state.tokens, desc="train",
                unit="step" if tr.steps else "tok", unit_scale=not tr.steps,
                disable=None if tr.ranks.main else True)


def draw_batch(tr: Trainer, batch_size: int) -> torch.Tensor:
    """The next step's batch, (batch_size, T+1): drawn by (seed, step), or, with
    `train.data_chunk`, as chunks numbered by the sequences trained so far."""
    t, seq_len, state = tr.cfg.train, tr.cfg.model.seq_len, tr.state
    if t.data_chunk is None:
        return sample_batch(tr.data.train, seq_len, batch_size, t.seed, state.step)
    return sample_chunks(tr.data.train, seq_len, batch_size, t.seed, state.tokens // seq_len,
                         t.data_chunk)


def lr_factor_at(tr: Trainer, batch_size: int) -> float:
    """The schedule's multiplier of the peak lr for the next step, of `batch_size` sequences.

    A scheduled batch decays by the tokens through this step, and its lr follows the batch
    by `optim.lr_scaling` (the optimizers were built for `config.lr_batch_size`).
    """
    t, state = tr.cfg.train, tr.state
    if not tr.scheduled:
        return lr_factor(state.step, tr.steps, t)
    tokens_after = state.tokens + batch_size * tr.cfg.model.seq_len
    factor = lr_factor_by_tokens(state.step, tokens_after, tr.plan.budget, t)
    return factor * batch_lr_ratio(tr.cfg.optim, batch_size, lr_batch_size(tr.cfg))


def log_steps(tr: Trainer, wandb_run, records: list[StepRecord]) -> None:
    """Log the buffered steps (metrics.jsonl on rank 0, W&B), fold them into B_noise and the
    train losses, and mark the run diverged when the divergence rule says so."""
    t, state = tr.cfg.train, tr.state
    rows = metrics_rows(records, tr.gns if tr.gns_on else None, tr.ranks.parallel)
    if tr.ranks.main:
        files.append_jsonl(tr.metrics_path, rows)
    log_wandb_rows(wandb_run, rows)
    state.losses.extend(row["train_loss"] for row in rows)
    reason = is_diverged(state.losses, state.losses[0], t.diverge_factor, t.diverge_window)
    if reason:
        state.status, state.status_reason, state.diverged_step = "diverged", reason, state.step
        log.warning(f"step:{state.step}/{tr.steps or '?'} diverged: {reason}; stopping")


def evaluate_and_log(tr: Trainer, wandb_run, lr: float, batch_size: int) -> None:
    """Evaluate on the validation windows; the point joins the curve, W&B and the log."""
    state, s = tr.state, tr.stepper
    clock = time.perf_counter()
    val_loss = evaluate(s.forward, tr.val, s.micro, tr.device, s.autocast)
    point = {
        "step": state.step,
        "tokens": state.tokens,
        "val_loss": val_loss,
        "val_loss_per_byte": val_loss / tr.data.bytes_per_token,
        "eval_time_s": time.perf_counter() - clock,
    }
    if tr.gns_on:
        point["b_noise"] = tr.gns.b_noise  # sequences; None until resolved
    state.curve.append(point)
    wandb_run.log({k: point[k] for k in ("tokens", "val_loss", "val_loss_per_byte")},
                  step=state.step)
    log.info(
        f"step:{state.step}/{tr.steps or '?'} tokens:{state.tokens / 1e6:.3f}M "
        f"val_loss:{val_loss:.4f} val_loss_per_byte:{point['val_loss_per_byte']:.4f} "
        f"train_loss:{state.losses[-1]:.4f} lr:{lr:.3g}"
        + (f" batch:{batch_size}" if tr.scheduled else "")
    )


def noise_reading(tr: Trainer, wandb_run, lr: float) -> None:
    """The online noise tracker read at a peak-lr step (`constant_lr_reading_steps`), with
    the validation loss there (the eval point's, when one was just taken): B_noise(L) at a
    state no decaying lr has moved. Joins summary.json's `noise_readings` and W&B."""
    state = tr.state
    point = state.curve[-1] if state.curve and state.curve[-1]["step"] == state.step else None
    if point is None:
        s = tr.stepper
        val_loss = evaluate(s.forward, tr.val, s.micro, tr.device, s.autocast)
    else:
        val_loss = point["val_loss"]
    reading = {"step": state.step, "tokens": state.tokens, "lr": lr, "val_loss": val_loss,
               "b_noise": tr.gns.b_noise, "gns_g2": tr.gns.g2, "gns_trace": tr.gns.trace,
               "train_loss_ema": tr.gns.loss}
    state.noise_readings.append(reading)
    if (tr.cfg.train.gns.peak_checkpoint and tr.ranks.main and tr.steps
            and state.step == max(constant_lr_reading_steps(tr.steps, tr.cfg.train))):
        checkpoint.save(tr.checkpoint_path.with_name(branches.PEAK_CHECKPOINT), tr.stepper.model,
                        tr.stepper.optimizers, tr.resolved, tr.gns, state)
    b_noise = reading["b_noise"]
    wandb_run.log({"noise_reading/val_loss": val_loss}
                  | ({"noise_reading/b_noise": b_noise} if b_noise is not None else {}),
                  step=state.step)
    log.info(f"step:{state.step} online B_noise at the peak lr "
             + (f"{b_noise:,.0f} sequences" if b_noise is not None else "not resolved")
             + f" at val_loss {val_loss:.4f}")


def next_batch(tr: Trainer, previous: int) -> int:
    """The batch of the next step (0: the budget is spent); a scheduled batch's change is
    recorded in the state and logged."""
    state, b_noise = tr.state, tr.gns.b_noise
    batch_size = tr.plan.next(state.step, state.tokens, b_noise)
    if tr.scheduled and batch_size and batch_size != previous:
        state.batch_changes.append(
            {"step": state.step, "tokens": state.tokens, "batch_size": batch_size})
        log.info(f"step:{state.step} tokens:{state.tokens / 1e6:.3f}M batch {previous} -> "
                 f"{batch_size} sequences"
                 + (f" (B_noise {b_noise:.0f})" if b_noise is not None else ""))
    return batch_size


def write_val_sequences(tr: Trainer) -> None:
    """The run's loss on each validation window at its end (a local-CBS branch's output)."""
    s = tr.stepper
    losses = evaluate_per_sequence(s.forward, tr.val, s.micro, tr.device, s.autocast)
    local_cbs.write_val_sequences(tr.run_dir, losses, tr.cfg.model.seq_len, tr.state.tokens)


def save_checkpoint(tr: Trainer, saver: checkpoint.Every, elapsed_s: float) -> None:
    """Save the model, optimizers, noise tracker and state (atomically); count the save."""
    state = tr.state
    state.elapsed_s, state.batch_plan = elapsed_s, tr.plan.state()
    seconds = checkpoint.save(tr.checkpoint_path, tr.stepper.model, tr.stepper.optimizers,
                              tr.resolved, tr.gns, state)
    saver.record(state.step, seconds)


def summarize(tr: Trainer, wall_time_s: float, saver: checkpoint.Every,
              wandb_run_id: str | None, speed: SpeedClock) -> dict:
    """summary.json's dict (results/runs.py's format) from what the run holds; its
    tokens_per_s is the steady-state rate, the whole-run one is tokens_per_s_with_warmup
    (`SpeedClock`)."""
    state, cfg = tr.state, tr.cfg
    summary = runs.build_summary(
        tr.resolved, overrides=tr.overrides, status=state.status,
        status_reason=state.status_reason, diverged_step=state.diverged_step, steps=state.step,
        tokens=state.tokens, curve=state.curve, batch_size_start=tr.plan.start,
        batch_changes=state.batch_changes, resumed_at=state.resumed_at,
        lr=tr.lr * batch_lr_ratio(cfg.optim, cfg.train.batch_size, lr_batch_size(cfg)),
        micro_batch_size=tr.stepper.micro, params=tr.params,
        params_nonembedding=tr.params_nonembedding, bytes_per_token=tr.data.bytes_per_token,
        data_fingerprint=tr.data.fingerprint, wall_time_s=wall_time_s, device=str(tr.device),
        dtype=dtype_name(tr.dtype), compile=tr.compile, world_size=tr.ranks.world,
        backend=tr.ranks.backend,
        wandb_run_id=wandb_run_id, noise=tr.gns,
        gns_ema=tr.cfg.train.gns.ema if tr.gns_on else None, checkpoint_saves=saver.saves,
        branch_of=state.branch_of, branch_at_tokens=state.branch_at_tokens,
        checkpoint_time_s=saver.seconds, git_revision=runs.git_revision(),
        versions=runs.package_versions(),
    )
    speed_fields = speed.fields(wall_time_s, state.tokens, state.curve, summary["tokens_per_s"])
    return {**summary, **speed_fields, **state.branch_fields,
            "noise_readings": state.noise_readings,
            **tr.plan.summary_fields(cfg.train.measured.fits)}
