"""The config schema: typed dataclasses registered in Hydra's ConfigStore.

Every field is declared once, here, with its unit and meaning. YAML files in
`conf/` state only what differs. Units: batch sizes in sequences, budgets in
tokens, warmup in optimizer steps, losses in nats per token.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import asdict, dataclass, field, is_dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, errors

from critbatch.results.errors import ConfigError
from critbatch.results.runs import wandb_group_name
from critbatch.training.grid import GridConfig
from critbatch.training.measured import read_curve

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"

# The closed choices are StrEnums: Hydra/OmegaConf refuse any other value when composing (one
# line, `explain_compose_error`), and a member equals, prints and serialises as its string.


class Optimizer(StrEnum):
    adamw = "adamw"
    muon = "muon"


class LrScaling(StrEnum):
    none = "none"
    sqrt = "sqrt"
    linear = "linear"


class Beta2Scaling(StrEnum):
    none = "none"
    tokens = "tokens"


class Schedule(StrEnum):
    cosine = "cosine"
    linear = "linear"
    constant = "constant"
    wsd = "wsd"


class BatchSchedule(StrEnum):
    constant = "constant"
    ramp = "ramp"
    adaptive = "adaptive"
    switch = "switch"
    measured = "measured"


class DataName(StrEnum):
    stdlib = "stdlib"
    text_files = "text_files"
    tinystories = "tinystories"
    fineweb_edu = "fineweb_edu"
    hub = "hub"


class LoggerMode(StrEnum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


class Dtype(StrEnum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"


class KeepCheckpoint(StrEnum):
    all = "all"
    final = "final"
    none = "none"


MAX_VOCAB = 65535  # token ids are cached as uint16


@dataclass
class ModelConfig:
    width: int = 128  # d_model, channels of the residual stream
    depth: int = 4  # number of transformer blocks
    heads: int = 4  # attention heads; must divide width
    seq_len: int = 128  # context length in tokens
    init_std: float = 0.02  # std of the normal init of linear and embedding weights


@dataclass
class DataConfig:
    name: DataName = DataName.stdlib  # stdlib | text_files | tinystories | fineweb_edu | hub
    vocab_size: int = 2048  # byte-level BPE vocabulary, including <|endoftext|>
    cache_dir: str = "~/.cache/critbatch"  # tokenizer and token-id cache, shared by runs
    paths: list[str] = field(default_factory=list)  # text_files: glob patterns of UTF-8 files
    hf_path: str | None = None  # hub corpora: dataset id for datasets.load_dataset
    hf_name: str | None = None  # hub corpora: dataset config name (subset)
    hf_split: str = "train"  # hub corpora: split to stream
    # hub corpora: dataset revision (commit sha, tag or branch) to load; a pinned commit keeps
    # the corpus from changing under a sweep. Part of the token-cache key; null = main
    hf_revision: str | None = None
    hf_data_files: list[str] = field(default_factory=list)  # hub corpora: explicit data files
    text_field: str = "text"  # hub corpora: column that holds the document text
    max_documents: int | None = None  # hub corpora: stream at most this many documents
    val_fraction: float = 0.02  # share of documents (chosen by hash) held out for validation


@dataclass
class OptimConfig:
    name: Optimizer = Optimizer.adamw  # adamw | muon
    lr: float = 3e-3  # peak lr at base_batch_size (Muon: lr of the hidden matrices)
    weight_decay: float = 0.1  # decoupled decay on 2D hidden matrices only
    beta1: float = 0.9  # AdamW first-moment decay
    beta2: float = 0.95  # AdamW second-moment decay
    eps: float = 1e-8  # AdamW epsilon
    fused: bool | None = None  # AdamW fused kernel; null = on (faster on CPU and CUDA, make bench)
    momentum: float = 0.95  # Muon momentum (Nesterov)
    aux_lr: float = 3e-3  # Muon only: AdamW lr for embeddings and gains
    # Muon's Newton-Schulz precision: auto | float32 | bfloat16. auto = bfloat16 on CUDA (as
    # torch.optim.Muon and Jordan et al.), float32 elsewhere: a CPU without bf16 instructions
    # runs bf16 matmuls ~20x slower (2-vCPU AMD EPYC: 3.7 vs 0.18 ms for 64x256), which made
    # them half of a cpu-scale Muon step
    ns_dtype: Dtype = Dtype.auto
    # none | sqrt | linear: lr used = lr * f(batch_size / base_batch_size)
    lr_scaling: LrScaling = LrScaling.none
    # none | tokens: with tokens, `beta2` applies at base_batch_size and the beta2 used is
    # beta2^(batch_size / base_batch_size): the second moment's half-life stays the same
    # number of tokens at every batch (Marek et al. 2025). AdamW's, and Muon's AdamW for
    # embeddings and gains. A fixed beta2 0.95 cost batch 8 0.15 nats/token at cpu scale
    # (docs/results/cpu.md), enough to make it lose to batch 16.
    beta2_scaling: Beta2Scaling = Beta2Scaling.none
    base_batch_size: int = 32  # sequences; batch size at which `lr` is the lr used


@dataclass
class GNSConfig:
    """Online gradient noise scale (science.md section 2; estimator in science/noise.py)."""

    enabled: bool = True  # track B_noise from the micro-batches; needs >= 2 micro-batches a step
    # EMA decay per step of |G|^2, tr(Sigma) and the loss; 0.95 = a horizon of ~20 steps.
    # Shorter is noisier (one step's |G|^2 is mostly sampling noise); longer is biased on short
    # runs (|G|^2 is many times larger early on: a long memory keeps B_noise far below today's).
    ema: float = 0.95


@dataclass
class AdaptiveBatchConfig:
    """`train.batch_schedule=adaptive`: the batch follows the online B_noise (batching.py)."""

    interval_steps: int = 50  # the batch is decided after every this many optimizer steps
    noise_factor: float = 1.0  # target batch = noise_factor x B_noise (McCandlish: B ~ B_noise)


@dataclass
class MeasuredBatchConfig:
    """`train.batch_schedule=measured`: the batch follows a measured local critical batch
    (a local-CBS report's curve, training/measured.py; batching.py)."""

    # a local-CBS report's fits.json (make sweep-local-cbs); a relative path is taken from the
    # working directory, like runs/. Read once at the start; the run keeps its own copy
    fits: str | None = None
    # the batch doubles while the curve's B_crit (sequences) at the tokens trained exceeds
    # factor x the batch: 2 keeps the batch at or below B_crit
    factor: float = 2.0


@dataclass
class LocalCbsConfig:
    """Local critical batch by branched training (Merrill et al. 2025; training/local_cbs.py).

    A constant-batch run (batch B) with `at_fractions` set forks, at each fraction of its
    budget, branches at k B for every multiplier k that train the same `window_tokens` on the
    same sequences (`train.data_chunk` = B), and the ladder again (or only k = 1) at each
    replicate seed; each branch is a run folder <run>/local_cbs/tokens=<t>/k=<k>[,seed=<s>]/.
    """

    at_fractions: list[float] = field(default_factory=list)  # of train.tokens; [] = no branches
    multipliers: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])  # k: 1, then doublings
    # tokens every branch trains after the fork, rounded down to whole steps of the largest k;
    # a window that runs past the base budget is trained anyway (the branch ends later)
    window_tokens: int = 163_840
    replicate_seeds: list[int] = field(default_factory=lambda: [1])  # train.seed of the repeats
    # share of the window, at its end, over which each branch's lr decays (wsd's 1-sqrt
    # cooldown to train.min_lr_ratio); 0 = a constant lr to the end (Merrill et al.'s protocol)
    cooldown_fraction: float = 0.0
    # true: every k again at each replicate seed, so a comparison is paired by data order and
    # its noise measured (science/local_cbs.py); false: k = 1 only (independent branches)
    replicate_ladder: bool = True


