"""The adaptive lr search's rule: given the losses a trunk's lrs reached at each budget, which
lrs to train next so that every budget's best lr has a higher loss on both sides.

A trunk is one (optimizer, width, batch) of a sweep: each of its lrs is one wsd run whose
cooldown branches end at the smaller budgets, so one more lr measures every budget at once.
Per budget the best lr is the lowest loss among those tried (a diverged run counts as an
infinite loss); when it is the lowest lr tried, the next lr one grid step below is added,
when it is the highest, one step above; when the lr above it diverged and lies a whole step
away, the point half a step above is added once (the optimum may lie in that gap). New lrs
are rounded to two significant digits, so every draw and round names the same lrs. No I/O,
numpy only: the sweep (`orchestration.lr_search`) applies it round by round, and tests apply
it to planted worlds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_STEP = 2.0  # the log step of a grid with one lr (none to measure it from)


@dataclass(frozen=True)
class Addition:
    """One lr to add to a trunk, and why."""

    lr: float
    side: str  # "low": below the lowest tried; "high": above the highest; "gap": below a
    # diverged lr, half a step above the best; sides joined by "+" when budgets that tried
    # different lrs ask for the same one from different sides
    best_lr: float  # the best lr tried at the budgets that ask for it (the first's, when
    # they ask from different sides)
    budgets: tuple[int, ...]  # those budgets (tokens)

    def reason(self) -> str:
        """Why this lr is added, in words."""
        names = {"low": "the lowest lr tried", "high": "the highest lr tried",
                 "gap": "the highest lr below a diverged one"}
        where = " or ".join(names[side] for side in self.side.split("+"))
        budgets = ", ".join(f"{b / 1e6:.3g}M" for b in self.budgets)
        best = (f"best lr {self.best_lr:.3g}" if "+" not in self.side
                else "the best lr (not the same one)")
        return (f"{best} is {where} at {len(self.budgets)} budget(s) "
                f"({budgets} tokens)")


def grid_step(lrs: list[float]) -> float:
    """The grid's log step: the geometric mean ratio of neighbouring lrs (DEFAULT_STEP for one
    lr)."""
    values = sorted(set(lrs))
    if len(values) < 2:
        return DEFAULT_STEP
    return (values[-1] / values[0]) ** (1 / (len(values) - 1))


def lattice(lr: float) -> float:
    """`lr` rounded to two significant digits: the value a new run is named by."""
    return float(f"{lr:.2g}")


def best_per_budget(losses: dict[float, dict[int, float]]) -> dict[int, tuple[float, list]]:
    """Per budget: (the best lr, the lrs tried there in order). `losses` maps each lr tried to
    its loss per budget (tokens -> nats/token; inf: diverged); an lr missing at a budget was
    not measured there. Budgets where every lr diverged have no best lr (left out)."""
    out = {}
    budgets = sorted({b for per_lr in losses.values() for b in per_lr})
    for budget in budgets:
        tried = sorted(lr for lr, per_lr in losses.items() if budget in per_lr)
        finite = [lr for lr in tried if math.isfinite(losses[lr][budget])]
        if finite:
            out[budget] = (min(finite, key=lambda lr: losses[lr][budget]), tried)
    return out


def additions(losses: dict[float, dict[int, float]], step: float) -> list[Addition]:
    """The lrs to train next for one trunk (see the module docstring); empty when every
    budget's best lr is bracketed (or can be bracketed no further: its gap was tried)."""
    if not losses:
        return []
    tried_all = sorted(losses)
    wanted: dict[float, list] = {}
    for budget, (best, tried) in best_per_budget(losses).items():
        i = tried.index(best)
        if i == 0:
            lr, side = lattice(best / step), "low"
        elif i == len(tried) - 1:
            lr, side = lattice(best * step), "high"
        else:
            above = tried[i + 1]
            if math.isfinite(losses[above][budget]) or above / best < step ** 0.75:
                continue  # bracketed, or the gap below the diverged lr was tried already
            lr, side = lattice(math.sqrt(best * above)), "gap"
        if any(math.isclose(lr, t, rel_tol=1e-9) for t in tried_all):
            continue  # tried (at another budget's run), and this budget has no result for it
        wanted.setdefault(lr, []).append((budget, best, side))
    return [Addition(lr, "+".join(sorted({side for _, _, side in items})), best_lr=items[0][1],
                     budgets=tuple(b for b, _, _ in items))
            for lr, items in sorted(wanted.items())]


def bracketed(losses: dict[float, dict[int, float]]) -> dict[int, bool]:
    """Per budget: whether its best lr has a higher loss (or a divergence) on both sides."""
    out = {}
    for budget, (best, tried) in best_per_budget(losses).items():
        i = tried.index(best)
        out[budget] = 0 < i < len(tried) - 1
    return out
