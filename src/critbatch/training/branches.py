"""Cooldown branches: one warmup-stable-decay run also yields the loss at smaller budgets.

A wsd run holds the peak lr until its cooldown (`schedule.wsd_decay_start`), and that start
never moves earlier as the budget grows, so a run of budget f x D is, step for step, the
prefix of the run of budget D up to its own cooldown. With `train.branch_budgets=[f, ...]`
the run of budget D saves its state at each such step into a branch folder,
`<run>/branches/tokens=<f x D>/checkpoint.pt`, written with the config of the run of
budget f x D. After the run ends, each branch resumes from that checkpoint as an ordinary
run and cools down to its budget: it is the separate run of that budget (same seed, same
batches), at the cost of its cooldown only. A branch's folder is a complete run folder
(config.json, metrics.jsonl from step 1, summary.json with its own `tokens` plus
`branch_of` and `branch_at_tokens`), so the analysis, W&B, skip-if-done and resume treat
it like any run.

The local-CBS branches of a constant-lr run (training/local_cbs.py) are planned here too and
fork the same way, several at one step; they also carry summary fields of their own
(`Branch.fields`, e.g. `local_cbs_multiplier`).

Crash safety comes from the checkpoints: a parent killed before a fork rewrites it when it
passes the fork again (the same bytes); a branch killed mid-cooldown resumes from its own
checkpoint; a finished parent whose branches are not all finished trains only those. Once the
run and all its branches are finished, `retire` deletes the checkpoints that
`train.keep_checkpoint` does not keep.
"""

from __future__ import annotations

import copy
import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from critbatch.results import files, runs
from critbatch.results.errors import ResultsError
from critbatch.results.runs import BRANCHES_DIR
from critbatch.training import local_cbs
from critbatch.training.config import Config, plain, token_budget, total_steps
from critbatch.training.schedule import wsd_decay_start

if TYPE_CHECKING:
    from critbatch.training.checkpoint import TrainState

log = logging.getLogger("critbatch")

BRANCH_OVERRIDES = ("train.tokens=", "train.branch_budgets=")  # what a branch sets itself
CHECKPOINT = "checkpoint.pt"
PEAK_CHECKPOINT = "checkpoint_peak_lr.pt"  # train.gns.peak_checkpoint: the last peak-lr reading


@dataclass(frozen=True)
class Branch:
    """One branch of a run: its config and folder, and where it forks."""

    fraction: float  # of the parent's train.tokens (cooldown) or steps (local CBS)
    cfg: Config  # the branch's own config, without branches of its own
    run_dir: Path
    overrides: list[str]  # the parent's, with the branch's own settings
    fork_step: int  # optimizer steps the parent has taken when it forks (a cooldown branch's
    #                 first cooldown step)
    fork_tokens: int  # tokens the parent has trained when it forks
    what: str = "cooldown branch"  # for log lines and messages
    fields: dict = field(default_factory=dict)  # summary.json fields of its own

    @property
    def tokens(self) -> int:
        return token_budget(self.cfg)

    @property
    def done(self) -> bool:
        return (self.run_dir / "summary.json").exists()


def plan_branches(cfg: Config, run_dir: Path, overrides: list[str]) -> list[Branch]:
    """Every branch the run in `run_dir` forks: its cooldown branches (smallest first), then
    its local-CBS branches (by fork, then k)."""
    return cooldown_branches(cfg, run_dir, overrides) + [
        Branch(fraction=b.fraction, cfg=b.cfg, run_dir=run_dir / b.folder,
               overrides=b.overrides, fork_step=b.fork_step, fork_tokens=b.at_tokens,
               what=f"local-CBS branch {b.folder.removeprefix(runs.LOCAL_CBS_DIR + '/')}",
               fields=b.fields(run_dir))
        for b in local_cbs.plan(cfg, overrides)]


