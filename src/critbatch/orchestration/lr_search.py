"""The adaptive lr search of the batch and widths sweeps (`grid.lr_search`), round by round.

Round 0 is the stage's grid (`grid.lrs`), trained with the rest of the plan. After each
round, every trunk (one optimizer, width and batch: the jobs whose overrides differ only in
`optim.lr` and `train.seed`) is read back, run and branches: per budget, the mean loss of each
lr's seeds (a diverged run counts as an infinite loss), and `science.lr_search.additions`
names the lrs to add, one grid step beyond each budget's edge optimum. The new jobs are planned
exactly as Hydra names them (so a rerun finds them done, and a second draw names the same
lrs), trained, and the next round reads them. The search stops when every budget's best lr is
bracketed, after `grid.lr_search_rounds` rounds, or when the next lr would take the search
past `grid.lr_search_budget` x the plan's tokens; what stays unbracketed is listed.

Each round is recorded in `<stage folder>/lr_search.json` (per optimizer and draw: the lrs
added, why, and the tokens), which the report reads to state the tokens the search spent.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from critbatch.orchestration.planned import Job
from critbatch.orchestration.stages import compose_job, sweep_composer
from critbatch.results import runs
from critbatch.results.errors import ResultsError
from critbatch.results.files import write_json_atomic
from critbatch.science.lr_search import Addition, additions, bracketed, grid_step

RECORD = "lr_search.json"
PER_TRUNK = ("optim.lr=", "train.seed=")  # the overrides that vary within a trunk


def trunk_key(job: Job) -> tuple[str, ...]:
    """What a trunk's jobs share: their overrides but the lr and the seed."""
    return (job.optimizer, *sorted(o for o in job.overrides if not o.startswith(PER_TRUNK)))


def trained_tokens(job: Job) -> int:
    """The tokens a job trains in all: its run and its branches' cooldowns."""
    return job.tokens + sum(b.tokens - b.fork_tokens for b in job.branches)


def grid_lrs(job: Job) -> list[float]:
    """The stage's grid lrs (`grid.lrs.<optimizer>`), values at the grid's base batch."""
    return [float(x) for x in str(job.cfg.grid.lrs[job.optimizer]).split(",") if x.strip()]


def _loss(run_dir: Path) -> float | None:
    """A finished run's final loss (inf: diverged or not finite); None: not finished."""
    try:
        summary = runs.read_summary(run_dir)
    except ResultsError:
        return None
    loss = summary["val_loss"]
    return loss if summary["status"] != "diverged" and math.isfinite(loss) else math.inf


def measured(job: Job, tokens: int) -> bool:
    """Whether the analysis measures a budget of `tokens` of this job's runs: it leaves out
    runs of fewer than 3x their warmup steps (`analysis.bcrit.best_lr.too_few_steps`), so the
    search never adds lrs for them (with a 40-step warmup at cpu scale, batch 128 below 983k
    tokens)."""
    from critbatch.analysis.bcrit.best_lr import too_few_steps

    steps = tokens // (job.cfg.train.batch_size * job.cfg.model.seq_len)
    return not too_few_steps(steps, job.cfg.train.warmup_steps)


def job_losses(job: Job) -> dict[int, float]:
    """A job's final loss per budget (tokens) the analysis measures (`measured`): the run's
    and each finished branch's; a branch never trained because its parent diverged first
    counts as diverged."""
    top = _loss(job.run_dir)
    if top is None:
        return {}
    out = {job.tokens: top} if measured(job, job.tokens) else {}
    for branch in job.branches:
        loss = _loss(branch.run_dir)
        if (loss is not None or top == math.inf) and measured(job, branch.tokens):
            out[branch.tokens] = math.inf if loss is None else loss
    return out


