"""Local critical batch by branched training: the branches of a base run, and their output.

Merrill et al. 2025 ("Critical Batch Size Revisited", arXiv 2505.23971, section 3.1): at
checkpoints of a run at batch B, branches at k B (k = 1, 2, 4, ...) train the same window of
tokens with the lr scaled by the optimizer's rule; the local critical batch is the largest k B
whose loss is not worse than a smaller branch's (science/local_cbs.py decides it).

A constant-batch, constant-lr run with `train.local_cbs.at_fractions` forks at each fraction
f of its steps (`fork_steps`, t = f x steps x B x T tokens) one branch per multiplier k and,
per replicate seed, every k again (`replicate_ladder`, the default) or k = 1 only, as
cooldown branches fork (training/branches.py): the base saves its state into
`<base>/local_cbs/tokens=<t>/k=<k>/` (and `k=<k>,seed=<s>/`) with the branch's config, and
after the base each branch resumes there as an ordinary run. A branch's
config (`branch_config`) is the base's with

- `train.batch_schedule=switch`: batch B up to t tokens (the base's prefix, which it never
  trains itself), then k B; `train.tokens` = t + the window, so every branch ends on it;
- `train.data_chunk=B`: its step of k B is the k chunks of B sequences the base (and the
  k = 1 branch) would train in its next k steps, so every k sees the same sequences;
- the lr: the optimizers are built at B (the state resumed is the base's), and the switch
  rescales it to k B by `optim.lr_scaling`; the schedule stays constant, or with
  `local_cbs.cooldown_fraction` > 0 becomes wsd with the cooldown over that share of the
  window's end (`branch_cooldown`), so every k is compared annealed, not at its noise floor;
- a replicate: `train.seed=<s>`, which after the fork changes only the data order.

The window (`window_tokens`) is rounded down to whole steps of the largest branch, so every
k trains exactly the same tokens; a window that runs past the base's budget is trained all
the same (the branch ends after the base would have). At its end a switch run writes
`val_sequences.json` (`write_val_sequences`): its mean loss on each fixed validation window.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from critbatch.results import files
from critbatch.results.runs import LOCAL_CBS_DIR, VAL_SEQUENCES
from critbatch.training.config import Config, total_steps

# what a branch sets itself: the base's overrides of these keys are left out of its own
LOCAL_OVERRIDES = ("train.local_cbs.", "train.batch_schedule=", "train.batch_size=",
                   "train.batch_size_start=", "train.switch_at_tokens=", "train.tokens=",
                   "train.data_chunk=", "train.schedule=", "train.cooldown_fraction=",
                   "train.warmup_steps=", "train.warmup_tokens=")


@dataclass(frozen=True)
class LocalBranch:
    """One branch of a base run: where it forks, its k and seed, config and folder."""

    fraction: float  # of the base's steps
    fork_step: int  # base optimizer steps at the fork
    at_tokens: int  # base tokens at the fork
    multiplier: int  # k: the branch trains at k x the base batch
    seed: int | None  # a replicate's train.seed; None: the base's
    cfg: Config
    folder: str  # relative to the base run folder
    overrides: list[str]  # the base's, with the branch's own settings

    def fields(self, base_dir: Path) -> dict:
        """What the branch adds to its summary.json (the local-CBS folder contract)."""
        local = self.cfg.train
        return {"local_cbs_of": base_dir.name, "local_cbs_at_tokens": self.at_tokens,
                "local_cbs_multiplier": self.multiplier,
                "local_cbs_window_tokens": local.tokens - self.at_tokens,
                "base_batch_size": local.batch_size_start}


def window_tokens(cfg: Config) -> int:
    """The window every branch trains: `window_tokens` rounded down to whole steps of the
    largest branch (validated to be at least one)."""
    t = cfg.train
    largest = t.local_cbs.multipliers[-1] * t.batch_size * cfg.model.seq_len
    return t.local_cbs.window_tokens // largest * largest


def fork_steps(cfg: Config) -> list[int]:
    """The base optimizer steps at which it forks: each fraction of its steps, rounded down."""
    steps = total_steps(cfg)
    return [int(f * steps) for f in cfg.train.local_cbs.at_fractions]


def branch_config(cfg: Config, at_tokens: int, multiplier: int, seed: int | None) -> Config:
    """The base's config as a branch at `multiplier` x its batch from `at_tokens` (docstring)."""
    t = cfg.train
    sub = copy.deepcopy(cfg)
    s = sub.train
    s.local_cbs.at_fractions = []
    s.batch_schedule, s.batch_size_start = "switch", t.batch_size
    s.batch_size, s.switch_at_tokens = multiplier * t.batch_size, at_tokens
    s.tokens, s.data_chunk = at_tokens + window_tokens(cfg), t.batch_size
    # the base's warmup as resolved (a token floor belongs to a constant batch): a branch
    # forks after it and would not re-resolve it at its own batch
    s.warmup_steps, s.warmup_tokens = t.warmup_steps, None
    if t.local_cbs.cooldown_fraction:
        s.schedule, s.cooldown_fraction = "wsd", branch_cooldown(cfg, at_tokens)
    if seed is not None:
        s.seed = seed
    return sub