@dataclass
class TrainConfig:
    batch_size: int = 32  # sequences per optimizer step (ramp: the final batch; adaptive: the cap)
    # sequences per forward/backward; null = batch_size (constant) or batch_size_start (ramp;
    # adaptive: half of it, since B_noise needs >= 2 micro-batches a step; switch: see below)
    micro_batch_size: int | None = None
    # constant batch (switch: its first batch), micro_batch_size null: split each step into
    # this many micro-batches (>= 2 turns on the online B_noise, which needs two or more a step)
    micro_batches: int = 1
    tokens: int = 4_000_000  # token budget; steps = tokens // (batch_size * seq_len)
    steps: int | None = None  # optimizer steps; when set, tokens = steps x batch_size x seq_len
    # constant | ramp | adaptive | switch | measured. ramp: from batch_size_start to batch_size
    # over the first ramp_fraction of the tokens; adaptive: follows noise_factor x B_noise
    # within [batch_size_start, batch_size]; measured: from batch_size_start, doubled while
    # the measured local B_crit exceeds measured.factor x it, up to batch_size. All three change
    # the batch in powers of two of the micro-batch (accumulation, so memory stays flat) and
    # rescale the lr by optim.lr_scaling.
    # switch: batch_size_start until switch_at_tokens, then batch_size (a local-CBS branch)
    batch_schedule: BatchSchedule = BatchSchedule.constant
    batch_size_start: int | None = None  # ramp/adaptive/switch: the first batch, sequences
    # switch: tokens after which batch_size_start becomes batch_size (a whole number of first
    # steps); the optimizers are built for batch_size_start, the lr follows optim.lr_scaling
    switch_at_tokens: int | None = None
    # sequences per data chunk; null = a step's batch is sample_batch(seed, step). Set: a step
    # of batch M (a multiple of it) is M / data_chunk chunks, chunk i drawn by (seed, c0 + i),
    # c0 = sequences trained so far / data_chunk: the same sequences whatever the batch
    data_chunk: int | None = None
    ramp_fraction: float = 0.25  # ramp: share of the token budget over which the batch grows
    adaptive: AdaptiveBatchConfig = field(default_factory=AdaptiveBatchConfig)
    measured: MeasuredBatchConfig = field(default_factory=MeasuredBatchConfig)
    warmup_steps: int = 50  # optimizer steps of linear warmup (raised by warmup_tokens only)
    # set: the warmup also lasts at least this many tokens; warmup_steps becomes
    # max(warmup_steps, ceil(warmup_tokens / (batch_size x seq_len))) when the config is
    # resolved: a floor in tokens for small batches, in steps for large ones
    warmup_tokens: int | None = None
    schedule: Schedule = Schedule.cosine  # cosine | linear | constant | wsd (warmup-stable-decay)
    min_lr_ratio: float = 0.1  # final lr as a fraction of the peak
    # wsd only: share of the steps spent in the cooldown, a 1-sqrt decay from the peak to
    # min_lr_ratio (Hagele et al. 2024: 1-sqrt beats a linear cooldown; 20% matches cosine)
    cooldown_fraction: float = 0.2
    # wsd only: fractions of the budget (e.g. [0.125,0.25,0.5]) at which this run also yields
    # a loss: at (1 - cooldown_fraction) x each one the state forks into a branch run folder
    # (<run>/branches/tokens=N) that cools down to that budget (training/branches.py)
    branch_budgets: list[float] = field(default_factory=list)
    local_cbs: LocalCbsConfig = field(default_factory=LocalCbsConfig)  # local-B_crit branches
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    seed: int = 0  # seeds the init and the batch sequence
    eval_points: int = 8  # evaluations, log-spaced in tokens, always including the end
    eval_tokens: int = 65_536  # validation tokens per evaluation (fixed windows)
    log_every: int = 10  # optimizer steps between flushes of metrics.jsonl
    device: str = "auto"  # auto | cpu | cuda | cuda:N; auto picks CUDA when present
    dtype: Dtype = Dtype.auto  # auto | float32 | bfloat16 (autocast); auto = bf16 on CUDA
    compile: bool | None = None  # torch.compile; null = on for CUDA, off on CPU
    compile_backend: str = "inductor"  # torch.compile's; eager, aot_eager: tracing only (tests)
    diverge_factor: float = 2.0  # a train loss above factor x its first value ...
    diverge_window: int = 20  # ... for this many consecutive steps means diverged
    # Resumable checkpoint (checkpoint.pt, training/checkpoint.py) every this many optimizer
    # steps or minutes of wall time, whichever comes first (null = never by that measure), and
    # at the end. A killed run loses at most one interval of work; a save (model and optimizer
    # state, a few MB at these sizes) takes far less than 10 minutes of training.
    checkpoint_every_steps: int | None = None  # optimizer steps
    checkpoint_every_minutes: float | None = 10.0  # minutes of wall time
    # all | final | none: the checkpoint.pt files left once a run and all its branches have
    # their summary.json (until then every one stays, so a killed run resumes). final: the
    # run's own, its final state (`python -m critbatch.noise` reads it), not its branches'.
    # none: not the run's either (a sweep keeps its noise program's run until it has read it)
    keep_checkpoint: KeepCheckpoint = KeepCheckpoint.final
    gns: GNSConfig = field(default_factory=GNSConfig)  # online gradient noise scale