def cooldown_branches(cfg: Config, run_dir: Path, overrides: list[str]) -> list[Branch]:
    """The branches `cfg.train.branch_budgets` asks of the run in `run_dir`, smallest first."""
    branches = []
    for fraction in cfg.train.branch_budgets:
        sub = copy.deepcopy(cfg)
        sub.train.tokens = int(fraction * cfg.train.tokens)
        sub.train.branch_budgets = []
        own = [o for o in overrides if not o.startswith(BRANCH_OVERRIDES)]
        fork_step = wsd_decay_start(total_steps(sub), sub.train)
        branches.append(Branch(
            fraction=fraction, cfg=sub,
            run_dir=run_dir / BRANCHES_DIR / f"tokens={token_budget(sub)}",
            overrides=[*own, f"train.tokens={sub.train.tokens}", "train.branch_budgets=[]"],
            fork_step=fork_step,
            fork_tokens=fork_step * sub.train.batch_size * sub.model.seq_len))
    return branches


def fork(forked: list[Branch], model, optimizers: list, gns, state: TrainState,
         parent_dir: Path) -> None:
    """Save the parent's state now (after the branches' `fork_step` steps, metrics flushed)
    as each branch's checkpoint, with the branch's config and summary fields, and the
    parent's metrics rows so far as the start of its metrics.jsonl (read once for all of
    them). A finished branch is left alone."""
    from critbatch.training import checkpoint  # torch: the planner, which imports this
    # module, trains nothing

    todo = [b for b in forked if not b.done]
    if not todo:
        return
    rows = [r for r in runs.read_metrics(parent_dir) if r["step"] <= state.step]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    for branch in todo:
        assert (state.step, state.tokens) == (branch.fork_step, branch.fork_tokens), branch
        branch.run_dir.mkdir(parents=True, exist_ok=True)
        start = copy.deepcopy(state)
        start.wandb_run_id, start.elapsed_s, start.resumed_at = None, 0.0, []
        start.branch_of, start.branch_at_tokens = parent_dir.name, state.tokens
        start.branch_fields = dict(branch.fields)
        checkpoint.save(branch.run_dir / CHECKPOINT, model, optimizers, plain(branch.cfg),
                        gns, start)
        files.write_text_atomic(branch.run_dir / "metrics.jsonl", text)
        log.info(f"step:{state.step} tokens:{state.tokens / 1e6:.3f}M forked the "
                 f"{branch.what} to {branch.tokens / 1e6:.3f}M tokens -> {branch.run_dir}")


def pending(cfg: Config, run_dir: Path, overrides: list[str]) -> list[Branch]:
    """The run's branches that still have to be trained (none when the parent diverged
    before their fork: there is no state to branch from, as for the separate run)."""
    todo = [b for b in plan_branches(cfg, run_dir, overrides) if not b.done]
    summary = _summary_or_none(run_dir)
    if summary and summary["status"] == "diverged":
        todo = [b for b in todo if (b.run_dir / CHECKPOINT).exists()]
    return todo


def retire(cfg: Config, run_dir: Path, overrides: list[str]) -> list[Path]:
    """Delete the checkpoint.pt files `train.keep_checkpoint` does not keep, once the run in
    `run_dir` has its summary.json and none of its branches is pending (until then a killed
    run or branch resumes from them); return those deleted. `final`: the branches' (and the
    run's own when it is itself a branch, as a local-CBS branch trained alone is); `none`:
    the run's own too; `all`: none."""
    keep, summary = cfg.train.keep_checkpoint, _summary_or_none(run_dir)
    if keep == "all" or summary is None or pending(cfg, run_dir, overrides):
        return []
    doomed = [b.run_dir / CHECKPOINT for b in plan_branches(cfg, run_dir, overrides)]
    if keep == "none" or summary.get("branch_of"):
        doomed.append(run_dir / CHECKPOINT)
    gone = [path for path in doomed if path.exists()]
    for path in gone:
        path.unlink()
    return gone


@contextmanager
def log_file(path: Path):
    """Copy critbatch's log lines to `path` (a branch's own train.log) meanwhile."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(levelname)s] - %(message)s"))
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)
        handler.close()


def _summary_or_none(run_dir: Path) -> dict | None:
    try:
        return runs.read_summary(run_dir)
    except ResultsError:
        return None
