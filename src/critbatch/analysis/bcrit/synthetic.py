"""Synthetic run directories (results format) generated from the McCandlish world, for tests
and the analysis benchmark.

Two designs: `synthetic_sweep`, independent runs per (batch, budget, lr, seed) (the layout of
sweeps before cooldown branches), and `synthetic_branched_sweep`, the branched design of
`make sweep-batch`: one wsd run per (batch, lr, seed) at the full budget, forked into branch
runs (`branch_of`, `branch_at_tokens`) that end at smaller budgets, with the online tracker's
`b_noise` on eval points. Both use `science.synthetic.SyntheticTruth`; a branch ends at the
loss a run planned for its budget reaches (the premise of cooldown branches, Hägele et al.
2024), and B_noise follows a planted law `NoiseLaw`.
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from critbatch.analysis.bcrit.bcrit import analyse
from critbatch.analysis.render import one_blas_thread
from critbatch.results.files import write_json_atomic
from critbatch.results.runs import SCHEMA_VERSION, load_runs
from critbatch.science.joint_planted import PlantedWorld
from critbatch.science.synthetic import SyntheticTruth


@dataclass(frozen=True)
class NoiseLaw:
    """The planted gradient noise scale: B_noise(L) = b_star_tokens / L^exponent tokens (L in
    nats/token), Kaplan's form, so a fit of the online series knows its answer."""

    b_star_tokens: float = 1.2e5
    exponent: float = 2.0

    def b_noise(self, loss: float, seq_len: int) -> float:
        """B_noise at `loss`, in sequences."""
        return self.b_star_tokens / loss**self.exponent / seq_len


# b_noise of the first eval points of a run with a noise law: an online tracker that has not
# resolved yet (None), a NaN and a negative |G|^2 estimate; the analysis must skip them.
UNRESOLVED_B_NOISE = (None, float("nan"), -1.0)


def synthetic_summary(truth: SyntheticTruth, *, batch_size: int, tokens: int, lr: float,
                      optimizer: str = "adamw", width: int = 64, seed: int = 0,
                      loss_offset: float = 0.0, status: str = "completed",
                      sweep: str = "synthetic",
                      curve_fractions=(0.125, 0.25, 0.5, 1.0),
                      noise_law: NoiseLaw | None = None, unresolved_evals: int = 0,
                      warmup_steps: int = 10) -> dict:
    """A complete summary.json (every SUMMARY_KEYS key) for one synthetic run.

    `warmup_steps` is recorded only (the planted loss ignores it): the analysis flags a run of
    fewer than `best_lr.MIN_STEPS_PER_WARMUP` times as many steps. 10, the cpu sweeps' warmup.

    Eval points at `curve_fractions` of the steps; with `noise_law`, each carries `b_noise`
    (sequences) from the law at its loss, except the first `unresolved_evals` (at most
    three), which carry the values of `UNRESOLVED_B_NOISE` in turn.
    """
    steps = tokens // (batch_size * truth.seq_len)
    final = truth.final_loss(batch_size, tokens) + loss_offset + truth.lr_curvature * (
        math.log(lr) - math.log(truth.best_lr(batch_size))) ** 2
    curve = []
    for i, frac in enumerate(curve_fractions):
        s = max(1, int(steps * frac))
        t = s * batch_size * truth.seq_len
        loss = truth.final_loss(batch_size, t) + (final - truth.final_loss(batch_size, tokens))
        curve.append({"step": s, "tokens": t, "val_loss": loss,
                      "val_loss_per_byte": loss / truth.bytes_per_token})
        if noise_law is not None:
            curve[-1]["b_noise"] = (UNRESOLVED_B_NOISE[i] if i < unresolved_evals
                                    else noise_law.b_noise(loss, truth.seq_len))
    diverged = status == "diverged"
    return {
        "schema_version": SCHEMA_VERSION, "status": status, "sweep": sweep, "seed": seed,
        "optimizer": optimizer, "lr": lr, "width": width, "depth": 2, "heads": 2,
        "seq_len": truth.seq_len, "vocab_size": 2048, "params": 250_000,
        "params_nonembedding": 100_000, "batch_size": batch_size,
        "micro_batch_size": batch_size, "steps": steps, "tokens": steps * batch_size *
        truth.seq_len, "warmup_steps": warmup_steps, "schedule": "cosine",
        "bytes_per_token": truth.bytes_per_token,
        "val_loss": float("nan") if diverged else final,
        "val_loss_per_byte": float("nan") if diverged else final / truth.bytes_per_token,
        "curve": [] if diverged else curve, "wall_time_s": 1.0, "tokens_per_s": 1e5,
        "data_name": "synthetic", "data_fingerprint": "f" * 64, "git_revision": "synthetic",
        "critbatch_version": "0.1.0", "status_reason": "loss > 3x" if diverged else None,
        "diverged_step": 5 if diverged else None,
    }


