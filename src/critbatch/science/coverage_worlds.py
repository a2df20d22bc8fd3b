"""Planted sweeps of several kinds, for the coverage study of the intervals and the verdict
(`bench.coverage`): table rows (`analysis.bcrit.tables`' run rows) drawn from a known world, and
the truth each interval should hold. numpy only.

Every world follows McCandlish et al.'s tokens to reach a loss,

    E(B, L, D) = E_min(L; N) (1 + (B / B_crit(L, D))^p) (1 + B_s / B),
    E_min(L; N) = E_REF (a / (L - l_inf(N)))^(1 / alpha),

a run at batch B with D tokens ending at the L that solves E = D (`loss_at`), plus a parabola
in ln lr about its best lr and seed noise. The kinds differ from the joint model's own form in
one way each (`KINDS`):

- `own form`: B_crit(L) = B* L^-gamma, Gaussian noise: the model's own world;
- `bend`: the exponent turns at the middle of the losses (gamma 4.8 above, 3.0 below);
- `tokens too`: B_crit also grows with the budget, (D / D_0)^0.3;
- `small batches lose`: a small-batch term B_s = 4 sequences (the joint model has it as an
  option);
- `trunk noise`: each run's loss shares 80% of its noise variance with the other budgets of
  its trunk (written as cooldown branches, `branch_of`);
- `heavy tails`: Student's t noise with 3 degrees of freedom, of the same sd;
- `lr off`: the lr grid centred a grid step away from the best lr, so many cells' best lr
  sits on the grid's edge;
- `cpu design`: the cpu preset's own design (one width, batches 8-128, five budgets as one run
  and its four cooldown branches, three lrs, the baseline batch at three seeds, one run's
  noise 0.015 nats/token, 80% of it shared by a trunk; runs of fewer than 30 steps, 3x
  the preset's 10-step warmup, are no cells: batch 128 loses its 1/8 budget).

Where the law is not a power of the loss alone, "the truth" of 1/alpha_B is the power law
that best describes the true B_crit along the sweep's smallest batch (`truth`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

E_REF = 1e6  # tokens: the example curve's unit (as science.joint)
SEQ_LEN = 64
LR_CURVATURE = 0.05  # nats/token per (ln lr - ln lr*)^2
KINDS = ("own form", "bend", "tokens too", "small batches lose", "trunk noise", "heavy tails",
         "lr off", "cpu design")
D_0 = 1.5e6  # tokens: the budget at which the `tokens too` kind's B_crit is B* L^-gamma


@dataclass(frozen=True)
class World:
    """One planted world: its curves, its B_crit law and its design."""

    kind: str
    l_inf: tuple = (1.0, 0.9, 0.8, 0.7)  # nats/token per width
    a: float = 3.3
    alpha: float = 0.16
    b_star: float = 3.2e5  # sequences at L = 1 nat/token
    gamma: float = 4.8
    gamma_below: float | None = None  # the `bend` kind's exponent below `bend_loss`
    bend_loss: float | None = None
    token_exponent: float = 0.0  # B_crit ~ (D / D_0)^token_exponent
    power: float = 1.0
    b_small: float = 0.0
    batches: tuple = (8, 16, 32, 64, 128, 256)
    budgets: tuple = tuple(1.5e6 * 2.0**k for k in range(-2, 3))
    lr_steps: tuple = tuple(math.log(2.0) * k for k in range(-2, 3))
    lr_offset: float = 0.0  # the lr grid's centre, in e-folds from the best lr
    seeds: int = 1
    baseline_seeds: int = 1  # seeds of the smallest batch
    sigma: float = 0.01  # nats/token: one run's loss noise
    shared: float = 0.0  # share of a run's noise variance its trunk shares
    tails: float | None = None  # Student's t dof of the noise (None: Gaussian)
    branches: bool = False  # budgets below the largest are cooldown branches of one run
    # a run of fewer steps is no cell (the analysis leaves out runs of fewer than 3x their
    # warmup: the cpu preset's 10-step warmup makes that 30 steps)
    min_steps: int = 0
    params: tuple = field(default_factory=lambda: tuple(int(1e6 * 2**w) for w in range(4)))

    def b_crit(self, loss, tokens):
        """B_crit (sequences) at `loss` and `tokens`."""
        loss = np.asarray(loss, float)
        out = self.b_star * loss ** -self.gamma
        if self.bend_loss is not None:
            below = self.b_star * self.bend_loss ** -self.gamma * (
                loss / self.bend_loss) ** -self.gamma_below
            out = np.where(loss < self.bend_loss, below, out)
        return out * (np.asarray(tokens, float) / D_0) ** self.token_exponent

    def tokens_to(self, loss, width: int, batch, tokens):
        """E(B, L, D): the tokens `batch` needs to reach `loss` (NaN at or below l_inf)."""
        gap = np.asarray(loss, float) - self.l_inf[width]
        with np.errstate(invalid="ignore", divide="ignore"):
            e_min = np.where(gap > 0, E_REF * (self.a / gap) ** (1 / self.alpha), np.nan)
        batch = np.asarray(batch, float)
        ratio = (batch / self.b_crit(loss, tokens)) ** self.power
        return e_min * (1 + ratio) * (1 + self.b_small / batch)

    def loss_at(self, width: int, batch: float, tokens: float) -> float:
        """The loss (nats/token) a run at `batch` reaches with `tokens`: the root of
        E(B, L, D) = D on the falling branch (from l_inf up to where E stops falling)."""
        lo = self.l_inf[width] + 1e-9
        gaps = self.a * np.geomspace(1e-4, 50.0, 200)
        with np.errstate(all="ignore"):
            grid = np.log(self.tokens_to(lo + gaps, width, batch, tokens))
        k = int(np.nanargmin(grid))
        if not grid[k] < math.log(tokens):
            return math.nan
        low, high = lo, lo + gaps[k]
        for _ in range(80):
            mid = 0.5 * (low + high)
            if math.log(float(self.tokens_to(mid, width, batch, tokens))) > math.log(tokens):
                low = mid
            else:
                high = mid
        return 0.5 * (low + high)


def world_of(kind: str, seed: int) -> World:
    """The world of `kind` for `seed`: one or four widths and 1/alpha_B 4.8 or 3.5 in turn
    (B_crit at L = 4.2 held, where the sweeps' losses lie), the kind's departure, and for
    `cpu design` the cpu preset's design."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    widths = (1, 4)[seed % 2]
    gamma = (4.8, 3.5)[(seed // 2) % 2]
    base = {"l_inf": (1.0, 0.9, 0.8, 0.7)[:widths], "gamma": gamma,
            "b_star": 3.2e5 * 4.2 ** (gamma - 4.8),
            "params": tuple(int(1e6 * 2**w) for w in range(widths)), "seeds": 2 - (widths > 1),
            "baseline_seeds": 2}
    extra = {
        "own form": {},
        "bend": {"gamma_below": gamma - 1.8, "bend_loss": 4.6},
        "tokens too": {"token_exponent": 0.3},
        "small batches lose": {"b_small": 4.0},
        "trunk noise": {"shared": 0.8, "branches": True},
        "heavy tails": {"tails": 3.0},
        "lr off": {"lr_offset": math.log(2.0)},
        "cpu design": {"l_inf": (1.0,), "params": (int(1e6),), "batches": (8, 16, 32, 64, 128),
                       "budgets": tuple(1.5e6 * f for f in (0.125, 0.25, 0.5, 0.75, 1.0)),
                       "lr_steps": tuple(math.log(1.59) * k for k in (-1, 0, 1)), "seeds": 1,
                       "baseline_seeds": 3, "sigma": 0.015, "shared": 0.8, "branches": True,
                       "min_steps": 30},
    }[kind]
    return World(kind=kind, **{**base, **extra})


def noise(world: World, rng: np.random.Generator, size: int) -> np.ndarray:
    """Unit-variance draws: Gaussian, or Student's t scaled to unit variance."""
    if world.tails is None:
        return rng.standard_normal(size)
    nu = world.tails
    return rng.standard_t(nu, size) / math.sqrt(nu / (nu - 2))


def table_rows(world: World, seed: int) -> list[dict]:
    """The planted sweep's run rows: every width x batch x lr x seed a trunk, trained to every
    budget (the smaller budgets cooldown branches of the largest where `world.branches`), its
    loss the world's at the best lr plus the lr parabola and noise (a trunk's share of it
    drawn once)."""
    rng = np.random.default_rng(seed)
    rows = []
    top = max(world.budgets)
    losses: dict[tuple, float] = {}  # every lr and seed of a (width, batch, tokens) shares it
    for w in range(len(world.l_inf)):
        for batch in world.batches:
            best_lr = 1e-3 * (batch / 8) ** 0.5
            shift = rng.uniform(-0.5, 0.5) * math.log(2.0) + world.lr_offset
            for step in world.lr_steps:
                for s in range(world.baseline_seeds if batch == world.batches[0]
                               else world.seeds):
                    trunk = f"w{w}_b{batch}_lr{step:+.2f}_s{s}"
                    common = math.sqrt(world.shared) * float(noise(world, rng, 1)[0])
                    for nominal in world.budgets:
                        tokens = int(nominal // (batch * SEQ_LEN) * batch * SEQ_LEN)
                        if tokens < max(1, world.min_steps) * batch * SEQ_LEN:
                            continue
                        if (w, batch, tokens) not in losses:
                            losses[(w, batch, tokens)] = world.loss_at(w, batch, tokens)
                        loss = losses[(w, batch, tokens)]
                        if not math.isfinite(loss):
                            continue
                        own = math.sqrt(1 - world.shared) * float(noise(world, rng, 1)[0])
                        branch = world.branches and nominal < top
                        rows.append({
                            "run": f"{trunk}_t{tokens}" if branch else trunk,
                            "group": "planted", "optimizer": "adamw",
                            "lr": best_lr * math.exp(step + shift), "seed": s,
                            "batch_size": batch, "seq_len": SEQ_LEN, "tokens": tokens,
                            "params": world.params[w],
                            "loss": loss + LR_CURVATURE * (step + shift) ** 2
                            + world.sigma * (common + own),
                            "branch_of": trunk if branch else None,
                            "true_loss": loss})  # not a table column: the analysis ignores it
    return rows


def truth(world: World, rows: list[dict]) -> dict:
    """What the intervals should hold: 1/alpha_B, the least-squares slope of -ln B_crit
    against ln L over the smallest batch's runs (their noiseless losses at their own tokens:
    exactly gamma where B_crit is a power of the loss alone, else the power law that best
    describes the law along the sweep's baseline), and B* in tokens (None where the law has no
    single B*)."""
    small = [r for r in rows if r["batch_size"] == world.batches[0]]
    loss = np.array([r["true_loss"] for r in small])
    tokens = np.array([r["tokens"] for r in small], float)
    slope = np.polyfit(np.log(loss), -np.log(world.b_crit(loss, tokens)), 1)[0]
    exact = world.bend_loss is None and world.token_exponent == 0
    return {"exponent": world.gamma if exact else float(slope),
            "b_star_tokens": world.b_star * SEQ_LEN if exact else None,
            "loss_range": [float(loss.min()), float(loss.max())]}