def trunk_losses(jobs: list[Job]) -> dict[float, dict[int, float]]:
    """Per lr (`optim.lr`, the value at the grid's base batch) and budget: the mean finite loss
    over the seeds, as the analysis takes it (inf when every seed diverged)."""
    samples: dict[float, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for job in jobs:
        for budget, loss in job_losses(job).items():
            samples[float(job.cfg.optim.lr)][budget].append(loss)
    out: dict[float, dict[int, float]] = {}
    for lr, per_budget in samples.items():
        out[lr] = {}
        for budget, losses in per_budget.items():
            finite = [x for x in losses if math.isfinite(x)]
            out[lr][budget] = sum(finite) / len(finite) if finite else math.inf
    return out


def trunks(plan: list[Job], stage: str) -> dict[tuple, list[Job]]:
    """The searched stage's trunks, each with every job of the plan in it (the seeds stage's
    too), for the optimizers whose grid searches (`grid.lr_search`, two lrs or more)."""
    keys = {trunk_key(j) for j in plan if j.stage == stage and j.cfg.grid.lr_search
            and len(grid_lrs(j)) > 1}
    out: dict[tuple, list[Job]] = defaultdict(list)
    for job in plan:
        if (key := trunk_key(job)) in keys:
            out[key].append(job)
    return dict(out)


def template_of(jobs: list[Job], stage: str) -> Job:
    """The trunk's first job of the searched stage: the one new lrs copy."""
    return next(j for j in jobs if j.stage == stage)


def trunk_label(template: Job) -> str:
    """`batch 64` (and `width 48` where the stage sweeps widths)."""
    t, m = template.cfg.train, template.cfg.model
    swept = {o.split("=", 1)[0] for o in template.overrides}
    return f"batch {t.batch_size}" + (f", width {m.width}" if "model.width" in swept else "")


def new_job(compose, template: Job, lr: float, round_no: int) -> Job:
    """The template's job at `optim.lr` = `lr`, named as the grid would have named it."""
    overrides = [f"optim.lr={lr!r}" if o.startswith("optim.lr=") else o
                 for o in template.overrides]
    overrides += [o for o in template.extra if o.startswith(("hydra.", "hydra/"))]
    job = compose_job(compose, template.stage, template.optimizer, overrides, template.extra)
    job.search_round = round_no
    return job


def plan_round(plan: list[Job], stage: str, round_no: int, budget_left: float
               ) -> tuple[list[Job], list[dict], list[dict]]:
    """The jobs round `round_no` adds, most asked-for first while `budget_left` tokens last:
    (jobs, what each adds and why, the additions the budget left out)."""
    wanted: list[tuple[Addition, Job]] = []
    for jobs in trunks(plan, stage).values():
        template = template_of(jobs, stage)
        if not all(j.done or j.failure for j in jobs):
            continue  # still training: its losses are not all in
        step = grid_step(grid_lrs(template))
        wanted += [(add, template) for add in additions(trunk_losses(jobs), step)]
    wanted.sort(key=lambda pair: (-len(pair[0].budgets), pair[1].cfg.train.batch_size))
    planned = {j.run_dir.resolve() for j in plan}
    new, added, left_out = [], [], []
    with sweep_composer() as compose:
        for add, template in wanted:
            job = new_job(compose, template, add.lr, round_no)
            if job.run_dir.resolve() in planned:
                continue  # trained already (a failed run is not retried by the search)
            row = {"optimizer": template.optimizer, "trunk": trunk_label(template),
                   "lr": add.lr, "side": add.side, "reason": add.reason(),
                   "tokens": trained_tokens(job), "run_dir": str(job.run_dir)}
            if row["tokens"] > budget_left:
                left_out.append(row)
                continue
            budget_left -= row["tokens"]
            planned.add(job.run_dir.resolve())
            new.append(job)
            added.append(row)
    return new, added, left_out


def unbracketed(plan: list[Job], stage: str) -> list[str]:
    """The cells (trunk and budget) whose best lr is still on the edge of the lrs tried."""
    out = []
    for jobs in trunks(plan, stage).values():
        template = template_of(jobs, stage)
        for budget, ok in sorted(bracketed(trunk_losses(jobs)).items()):
            if not ok:
                out.append(f"{template.optimizer} {trunk_label(template)} at "
                           f"{budget / 1e6:.3g}M tokens")
    return out


def settings(plan: list[Job], stage: str) -> tuple[int, float] | None:
    """(rounds, budget fraction) of the searched stage's grid, or None when it does not search."""
    searched = [j for j in plan if j.stage == stage and j.cfg.grid.lr_search]
    if not searched:
        return None
    grid = searched[0].cfg.grid
    return grid.lr_search_rounds, grid.lr_search_budget


def search(plan: list[Job], stage: str, train: Callable[[list[Job]], object],
           after_round: Callable[[list[Job]], None] = lambda jobs: None) -> list[Job]:
    """Rounds of the search on a plan whose grid is trained (see the module docstring):
    `train` trains each round's new jobs, `after_round` sees the plan after each. Returns the
    plan with every job the search added."""
    config = settings(plan, stage)
    if config is None:
        return plan
    rounds, fraction = config
    grid_tokens = sum(trained_tokens(j) for j in plan)
    limit = fraction * grid_tokens
    spent = sum(trained_tokens(j) for j in plan if j.search_round)
    record = {"rounds": [], "grid_tokens": grid_tokens, "budget_tokens": limit}
    for round_no in range(1, rounds + 1):
        new, added, left_out = plan_round(plan, stage, round_no, limit - spent)
        for row in left_out:
            print(f"== lr search round {round_no}: not added (grid.lr_search_budget spent): "
                  f"optim={row['optimizer']} {row['trunk']} lr {row['lr']:.3g}", flush=True)
        if not new:
            break
        spent += sum(trained_tokens(j) for j in new)
        again = sum(j.done for j in new)
        print(f"\n== lr search round {round_no}: {len(new)} lr(s) added"
              + (f" ({again} trained already)" if again else "") + ", "
              f"{sum(trained_tokens(j) for j in new) / 1e6:,.1f}M tokens (the search so far "
              f"{spent / 1e6:,.1f}M of at most {limit / 1e6:,.1f}M)", flush=True)
        for row in added:
            print(f"   optim={row['optimizer']} {row['trunk']}: lr {row['lr']:.3g}, because "
                  f"{row['reason']}", flush=True)
        record["rounds"].append({"round": round_no, "added": added, "left_out": left_out})
        plan = plan + new
        after_round(plan)
        train(new)
    left = unbracketed(plan, stage)
    record.update(search_tokens=spent, unbracketed=left)
    write_record(plan, stage, record)
    if left:
        print(f"== lr search: {len(left)} cell(s) still have their best lr on an edge: "
              + "; ".join(left[:6]) + (" ..." if len(left) > 6 else ""), flush=True)
    else:
        print(f"== lr search: every cell's best lr is bracketed ({spent / 1e6:,.1f}M tokens "
              f"beyond the grid's {grid_tokens / 1e6:,.1f}M)", flush=True)
    return plan


def draw_name(job: Job) -> str:
    """The record's key of a job's search: its optimizer and draw (`grid.seed`, when set)."""
    draw = [o.lstrip("+") for o in job.extra if o.lstrip("+").startswith("grid.seed=")]
    return " ".join([job.optimizer, *draw[-1:]])


def write_record(plan: list[Job], stage: str, record: dict) -> None:
    """Merge this search into `<stage folder>/lr_search.json`, one entry per optimizer and
    draw (other entries kept)."""
    searched = [j for j in plan if j.stage == stage]
    for optimizer in dict.fromkeys(j.optimizer for j in searched):
        mine = [j for j in searched if j.optimizer == optimizer]
        folder = mine[0].run_dir.parent
        path = folder / RECORD
        try:
            doc = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            doc = {}
        mine_all = [j for j in plan if j.optimizer == optimizer]
        doc[draw_name(mine[0])] = {
            "optimizer": optimizer,
            "rounds": [{**r, "added": [a for a in r["added"] if a["optimizer"] == optimizer],
                        "left_out": [a for a in r["left_out"] if a["optimizer"] == optimizer]}
                       for r in record["rounds"]],
            "grid_tokens": sum(trained_tokens(j) for j in mine_all if not j.search_round),
            "search_tokens": sum(trained_tokens(j) for j in mine_all if j.search_round),
            "search_runs": sum(1 for j in mine_all if j.search_round),
            "unbracketed": [c for c in record["unbracketed"] if c.startswith(optimizer + " ")],
        }
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, doc)


