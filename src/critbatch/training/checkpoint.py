"""Crash-safe checkpoints of a training run: save, refuse, restore.

`checkpoint.pt` in the run directory holds everything the loop in `train()` carries from
one step to the next, so a run killed at any moment and started again (same run
directory, no summary.json yet) continues as if it had never stopped:

- `model`, `config`, `step`: the weights, the resolved config that built them, and the
  optimizer steps taken (other programs, e.g. `python -m critbatch.noise`, read these);
- `optimizers`: the state_dict of every optimizer (AdamW moments, Muon momentum, lrs);
- `curve`, `losses`, `gns`, `status`, `status_reason`, `diverged_step`: the eval points so
  far, the train losses the divergence rule looks at, the `NoiseEMA` sums, the verdict;
- `tokens`, `batch_changes`, `batch_plan`: tokens seen, a scheduled batch's changes and
  its adaptive controller;
- `rng`: torch's CPU (and CUDA) generator states; `elapsed_s`: training time so far;
- `wandb_run_id`: the W&B run to continue (`wandb.init(id=..., resume="allow")`).

The data position needs no state: a step's batch is a pure function of (seed, step)
(`data.sample_batch`), and the lr schedule a pure function of the step.

Writes are atomic: the checkpoint goes to a temporary file in the same folder, is
fsynced, then renamed over `checkpoint.pt` (and the folder fsynced), so a kill or a full
disk during a save leaves the previous checkpoint intact.

Determinism: on CPU a resumed run ends with bitwise the same metrics and val_loss as an
uninterrupted one (tests/test_reliability.py). On CUDA it does not in general: cuBLAS
and the attention kernels may pick other algorithms or reduction orders after a restart
and with torch.compile, and bfloat16 autocast amplifies the differences, so a resumed
GPU run matches an uninterrupted one only to within run-to-run noise; we treat a final
val_loss within 1e-3 relative (about 0.003 nats at loss 3) as the same result there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from filelock import FileLock, Timeout

from critbatch.results.errors import CritbatchError
from critbatch.results.files import atomic_open
from critbatch.science.noise import NoiseEMA
from critbatch.training.saved_config import run_differences


class CheckpointError(CritbatchError):
    """A checkpoint cannot be written, read, or belongs to another config."""


class RunInUse(CheckpointError):
    """Another process is training in this run folder."""


LOCK_NAME, OWNER_NAME = ".lock", ".owner"


@contextmanager
def sole_writer(run_dir: Path) -> Iterator[None]:
    """Hold the run folder for this process while it trains: a second process (two sweeps in
    one checkout, a requeued job while the first still runs) gets RunInUse naming the holder,
    instead of both writing every step. The lock is the OS's (`filelock`), so a killed
    holder releases it and never blocks the rerun."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(run_dir / LOCK_NAME, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        owner = (run_dir / OWNER_NAME).read_text().strip() if (run_dir / OWNER_NAME).exists() \
            else "another process"
        raise RunInUse(f"{run_dir} is in use by {owner}; wait for it to finish or stop it, "
                       "then start this run again (it resumes)") from None
    try:
        (run_dir / OWNER_NAME).write_text(f"process {os.getpid()} on {os.uname().nodename} "
                                          f"since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        yield
    finally:
        (run_dir / OWNER_NAME).unlink(missing_ok=True)
        lock.release()


@dataclass
class TrainState:
    """What the training loop carries between steps besides the model and optimizers: one
    object per run, updated in place by the loop and written whole by `save`."""

    step: int = 0  # optimizer steps taken
    curve: list[dict] = field(default_factory=list)  # eval points so far
    losses: list[float] = field(default_factory=list)  # train loss per step (divergence rule)
    status: str = "completed"  # "completed" (so far) or "diverged"
    status_reason: str | None = None
    diverged_step: int | None = None
    elapsed_s: float = 0.0  # training wall time before this process started
    wandb_run_id: str | None = None
    resumed_at: list[int] = field(default_factory=list)  # steps this run was resumed from
    tokens: int = 0  # training tokens seen
    # a scheduled batch's changes, {step, tokens, batch_size}, and its controller's state
    batch_changes: list[dict] = field(default_factory=list)
    batch_plan: dict = field(default_factory=dict)
    # a cooldown branch's parent run folder and the tokens it forked at (training/branches.py)
    branch_of: str | None = None
    branch_at_tokens: int | None = None
    # what a local-CBS branch adds to its summary.json (local_cbs_of, ...; training/local_cbs.py)
    branch_fields: dict = field(default_factory=dict)
    # the online noise tracker read at peak-lr steps with a validation loss (`noise_reading`)
    noise_readings: list[dict] = field(default_factory=list)


def save(path: Path, model: torch.nn.Module, optimizers: list, cfg_dict: dict,
         gns: NoiseEMA, state: TrainState) -> float:
    """Write the checkpoint atomically (temp file, fsync, rename); return the seconds taken."""
    t0 = time.perf_counter()
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    payload = {
        "model": model.state_dict(),
        "config": cfg_dict,
        "optimizers": [opt.state_dict() for opt in optimizers],
        "gns": asdict(gns),
        "rng": rng,
        **asdict(state),
    }
    try:
        with atomic_open(path) as handle:
            torch.save(payload, handle)
    except OSError as err:
        raise CheckpointError(
            f"cannot write the checkpoint {path} ({err.strerror or err}) at step {state.step}; "
            "free disk space or fix the folder's permissions, then start the run again "
            "(it resumes from the previous checkpoint, which is intact)"
        ) from None
    return time.perf_counter() - t0


def load(path: Path, cfg_dict: dict) -> dict | None:
    """The checkpoint at `path` if it can resume a run of `cfg_dict`; None if there is none.

    Temporary files left by a writer killed mid-save are removed. Raises CheckpointError
    for a file that cannot be read, or that a different config
    wrote (naming the differing keys). A weights-only checkpoint of the old format (no
    optimizer state) cannot resume: None, and the run starts over.
    """
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # a writer killed mid-save
        stale.unlink(missing_ok=True)
    if not path.exists():
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        saved_cfg = ckpt["config"]
    except Exception as err:  # truncated, foreign or corrupt file
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise CheckpointError(f"{path} cannot be read ({first}); delete it to train the run "
                              "from the start") from None
    differing = run_differences(saved_cfg, cfg_dict)
    if differing:
        raise CheckpointError(
            f"{path} was written by a different config ({', '.join(differing)}); refusing to "
            "resume from it: start the run with the same config, or move the run directory "
            "away / choose another hydra.run.dir"
        )
    return ckpt if "optimizers" in ckpt else None


def restore(ckpt: dict, model: torch.nn.Module, optimizers: list, gns: NoiseEMA) -> TrainState:
    """Load a checkpoint's model, optimizer, noise-tracker and RNG state; return the rest."""
    model.load_state_dict(ckpt["model"])
    for opt, opt_state in zip(optimizers, ckpt["optimizers"], strict=True):
        opt.load_state_dict(opt_state)
    for key, value in ckpt["gns"].items():
        setattr(gns, key, value)
    torch.set_rng_state(ckpt["rng"]["cpu"])
    if "cuda" in ckpt["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
    # fields added after a checkpoint was written take their defaults
    state = TrainState(**{f.name: ckpt[f.name] for f in fields(TrainState) if f.name in ckpt})
    state.resumed_at.append(state.step)
    return state


class Every:
    """When to save: every `steps` optimizer steps or `minutes` of wall time, whichever
    comes first (either may be None = never)."""

    def __init__(self, steps: int | None, minutes: float | None, step: int = 0) -> None:
        self.steps, self.minutes = steps, minutes
        self.last_step, self.last_time = step, time.monotonic()
        self.saves, self.seconds = 0, 0.0  # checkpoints written and the time they took

    def due(self, step: int) -> bool:
        by_steps = self.steps is not None and step - self.last_step >= self.steps
        elapsed_s = time.monotonic() - self.last_time
        by_time = self.minutes is not None and elapsed_s >= 60 * self.minutes
        return by_steps or by_time

    def record(self, step: int, seconds: float) -> None:
        self.last_step, self.last_time = step, time.monotonic()
        self.saves += 1
        self.seconds += seconds