@dataclass
class LoggerConfig:
    mode: LoggerMode = LoggerMode.offline  # offline | online | disabled (W&B)
    project: str = "critbatch"  # W&B project
    group: str | None = None  # W&B group; null = the sweep name, else "single"
    name: str | None = None  # W&B run name; null = built from the overrides
    job_type: str = "train"  # W&B job type


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    grid: GridConfig = field(default_factory=GridConfig)  # used by sweeps/ only
    scale: str = "cpu"  # name of the size preset in use (set by the preset file)
    sweep: str | None = None  # name of the sweep this run belongs to, or null


def plain(cfg: Config) -> dict:
    """The config as plain JSON types (enum members as their strings): what config.json, W&B
    and checkpoints hold (a checkpoint is read back with torch's weights-only loader)."""
    return json.loads(json.dumps(asdict(cfg)))


def register_configs() -> None:
    """Register the schema so `conf/config.yaml` can name it in its defaults list."""
    ConfigStore.instance().store(name="critbatch_schema", node=Config)


def micro_batch_size(cfg: Config) -> int:
    """Sequences per forward/backward (see `TrainConfig.micro_batch_size`)."""
    t = cfg.train
    if t.micro_batch_size:
        return t.micro_batch_size
    if t.batch_schedule == "constant" or not t.batch_size_start:
        return max(1, t.batch_size // max(1, t.micro_batches))
    if t.batch_schedule == "adaptive":
        return max(1, t.batch_size_start // 2)
    if t.batch_schedule == "switch":
        return max(1, t.batch_size_start // max(1, t.micro_batches))
    return t.batch_size_start


def lr_batch_size(cfg: Config) -> int:
    """The batch (sequences) the optimizers' peak lr is built for: `train.batch_size`, except
    for a switch run, built for its first batch so that its optimizer state before the switch
    is the base run's (a local-CBS branch resumes the base's checkpoint)."""
    t = cfg.train
    return t.batch_size_start if t.batch_schedule == "switch" else t.batch_size


def wandb_group(cfg: Config) -> str:
    """The W&B group of a run and of every job about it (noise measurement, ...)."""
    return wandb_group_name(cfg.logger.group, cfg.sweep)


def total_steps(cfg: Config) -> int:
    """Optimizer steps of a constant-batch run: `train.steps`, or the whole steps the token
    budget pays for. (A scheduled batch's step count is only known once trained.)"""
    if cfg.train.steps is not None:
        return cfg.train.steps
    return cfg.train.tokens // (cfg.train.batch_size * cfg.model.seq_len)


def token_budget(cfg: Config) -> int:
    """Tokens the run trains: steps x batch x seq_len (constant), else `train.tokens`."""
    if cfg.train.batch_schedule == "constant":
        return total_steps(cfg) * cfg.train.batch_size * cfg.model.seq_len
    return cfg.train.tokens


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


IDENTITY_EXEMPT = ("logger", "train.device", "train.compile", "train.compile_backend",
                   "train.log_every", "data.cache_dir", "train.checkpoint_every_steps",
                   "train.checkpoint_every_minutes", "train.keep_checkpoint")


def config_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two resolved configs (logging/device aside).

    A key missing from `old` is a field added to the schema after that run was made; it
    is not a difference (so finished runs stay valid when critbatch gains a setting).
    """
    keys = []
    for key in sorted(set(old) | set(new)):
        dotted = f"{prefix}{key}"
        if dotted in IDENTITY_EXEMPT or key not in old:
            continue
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += config_differences(a, b, f"{dotted}.")
        elif a != b:
            keys.append(dotted)
    return keys


RENAMED = {"wsd_decay_fraction": "cooldown_fraction"}  # train keys renamed since: old -> new


def renamed(saved: dict) -> dict:
    """A saved resolved config with the train keys renamed since (RENAMED) under their new
    names."""
    if "train" not in saved:
        return saved
    train = dict(saved["train"])
    for old, new in RENAMED.items():
        if old in train:
            train.setdefault(new, train.pop(old))
    return {**saved, "train": train}


def config_from_saved(saved: dict) -> Config:
    """The typed Config of a run's saved resolved config (config.json, a checkpoint), also
    when an older critbatch wrote it: renamed keys are mapped, retired keys dropped."""

    def known(values: dict, schema: Any) -> dict:
        out = {}
        for key, value in values.items():
            if not hasattr(schema, key):
                continue
            sub = getattr(schema, key)
            out[key] = known(value, sub) if isinstance(value, dict) and is_dataclass(sub) \
                else value
        return out

    merged = OmegaConf.merge(OmegaConf.structured(Config), known(renamed(saved), Config()))
    cfg = OmegaConf.to_object(merged)
    validate(cfg)
    return cfg


def run_differences(saved: dict, current: dict) -> list[str]:
    """Dotted keys in which a run's saved resolved config differs from `current` (both as
    dicts), leaving out the sweep grids (`grid`: only what a run trained with counts).
    Keys renamed since the run was saved (RENAMED) are compared under their new names."""
    saved = renamed(saved)
    return config_differences({k: v for k, v in saved.items() if k != "grid"},
                              {k: v for k, v in current.items() if k != "grid"})


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key}={value} must be positive")


def validate(cfg: Config) -> None:
    """Check the relations between fields that types alone cannot; raise ConfigError."""
    m, t, o, d = cfg.model, cfg.train, cfg.optim, cfg.data
    for key, value in [
        ("model.width", m.width), ("model.depth", m.depth), ("model.heads", m.heads),
        ("model.seq_len", m.seq_len), ("train.batch_size", t.batch_size),
        ("optim.lr", o.lr), ("optim.base_batch_size", o.base_batch_size),
        ("train.eval_points", t.eval_points), ("train.eval_tokens", t.eval_tokens),
        ("data.vocab_size", d.vocab_size), ("train.log_every", t.log_every),
    ]:
        _positive(key, value)
    if t.tokens <= 0:
        raise ConfigError(f"train.tokens={t.tokens} must be a positive token budget")
    if m.width % m.heads:
        raise ConfigError(
            f"model.heads={m.heads} does not divide model.width={m.width}; "
            f"choose heads among {[h for h in range(1, m.width + 1) if m.width % h == 0][:8]}"
        )
    _validate_batch_schedule(cfg)
    if not 0 <= o.beta2 < 1:
        raise ConfigError(f"optim.beta2={o.beta2} must lie in [0, 1) (e.g. 0.95)")
    if o.beta2_scaling == "tokens" and t.batch_schedule != "constant":
        raise ConfigError(
            f"optim.beta2_scaling=tokens with train.batch_schedule={t.batch_schedule}: beta2 "
            "is set once, for the first batch, and would not follow the schedule; set "
            "optim.beta2_scaling=none (and optim.beta2 for the run)")
    micro = micro_batch_size(cfg)
    if micro <= 0 or t.batch_size % micro:
        raise ConfigError(
            f"train.batch_size={t.batch_size} is not a multiple of "
            f"train.micro_batch_size={micro}; set a micro-batch size that divides it"
        )
    tokens_per_step = t.batch_size * m.seq_len
    if t.batch_schedule == "constant" and t.steps is None and t.tokens < tokens_per_step:
        raise ConfigError(
            f"train.tokens={t.tokens} is less than one step "
            f"(batch_size x seq_len = {tokens_per_step} tokens); raise train.tokens"
        )
    if d.vocab_size > MAX_VOCAB:
        raise ConfigError(
            f"data.vocab_size={d.vocab_size} exceeds {MAX_VOCAB} (token ids are stored as "
            "uint16); choose a smaller vocabulary"
        )
    if d.vocab_size < 260:
        raise ConfigError(
            f"data.vocab_size={d.vocab_size} is below the 256 byte tokens plus specials; "
            "use at least 260"
        )
    for key in ("checkpoint_every_steps", "checkpoint_every_minutes"):
        if getattr(t, key) is not None and not getattr(t, key) > 0:
            raise ConfigError(f"train.{key}={getattr(t, key)} must be positive (or null: never "
                              "by that measure)")
    if t.warmup_steps < 0:
        raise ConfigError(f"train.warmup_steps={t.warmup_steps} must be >= 0")
    if not 0 <= t.min_lr_ratio <= 1:
        raise ConfigError(f"train.min_lr_ratio={t.min_lr_ratio} must lie in [0, 1]")
    if not 0 < t.cooldown_fraction <= 1:
        raise ConfigError(f"train.cooldown_fraction={t.cooldown_fraction} must lie in (0, 1]")
    if t.micro_batches < 1:
        raise ConfigError(f"train.micro_batches={t.micro_batches} must be >= 1")
    _validate_branches(cfg)
    _validate_data_chunk(cfg)
    _validate_local_cbs(cfg)
    if not 0 <= t.gns.ema < 1:
        raise ConfigError(f"train.gns.ema={t.gns.ema} must lie in [0, 1) (e.g. 0.95)")
    if not 0 < d.val_fraction < 0.5:
        raise ConfigError(f"data.val_fraction={d.val_fraction} must lie in (0, 0.5)")
    if t.steps is not None and t.steps < 1:
        raise ConfigError(f"train.steps={t.steps} must be >= 1 (or null: from train.tokens)")
    if not (t.device in ("auto", "cpu") or t.device.startswith("cuda")):
        raise ConfigError(f"train.device={t.device} is not auto, cpu, cuda or cuda:N")
    if d.hf_revision is not None and not re.fullmatch(r"[\w.\-/]+", d.hf_revision):
        raise ConfigError(f"data.hf_revision={d.hf_revision!r} is not a commit sha, tag or branch "
                          "name; give one (e.g. data.hf_revision=main) or null")
    if d.name == "text_files" and not d.paths:
        raise ConfigError("data=text_files needs data.paths, e.g. data.paths='[corpus/*.txt]'")


def _validate_branches(cfg: Config) -> None:
    t = cfg.train
    if not t.branch_budgets:
        return
    fractions = list(t.branch_budgets)
    if t.schedule != "wsd":
        raise ConfigError(f"train.branch_budgets={fractions} needs train.schedule=wsd (a branch "
                          f"forks off the constant phase); {t.schedule} has none")
    if t.batch_schedule != "constant" or t.steps is not None:
        raise ConfigError("train.branch_budgets needs a constant batch and a token budget "
                          "(train.batch_schedule=constant, train.steps=null)")
    if any(not 0 < f < 1 for f in fractions) or sorted(set(fractions)) != fractions:
        raise ConfigError(f"train.branch_budgets={fractions} must be increasing fractions of "
                          "the budget in (0, 1), e.g. [0.125,0.25,0.5]")
    smallest = fractions[0] * t.tokens // (t.batch_size * cfg.model.seq_len)
    if smallest < 1:
        raise ConfigError(f"train.branch_budgets: {fractions[0]} of train.tokens={t.tokens} is "
                          "less than one step; raise train.tokens or the fraction")


def _validate_batch_schedule(cfg: Config) -> None:
    t = cfg.train
    if t.batch_schedule == "constant":
        return
    name = f"train.batch_schedule={t.batch_schedule}"
    if t.steps is not None:
        raise ConfigError(f"{name} takes a token budget (train.tokens), not train.steps; "
                          "set train.steps=null")
    if t.batch_size_start is None:
        raise ConfigError(f"{name} needs train.batch_size_start (the first batch, sequences)")
    start, end, micro = t.batch_size_start, t.batch_size, micro_batch_size(cfg)
    if not 0 < start <= end:
        raise ConfigError(f"train.batch_size_start={start} must lie in [1, train.batch_size={end}]")
    if t.batch_schedule == "switch":
        _validate_switch(cfg)
        return
    for key, value in (("train.batch_size_start", start), ("train.batch_size", end)):
        if value % micro or not is_power_of_two(value // micro):
            raise ConfigError(
                f"{key}={value} is not a power of two times train.micro_batch_size={micro}; "
                f"{name} changes the batch in doublings of the micro-batch"
            )
    if t.tokens < start * cfg.model.seq_len:
        raise ConfigError(f"train.tokens={t.tokens} is less than one step of "
                          f"train.batch_size_start={start}; raise train.tokens")
    if not 0 < t.ramp_fraction <= 1:
        raise ConfigError(f"train.ramp_fraction={t.ramp_fraction} must lie in (0, 1]")
    if t.batch_schedule == "adaptive":
        if not t.gns.enabled:
            raise ConfigError("train.batch_schedule=adaptive follows the online B_noise; "
                              "set train.gns.enabled=true")
        if start < 2 * micro:
            fix = (f"set train.micro_batch_size={start // 2}" if start >= 2 else
                   "raise train.batch_size_start to 2 or more")
            raise ConfigError(
                f"train.batch_schedule=adaptive measures B_noise from >= 2 micro-batches a step, "
                f"but train.batch_size_start={start} is one micro-batch of {micro}; {fix}"
            )
        if t.adaptive.interval_steps < 1:
            raise ConfigError(f"train.adaptive.interval_steps={t.adaptive.interval_steps} "
                              "must be >= 1")
        _positive("train.adaptive.noise_factor", t.adaptive.noise_factor)
    if t.batch_schedule == "measured":
        _positive("train.measured.factor", t.measured.factor)
        read_curve(t.measured.fits, cfg.optim.name, cfg.optim.lr_scaling, cfg.scale)


def _validate_switch(cfg: Config) -> None:
    t, micro = cfg.train, micro_batch_size(cfg)
    start, end, at = t.batch_size_start, t.batch_size, t.switch_at_tokens
    for key, value in (("train.batch_size_start", start), ("train.batch_size", end)):
        if value % micro:
            raise ConfigError(f"{key}={value} is not a multiple of train.micro_batch_size={micro}; "
                              "train.batch_schedule=switch accumulates whole micro-batches")
    if at is None or at < 0 or at % (start * cfg.model.seq_len):
        raise ConfigError(
            f"train.batch_schedule=switch needs train.switch_at_tokens (now {at}), a whole number "
            f"of first steps of {start} x {cfg.model.seq_len} tokens, e.g. "
            f"{10 * start * cfg.model.seq_len}")
    if t.tokens < at + end * cfg.model.seq_len:
        raise ConfigError(f"train.tokens={t.tokens} leaves no step of train.batch_size={end} after "
                          f"train.switch_at_tokens={at}; raise train.tokens")


def _validate_data_chunk(cfg: Config) -> None:
    t, chunk = cfg.train, cfg.train.data_chunk
    if chunk is None:
        return
    if chunk < 1:
        raise ConfigError(f"train.data_chunk={chunk} must be >= 1 sequence (or null)")
    if t.batch_schedule in ("ramp", "adaptive", "measured") and micro_batch_size(cfg) % chunk:
        raise ConfigError(f"train.data_chunk={chunk} must divide the micro-batch "
                          f"({micro_batch_size(cfg)}) of train.batch_schedule={t.batch_schedule}, "
                          "whose batches are multiples of it")
    for key in ("batch_size", "batch_size_start") if t.batch_schedule == "switch" else (
            "batch_size",):
        if getattr(t, key) % chunk:
            raise ConfigError(f"train.{key}={getattr(t, key)} is not a multiple of "
                              f"train.data_chunk={chunk}; a step is a whole number of chunks")


def _validate_local_cbs(cfg: Config) -> None:
    t, local = cfg.train, cfg.train.local_cbs
    fractions, ks = list(local.at_fractions), list(local.multipliers)
    if not fractions:
        return
    if t.batch_schedule != "constant" or t.steps is not None or t.schedule != "constant":
        raise ConfigError("train.local_cbs.at_fractions needs a constant batch, a constant lr "
                          "and a token budget (train.batch_schedule=constant, "
                          "train.schedule=constant, train.steps=null): branches measure at the "
                          "run's lr")
    if t.branch_budgets:
        raise ConfigError("train.local_cbs.at_fractions and train.branch_budgets cannot both be "
                          "set (constant lr vs wsd); train them as two runs")
    if any(not 0 < f < 1 for f in fractions) or sorted(set(fractions)) != fractions:
        raise ConfigError(f"train.local_cbs.at_fractions={fractions} must be increasing fractions "
                          "of the budget in (0, 1), e.g. [0.03,0.06,0.12,0.25,0.5,0.8]")
    if not ks or ks[0] != 1 or any(b != 2 * a for a, b in zip(ks, ks[1:], strict=False)):
        raise ConfigError(f"train.local_cbs.multipliers={ks} must be ascending powers of two "
                          "starting at 1, e.g. [1,2,4,8,16]")
    if len(ks) < 2:
        raise ConfigError("train.local_cbs.multipliers=[1] has nothing to compare; add 2, 4, ...")
    if any(s == t.seed for s in local.replicate_seeds) or len(set(local.replicate_seeds)) != len(
            local.replicate_seeds):
        raise ConfigError(f"train.local_cbs.replicate_seeds={list(local.replicate_seeds)} must be "
                          f"distinct seeds other than train.seed={t.seed}")
    if not 0 <= local.cooldown_fraction <= 1:
        raise ConfigError(f"train.local_cbs.cooldown_fraction={local.cooldown_fraction} must lie "
                          "in [0, 1] (a share of the window; 0 = constant lr)")
    if t.data_chunk not in (None, t.batch_size):
        raise ConfigError(f"train.data_chunk={t.data_chunk}: local branches draw chunks of the "
                          f"base batch; set it to train.batch_size={t.batch_size} or null")
    largest = ks[-1] * t.batch_size * cfg.model.seq_len  # tokens of the largest branch's step
    if local.window_tokens < largest:
        raise ConfigError(f"train.local_cbs.window_tokens={local.window_tokens} is less than one "
                          f"step of the largest branch ({ks[-1]} x {t.batch_size} x "
                          f"{cfg.model.seq_len} = {largest} tokens); raise it")
    step_tokens = t.batch_size * cfg.model.seq_len
    first = int(fractions[0] * total_steps(cfg))
    if first < max(1, t.warmup_steps):
        raise ConfigError(f"train.local_cbs.at_fractions: the first fork, {fractions[0]} of the "
                          f"budget, is at step {first}, inside the {t.warmup_steps}-step warmup; "
                          f"the branches measure at the peak lr: raise the fraction or "
                          f"train.tokens (now {t.tokens}, {step_tokens} tokens a step)")
    steps = [int(f * total_steps(cfg)) for f in fractions]
    if len(set(steps)) != len(steps):
        raise ConfigError(f"train.local_cbs.at_fractions={fractions} give the same fork step "
                          f"twice (of {total_steps(cfg)} steps); spread them or raise train.tokens")


def to_config(cfg: DictConfig) -> Config:
    """Resolve a composed DictConfig into the typed `Config` and validate it."""
    extra = _extra_keys(OmegaConf.to_container(cfg), Config())
    if extra:
        raise ConfigError(_unknown_key_message(extra[0]))
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, Config):  # composed without the schema (should not happen)
        raise ConfigError("config is missing the critbatch schema; keep `critbatch_schema` "
                          "first in conf/config.yaml's defaults")
    resolve_warmup(obj)
    validate(obj)
    return obj


def resolve_warmup(cfg: Config) -> None:
    """Apply `train.warmup_tokens`, when set: `train.warmup_steps` becomes the larger of itself
    and the warmup tokens in this run's steps. A small batch then warms up over as many tokens
    as a larger one (a step warmup alone gives it fewer, and AdamW's high lrs need them), a
    large batch over at least warmup_steps steps (fewer made AdamW collapse at large batch,
    science.md section 3)."""
    t = cfg.train
    if t.warmup_tokens is None:
        return
    if t.warmup_tokens < 0:
        raise ConfigError(f"train.warmup_tokens={t.warmup_tokens} must be >= 0 (or null: "
                          "train.warmup_steps alone)")
    if t.batch_schedule != BatchSchedule.constant:
        raise ConfigError(f"train.warmup_tokens is for a constant batch; with "
                          f"train.batch_schedule={t.batch_schedule} set train.warmup_tokens=null "
                          "and the warmup in train.warmup_steps")
    step_tokens = t.batch_size * cfg.model.seq_len
    if step_tokens <= 0 or t.warmup_steps < 0:  # validate says what is wrong
        return
    t.warmup_steps = max(t.warmup_steps, math.ceil(t.warmup_tokens / step_tokens))


def _extra_keys(values: dict, schema: Any, prefix: str = "") -> list[str]:
    """Keys present in `values` but not declared in the dataclass `schema` (e.g. from `+key=`)."""
    extra = []
    for key, value in values.items():
        if not hasattr(schema, key):
            extra.append(prefix + key)
        elif isinstance(value, dict) and is_dataclass(getattr(schema, key)):
            extra += _extra_keys(value, getattr(schema, key), f"{prefix}{key}.")
    return extra


# ---------------------------------------------------------------------------
# Turning Hydra/OmegaConf exceptions into one-line messages.


def _valid_keys(node: Any) -> list[str]:
    if node is None:
        return []
    return [k for k in OmegaConf.to_container(OmegaConf.structured(node))]


def _unknown_key_message(full_key: str) -> str:
    parts = full_key.split(".")
    node: Any = Config()
    for part in parts[:-1]:
        node = getattr(node, part, None)
    keys = _valid_keys(node)
    hint = difflib.get_close_matches(parts[-1], keys, n=1)
    prefix = ".".join(parts[:-1])
    if hint:
        suggestion = f"{prefix}.{hint[0]}" if prefix else hint[0]
        return f"unknown config key '{full_key}'; did you mean '{suggestion}'?"
    where = f" in '{prefix}'" if prefix else ""
    return f"unknown config key '{full_key}'; valid keys{where}: {', '.join(keys)}"


def explain_compose_error(err: BaseException) -> str:
    """A one-line explanation of why Hydra could not compose the config."""
    chain: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for exc in chain:
        key = getattr(exc, "full_key", None)
        if isinstance(exc, errors.ConfigAttributeError | errors.ConfigKeyError) and key:
            return _unknown_key_message(key)
        if isinstance(exc, errors.ValidationError):
            first = str(exc).splitlines()[0]
            choice = re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", first)
            if choice:
                return (f"{key}={choice.group(1)} is not one of {choice.group(2)}; pick one of "
                        "those")
            return f"bad value for '{key}': {first}; give a value of the declared type"
        if isinstance(exc, errors.OmegaConfBaseException):
            return str(exc).splitlines()[0]
    head = (str(err).splitlines() or [type(err).__name__])[0]
    missing = re.search(r"Could not find '([^/']+)/([^']+)'", head)
    if missing:
        group, option = missing.groups()
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        return f"{group}={option} is not a config option; choose one of {', '.join(options)}"
    return head