def synthetic_sweep(root: str | Path, truth: SyntheticTruth | None = None, *,
                    baseline_batch: int = 16, batch_sizes=(64, 128, 256, 512, 1024, 2048),
                    budgets_tokens=(2**21, 2**22, 2**23, 2**24), all_budgets: bool = False,
                    lr_multipliers=(0.5, 1.0, 2.0), optimizers=("adamw",), widths=(64,),
                    seeds=(0,), seed_loss_offsets=None, lr_grid_shift: float = 0.3,
                    diverged_high_lr: bool = False, sweep: str = "synthetic",
                    warmup_steps: int = 10) -> SyntheticTruth:
    """Write run directories generated from the McCandlish model; return the truth.

    The baseline batch runs at every budget, each other batch size at the largest (or at
    every budget with `all_budgets`, for the Pareto frontier). Each cell is a grid of
    learning rates `best_lr(B) * 2^-lr_grid_shift * lr_multipliers` (so the optimum falls
    between grid points), each with loss `final_loss(B, E) + c (ln lr - ln lr*)^2`, plus
    `seed_loss_offsets[i]` for seed i. `diverged_high_lr` adds, per cell, a run at 4x the
    largest lr that diverged; every run records `warmup_steps`. Directory layout:
    root/<sweep>/<opt>_w<width>/b<B>_t<E>_lr<i>_s<seed>.
    """
    truth = truth or SyntheticTruth()
    root = Path(root)
    offsets = seed_loss_offsets or [0.0] * len(seeds)
    cells = [(baseline_batch, t) for t in budgets_tokens]
    for b in batch_sizes:
        cells += [(b, t) for t in (budgets_tokens if all_budgets else budgets_tokens[-1:])]
    for opt in optimizers:
        for width in widths:
            for batch, tokens in cells:
                center = truth.best_lr(batch) * 2.0**-lr_grid_shift
                grid = [(i, center * m, "completed") for i, m in enumerate(lr_multipliers)]
                if diverged_high_lr:
                    grid.append((len(grid), center * max(lr_multipliers) * 4, "diverged"))
                for i, lr, status in grid:
                    for seed, offset in zip(seeds, offsets, strict=True):
                        summary = synthetic_summary(
                            truth, batch_size=batch, tokens=tokens, lr=lr, optimizer=opt,
                            width=width, seed=seed, loss_offset=offset, status=status,
                            sweep=sweep, warmup_steps=warmup_steps)
                        name = f"b{batch}_t{tokens}_lr{i}_s{seed}"
                        run_dir = root / sweep / f"{opt}_w{width}" / name
                        run_dir.mkdir(parents=True, exist_ok=True)
                        write_json_atomic(run_dir / "summary.json", summary)
    return truth


def synthetic_branched_sweep(root: str | Path, truth: SyntheticTruth | None = None, *,
                             baseline_batch: int = 8, batch_sizes=(16, 32, 64, 128),
                             budget_tokens: int = 2**23,
                             branch_budgets=(0.125, 0.25, 0.5), cooldown: float = 0.2,
                             lr_multipliers=(0.5, 1.0, 2.0), optimizers=("adamw",),
                             baseline_seeds=(0, 1), seed_loss_offsets=(0.002, -0.002),
                             noise_law: NoiseLaw | None = None, evals: int = 16,
                             lr_grid_shift: float = 0.3,
                             sweep: str = "synthetic") -> SyntheticTruth:
    """Write the branched design of `make sweep-batch` from the McCandlish model; return the
    truth.

    Per optimizer, batch size (the baseline and `batch_sizes`) and lr of the grid
    `best_lr(B) * 2^-lr_grid_shift * lr_multipliers`: one main run of `budget_tokens` with
    `evals` eval points (the first three with an unresolved `b_noise`,
    `UNRESOLVED_B_NOISE`), and one branch per fraction in `branch_budgets` that forks at
    (1 - `cooldown`) x its budget and ends at its budget (`branch_of`: the main run's folder
    name; `branch_at_tokens`), with eval points at the fork and the end. The baseline batch
    runs at every seed of `baseline_seeds`, each seed i with loss offset
    `seed_loss_offsets[i]`; the other batch sizes at seed 0 with no offset (the planted loss
    itself). `noise_law` (default `NoiseLaw()`) puts `b_noise` on every eval point, main runs
    and branches alike. Layout: root/<sweep>/<opt>_w64/b<B>_lr<i>_s<seed>[_branch<k>].
    """
    truth = truth or SyntheticTruth()
    noise_law = noise_law or NoiseLaw()
    root = Path(root)
    fractions = tuple((j + 1) / evals for j in range(evals))
    for opt in optimizers:
        for batch in (baseline_batch, *batch_sizes):
            seeds = baseline_seeds if batch == baseline_batch else (0,)
            offsets = seed_loss_offsets if batch == baseline_batch else (0.0,)
            center = truth.best_lr(batch) * 2.0**-lr_grid_shift
            for i, m in enumerate(lr_multipliers):
                for seed, offset in zip(seeds, offsets, strict=True):
                    main = f"b{batch}_lr{i}_s{seed}"
                    kwargs = dict(batch_size=batch, lr=center * m, optimizer=opt, seed=seed,
                                  loss_offset=offset, sweep=sweep, noise_law=noise_law)
                    folder = root / sweep / f"{opt}_w64"
                    summary = synthetic_summary(truth, tokens=budget_tokens,
                                                curve_fractions=fractions,
                                                unresolved_evals=len(UNRESOLVED_B_NOISE),
                                                **kwargs)
                    write_run(folder / main, {**summary, "schedule": "wsd"})
                    for k, frac in enumerate(branch_budgets):
                        tokens = int(budget_tokens * frac)
                        branch = synthetic_summary(truth, tokens=tokens,
                                                   curve_fractions=(1 - cooldown, 1.0),
                                                   **kwargs)
                        branch.update(schedule="wsd", branch_of=main,
                                      branch_at_tokens=int((1 - cooldown) * tokens))
                        write_run(folder / f"{main}_branch{k}", branch)
    return truth