# The share of trunks whose first round adds one lr, as measured: 5 of 10 trunks in the cpu
# batch sweep (9.9M tokens, one round), 10 lrs in 10 trunks at the smoke scale (budget-capped;
# 2026-12-06). The dry run's estimate counts this much; its range runs from none to the cap.
EXPECTED_SHARE = 0.5


def extra_tokens(plan: list[Job], stage: str) -> tuple[float, float, int]:
    """(expected, at most, runs at most): the tokens the search may add after the plan's grid.
    Expected: EXPECTED_SHARE of the trunks add one lr each; at most: every trunk adds an lr on
    both sides each round, capped by `grid.lr_search_budget`. (0, 0, 0) when it does not
    search."""
    config = settings(plan, stage)
    if config is None:
        return 0.0, 0.0, 0
    rounds, fraction = config
    cap = fraction * sum(trained_tokens(j) for j in plan)
    per_trunk = [trained_tokens(template_of(jobs, stage))
                 for jobs in trunks(plan, stage).values()]
    if not per_trunk:
        return 0.0, 0.0, 0
    most = min(2 * rounds * sum(per_trunk), cap)
    runs_at_most = min(2 * rounds * len(per_trunk), math.floor(most / min(per_trunk)))
    return min(EXPECTED_SHARE * sum(per_trunk), cap), most, runs_at_most


def worst_case(plan: list[Job], stage: str) -> list[str]:
    """Lines for a dry run: what the search may add after the first round."""
    config = settings(plan, stage)
    if config is None:
        return ["lr search: off (grid.lr_search=false): the grid's lrs only"]
    rounds, fraction = config
    grid_tokens = sum(trained_tokens(j) for j in plan)
    found = trunks(plan, stage)
    steps = ", ".join(sorted({f"x{grid_step(grid_lrs(template_of(jobs, stage))):.2f}"
                              for jobs in found.values()}))
    expected, most, runs_at_most = extra_tokens(plan, stage)
    return [f"lr search (grid.lr_search): this plan is its first round; up to {rounds} more "
            f"rounds add an lr one grid step ({steps}) beyond any budget's edge optimum, in "
            f"{len(found)} trunks",
            f"  expected: +{expected / 1e6:,.1f}M tokens (one lr in {EXPECTED_SHARE:.0%} of the "
            "trunks, as in measured sweeps; counted in the estimate above)",
            f"  worst case: +{runs_at_most} runs, +{most / 1e6:,.1f}M tokens "
            f"(grid.lr_search_budget = {fraction:.0%} of the plan's {grid_tokens / 1e6:,.1f}M); "
            "none where every optimum is bracketed"]
