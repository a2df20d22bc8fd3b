"""The sweeps' grids (`grid:` in each scale preset): what `sweeps/*.yaml` vary at this scale.

Part of the config schema (training/config.py holds the rest); the values here are the cpu
scale's, the other scales' presets state what differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StabilityGrid:
    """The small-batch stability study (sweeps/stability*.yaml; science.md section 6)."""

    batch_sizes: str = "1,4,16,64,256"  # sequences
    base_batch_size: int = 64  # sequences; the lr is tuned here, then carried by lr_scaling
    lrs: dict[str, str] = field(  # lr grid per optimizer at base_batch_size
        default_factory=lambda: {"adamw": "2e-3,4e-3,8e-3", "muon": "0.0075,0.015,0.03"}
    )
    lr_scaling: str = "sqrt"  # none | sqrt | linear: how the tuned lr is carried to other batches
    steps: int = 500  # optimizer steps of every run (a fixed number, not a token budget)
    micro_batch_size: int = 4  # the accumulation check: base_batch_size as micro-batches of this


@dataclass
class SchedulesGrid:
    """The batch-schedule study (sweeps/schedules.yaml): five arms at equal tokens, each
    with a wsd lr schedule, so that every arm ends annealed."""

    small: int = 8  # sequences: the constant small batch, and where ramp and adaptive start
    large: int = 128  # sequences: the constant large batch, the ramp's end, adaptive's cap
    micro_batch_size: int = 4  # ramp and adaptive accumulate micro-batches of this
    tokens: int = 1_572_864  # the budget of every arm (a multiple of large x seq_len)
    lrs: dict[str, str] = field(  # lr per optimizer at the small batch (then optim.lr_scaling)
        default_factory=lambda: {"adamw": "1.5e-3", "muon": "0.005"}
    )
    # sqrt: the rule the best lr of both optimizers follows between 8 and 128 sequences in
    # the cpu batch sweep (docs/results/cpu.md)
    lr_scaling: str = "sqrt"
    ramp_fraction: float = 0.25  # share of the tokens over which the ramp grows
    interval_steps: int = 50  # adaptive: optimizer steps between batch changes, at least
    # measured: the local-CBS report whose B_crit curve the batch follows (relative to the
    # working directory, the repository root under make)
    measured_fits: str = "runs/local_cbs/${scale}/report/fits.json"
    measured_factor: float = 2.0  # measured: doubles while B_crit > this x the batch
    # constant small: cooldown branches (fractions of `tokens`), each an annealed small-batch
    # run of that budget: the reference the steps saved are read against
    branch_budgets: list[float] = field(
        default_factory=lambda: [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875])


@dataclass
class LocalCbsGrid:
    """`make sweep-local-cbs` (sweeps/local_cbs.yaml): per optimizer one base run at the
    baseline batch (`base_batch_size`) and the batch grid's middle lr, constant lr, forking
    local-CBS branches (`train.local_cbs`, whose fields these fill)."""

    tokens: int = 1_500_000  # the base run's budget
    at_fractions: list[float] = field(  # forks, fractions of the base budget, denser early
        default_factory=lambda: [0.03, 0.06, 0.12, 0.25, 0.5, 0.8])
    multipliers: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    # cpu: 20 optimizer steps of the largest branch (16 x 8 sequences x 64 tokens = 8,192)
    window_tokens: int = 163_840
    # the ladder again at each: two more seeds give 12 degrees of freedom per k over six forks
    replicate_seeds: list[int] = field(default_factory=lambda: [1, 2])
    # train.local_cbs.cooldown_fraction: compared annealed, not at the noise floor, which
    # flatters a larger batch (lower lr / batch); it cut the scatter of k = 2's excess to 0.003
    # from 0.012 nats/token (cpu, one AdamW base, 2 forks x 3 seeds)
    cooldown_fraction: float = 0.5
    # the branches' lr rule (sweep syntax, one base run each): Muon's is unsettled, so both
    lr_scalings: dict[str, str] = field(
        default_factory=lambda: {"adamw": "sqrt", "muon": "none,sqrt"})


@dataclass
class CpuTask:
    """One SLURM array task on a CPU cluster (`hydra/launcher=slurm_cpu`): the CPUs its worker
    pool trains on (one run per CPU) and the memory it asks for, sized to this scale's runs."""

    cpus: int = 8
    mem_gb: int = 16