def write_run(run_dir: Path, summary: dict) -> None:
    """`summary` as `run_dir`/summary.json (the folder created)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "summary.json", summary)


def benchmark(root: str | Path, n_runs: int = 1000) -> dict:
    """Time loading + analysing about `n_runs` synthetic runs (no report files); seconds."""

    n_batches = 6
    per_width = (4 + n_batches) * 3 * 2  # cells x lrs x optimizers
    widths = tuple(64 * (i + 1) for i in range(max(1, round(n_runs / per_width))))
    synthetic_sweep(root, optimizers=("adamw", "muon"), widths=widths)
    t0 = time.perf_counter()
    loaded = load_runs([root], progress=False)
    t1 = time.perf_counter()
    with one_blas_thread():
        result = analyse(loaded["runs"], left_out=loaded["left_out"])
    t2 = time.perf_counter()
    return {"n_runs": len(loaded["runs"]), "load_s": t1 - t0, "analyse_s": t2 - t1,
            "n_per_run": len(result["fits"]["per_run"])}


def synthetic_table(path: str | Path, rows: int = 2000, seed: int = 0,
                    world: PlantedWorld | None = None, seq_len: int = 64,
                    loss_sd: float = 0.01, optimizer: str = "adamw",
                    budgets: tuple[float, ...] = tuple(1.5e6 * 2.0**k for k in range(-2, 3)),
                    max_batches: int = 10) -> Path:
    """A results table (CSV, `analysis.tables`' run rows) of about `rows` runs drawn from a
    planted joint-model world (`science.joint_planted.PlantedWorld`; default: 4 model sizes, a
    params column) x `budgets` (tokens) x 3 to `max_batches` batch sizes (8, 16, ... sequences)
    x 5 lrs around each cell's best (a parabola in ln lr, 0.05 nats/token per unit^2) x seeds,
    as many seeds as bring the rows to `rows` (at least one), each run's loss noisy by
    `loss_sd` (nats/token). The analysis benchmark's table, and the verdict's planted worlds
    (`verdict_world`)."""
    world = world or PlantedWorld(l_inf=(1.0, 0.9, 0.8, 0.7), a=(3.3,) * 4,
                                  alpha=(0.16,) * 4)
    truth = world.fit()
    rng = np.random.default_rng(seed)
    sizes = len(world.l_inf)
    lr_steps = np.log(2.0) * np.arange(-2, 3)  # the lr grid: factors of 2 around the best
    per_batch = sizes * len(budgets) * len(lr_steps)
    batches = [8 * 2**i for i in range(min(max_batches, max(3, rows // per_batch)))]
    seeds = max(1, round(rows / (per_batch * len(batches))))
    out = []
    for w in range(sizes):
        for batch in batches:
            best_lr = 1e-3 * (batch / 8) ** 0.5
            for tokens in budgets:
                tokens = int(tokens // (batch * seq_len) * batch * seq_len) or batch * seq_len
                loss = float(truth.predict_loss(w, batch, tokens)[0])
                shift = rng.uniform(-0.5, 0.5) * np.log(2.0)  # the best lr between grid points
                for step in lr_steps:
                    for s in range(seeds):
                        out.append({
                            "run": f"{optimizer}_w{w}_b{batch}_t{tokens}_lr{step:+.2f}_s{s}",
                            "group": "planted", "optimizer": optimizer,
                            "lr": best_lr * math.exp(step + shift), "seed": s,
                            "batch_size": batch, "seq_len": seq_len, "tokens": tokens,
                            "params": int(1e6 * 2**w),
                            "loss": loss + 0.05 * (step + shift) ** 2
                            + loss_sd * rng.standard_normal()})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = ("run", "group", "optimizer", "lr", "seed", "batch_size", "seq_len", "tokens",
               "params", "loss")
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(out)
    return path
