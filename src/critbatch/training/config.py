"""The config schema: typed dataclasses registered in Hydra's ConfigStore, and the numbers
derived from a config (micro-batch, steps, token budget).

Every field is declared once, here, with its unit and meaning. YAML files in
`conf/` state only what differs. Units: batch sizes in sequences, budgets in
tokens, warmup in optimizer steps, losses in nats per token. The checks between fields are
in training/config_checks.py; a run's saved config is read back in training/saved_config.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from hydra.core.config_store import ConfigStore

from critbatch.results.runs import wandb_group_name
from critbatch.training.grid import GridConfig

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"

# The closed choices are StrEnums: Hydra/OmegaConf refuse any other value when composing (one
# line, `config_checks.explain_compose_error`), and a member equals, prints and serialises as
# its string.


class Optimizer(StrEnum):
    adamw = "adamw"
    muon = "muon"


class LrScaling(StrEnum):
    none = "none"
    sqrt = "sqrt"
    linear = "linear"


class DecayScaling(StrEnum):
    """How a per-step decay follows the batch: none, or tokens (decay^(B / B_base))."""

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
    momentum: float = 0.95  # Muon momentum (Nesterov), at base_batch_size
    # none | tokens: with tokens the momentum used is momentum^(batch_size / base_batch_size),
    # so the momentum's half-life is the same number of tokens at every batch (as
    # beta2_scaling does for Adam's second moment); none: `momentum` per step at every batch
    momentum_scaling: DecayScaling = DecayScaling.none
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
    beta2_scaling: DecayScaling = DecayScaling.none
    base_batch_size: int = 32  # sequences; batch size at which `lr` is the lr used


@dataclass
class GNSConfig:
    """Online gradient noise scale (science.md section 2; estimator in science/noise.py)."""

    enabled: bool = True  # track B_noise from the micro-batches; needs >= 2 micro-batches a step
    # EMA decay per step of |G|^2, tr(Sigma) and the loss; 0.95 = a horizon of ~20 steps.
    # Shorter is noisier (one step's |G|^2 is mostly sampling noise); longer is biased on short
    # runs (|G|^2 is many times larger early on: a long memory keeps B_noise far below today's).
    ema: float = 0.95
    # save the state at the last peak-lr reading (the cooldown's start) as
    # checkpoint_peak_lr.pt: a constant-lr checkpoint for `make noise RUN=<run>
    # ARGS="--checkpoint peak_lr"`, to hold the tracker against the noise program
    peak_checkpoint: bool = False


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
    # this many micro-batches (>= 2 turns on the online B_noise, which needs two or more a step);
    # under torchrun at least one per rank (`micro_batch_size`)
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
    """Register the schema so `conf/config.yaml` can name it in its defaults list; once per
    config store (storing converts the dataclass again: 30 ms on every compose)."""
    store = ConfigStore.instance()
    if "critbatch_schema.yaml" not in store.repo:
        store.store(name="critbatch_schema", node=Config)


def launched_world() -> int:
    """The processes torchrun started for this run (WORLD_SIZE; 1 without torchrun)."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1")))


def micro_batch_size(cfg: Config) -> int:
    """Sequences per forward/backward (see `TrainConfig.micro_batch_size`). A constant batch
    under torchrun splits into at least one micro-batch per rank: batch 16 on 2 ranks is two
    of 8 whether train.micro_batches is 1 or 2."""
    t = cfg.train
    if t.micro_batch_size:
        return t.micro_batch_size
    if t.batch_schedule == "constant" or not t.batch_size_start:
        world = launched_world() if t.batch_size % launched_world() == 0 else 1
        return max(1, t.batch_size // max(world, t.micro_batches))
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