@dataclass
class GridConfig:
    """What the sweeps in `sweeps/` vary at this scale, in Hydra's sweep syntax ("8,32,128").

    The batch and widths sweeps train every (batch size, lr) once at `train.tokens` with a
    wsd schedule, and each run yields more budgets by cooldown branches (`branch_budgets`);
    the baseline batch (the first) is also trained at `baseline_seeds`
    (`widths_baseline_seeds`), whose scatter is the loss noise of every cell; in the batch
    sweep so are the other `seeded_batch_sizes` at `seeded_lrs`, each batch's own noise.
    """

    batch_sizes: str = "8,16,32,64,128"  # sequences, doubling; the first is the baseline b
    base_batch_size: int = 8  # sequences; batch at which the lr grid values apply
    lrs: dict[str, str] = field(  # lr grid per optimizer, values at base_batch_size
        default_factory=lambda: {"adamw": "6e-4,1.5e-3,3.75e-3", "muon": "0.0015,0.004,0.01"}
    )
    # how each optimizer's lr follows the batch size. Muon's best lr rises faster than
    # AdamW's (cpu scale, 2026-12-01): with a fixed lr it sat on the grid's low edge at batch
    # 8-16 and the high edge at 64-128 in 14 of 20 cells; with the sqrt rule on the high edge
    # at batch 32-128 in 38 of 60 widths cells; interior optima rose about as batch^0.75
    lr_scaling: dict[str, str] = field(
        default_factory=lambda: {"adamw": "sqrt", "muon": "linear"}
    )
    # AdamW's beta2 at base_batch_size, carried to each batch by beta2_scaling (tokens: the
    # same half-life in tokens at every batch, Marek et al. 2025). Measured at cpu scale
    # (batch 8, 1.5M tokens): 0.95 -> 4.256, 0.99 -> 4.108, 0.999 -> 4.095 nats/token for
    # AdamW, 0.95 -> 3.976, 0.99 -> 3.832 for Muon (its AdamW on embeddings and gains); a
    # fixed 0.95 made batch 8 less token-efficient than batch 16, which no B_crit allows.
    # 0.999 at batch 8 x 64 tokens is a half-life of 355k tokens, 24% of the budget; the
    # other scales keep that share (unmeasured there)
    beta2: float = 0.999
    beta2_scaling: str = "tokens"
    branch_budgets: list[float] = field(default_factory=lambda: [0.125, 0.25, 0.5])
    # the adaptive lr search of the batch and widths sweeps (science.md, "The lr search"):
    # after the grid, each (width, batch) adds lrs one grid step beyond any budget whose best
    # lr is on the edge of those tried, round by round, until every optimum is bracketed.
    # false: the grid's lrs only. At most lr_search_rounds rounds and lr_search_budget x the
    # plan's tokens more; the cpu batch sweep's search added 8% and 15% to its grid's 117M
    # tokens in two draws (one round each, no cell left on an edge; 2026-12-04)
    lr_search: bool = True
    lr_search_rounds: int = 3
    lr_search_budget: float = 0.3
    # the batch and widths sweeps' train.warmup_steps per optimizer (each scale sets its own;
    # the other sweeps take train.warmup_steps as the scale sets it)
    warmup_steps: dict[str, int] = field(default_factory=lambda: {"adamw": 50, "muon": 50})
    widths_warmup_steps: int = 50  # the widths sweep's, both optimizers
    # the batch and widths sweeps' train.warmup_tokens: every batch warms up over at least
    # these tokens and at least its warmup steps; null: the steps alone
    warmup_tokens: int | None = None
    # train.seed of the batch and widths sweeps' grid runs: another value trains the whole
    # sweep again as a new draw (give baseline_seeds other seeds too); the training is
    # deterministic, so rerunning a sweep at the same seeds gives the same losses bit for bit
    seed: int = 0
    baseline_seeds: str = "1"  # more seeds (seed 0 is in the grid) of the seeded cells:
    # the batches `seeded_batch_sizes` at the lrs `seeded_lrs` (sweeps/batch_seeds.yaml), whose
    # scatter is the loss noise of the cells (per batch where a batch has seeds)
    seeded_batch_sizes: str = "${grid.base_batch_size}"
    seeded_lrs: dict[str, str] = field(default_factory=lambda: {
        "adamw": "${grid.lrs.adamw}", "muon": "${grid.lrs.muon}"})
    # the widths sweep's, per width (each seed costs a run per width and lr)
    widths_baseline_seeds: str = "${grid.baseline_seeds}"
    # make sweep-branches: the budgets of the branches and the main run (tokens)
    branch_check_tokens: str = "187500,375000,750000,1500000"
    micro_batches: int = 2  # per step in every sweep run: the online B_noise needs two
    widths: str = "32,48,64"  # model widths of the widths sweep (heads must divide them)
    widths_tokens: int = 750_000  # the widths sweep's budget per run (tokens)
    # the widths sweep's branches (a smaller budget may need larger fractions for its largest
    # batch's smallest branch to have steps after the warmup)
    widths_branch_budgets: list[float] = field(default_factory=lambda: [0.125, 0.25, 0.5])
    stability: StabilityGrid = field(default_factory=StabilityGrid)
    schedules: SchedulesGrid = field(default_factory=SchedulesGrid)
    local_cbs: LocalCbsGrid = field(default_factory=LocalCbsGrid)
    cpu_task: CpuTask = field(default_factory=CpuTask)