def branch_cooldown(cfg: Config, at_tokens: int) -> float:
    """A branch's `train.cooldown_fraction` (of its whole budget, the base's prefix included)
    that decays its lr over the last `local_cbs.cooldown_fraction` of its window."""
    window = window_tokens(cfg)
    return cfg.train.local_cbs.cooldown_fraction * window / (at_tokens + window)


def plan(cfg: Config, overrides: list[str]) -> list[LocalBranch]:
    """The branches `cfg.train.local_cbs` asks of a base run, by fork then k, replicates
    last at each fork (by seed, then k); none when `at_fractions` is empty."""
    t = cfg.train
    own = [o for o in overrides if not o.startswith(LOCAL_OVERRIDES)]
    planned = []
    for fraction, step in zip(t.local_cbs.at_fractions, fork_steps(cfg), strict=True):
        at_tokens = step * t.batch_size * cfg.model.seq_len
        ks = t.local_cbs.multipliers
        repeated = ks if t.local_cbs.replicate_ladder else ks[:1]
        runs = [(k, None) for k in ks]
        runs += [(k, s) for s in t.local_cbs.replicate_seeds for k in repeated]
        for k, seed in runs:
            sub = branch_config(cfg, at_tokens, k, seed)
            s = sub.train
            mine = ["train.batch_schedule=switch", f"train.batch_size_start={t.batch_size}",
                    f"train.batch_size={s.batch_size}", f"train.switch_at_tokens={at_tokens}",
                    f"train.tokens={s.tokens}", f"train.data_chunk={t.batch_size}",
                    "train.local_cbs.at_fractions=[]", f"train.warmup_steps={t.warmup_steps}",
                    "train.warmup_tokens=null"]
            if t.local_cbs.cooldown_fraction:
                mine += ["train.schedule=wsd", f"train.cooldown_fraction={s.cooldown_fraction!r}"]
            keep, name = own, f"k={k}"
            if seed is not None:
                keep = [o for o in own if not o.startswith("train.seed=")]
                mine.append(f"train.seed={seed}")
                name += f",seed={seed}"
            planned.append(LocalBranch(
                fraction=fraction, fork_step=step, at_tokens=at_tokens, multiplier=k,
                seed=seed, cfg=sub, folder=f"{LOCAL_CBS_DIR}/tokens={at_tokens}/{name}",
                overrides=[*keep, *mine]))
    return planned


def write_val_sequences(run_dir: Path, losses: list[float], seq_len: int, tokens: int) -> None:
    """`val_sequences.json`: the run's mean loss (nats/token) on each fixed validation window
    (`data.val_windows`, the same windows in the same order for every run of the corpus,
    seq_len and train.eval_tokens), at `tokens` tokens trained."""
    files.write_json_atomic(run_dir / VAL_SEQUENCES, {
        "val_loss_per_sequence": [float(x) for x in losses], "seq_len": seq_len,
        "tokens": tokens})
