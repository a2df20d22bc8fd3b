"""`python -m critbatch.local_cbs RUN_DIR | OVERRIDES...`: a base run and its local-CBS branches.

RUN_DIR: a run folder made with `train.local_cbs.at_fractions` (its config.json): trains what
it lacks, the base run first when it has not finished, then every branch not finished.
OVERRIDES: Hydra overrides of sweeps/local_cbs.yaml (what `make sweep-local-cbs` trains, e.g.
`scale=smoke optim=muon`; optim.lr defaults to the batch grid's middle lr, as there), trained
into runs/local_cbs/<scale>/<overrides>.
The branches (training/local_cbs.py) and the decision (science/local_cbs.py) live below.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from critbatch.orchestration.stages import middle_lr, plan_stage
from critbatch.results import runs
from critbatch.results.errors import ConfigError, user_errors
from critbatch.training.cli import disk_errors, finished_run
from critbatch.training.loop import train_with_branches
from critbatch.training.saved_config import config_from_saved


def planned_runs(args: list[str]) -> list[tuple]:
    """(config, run folder, overrides) of each base run `args` names (docstring)."""
    if len(args) == 1 and Path(args[0]).is_dir():
        run_dir = Path(args[0])
        saved = runs.read_config(run_dir)
        if saved is None:
            raise ConfigError(f"{run_dir} has no readable config.json; give a run folder made "
                              "by critbatch, or overrides")
        cfg = config_from_saved(saved)
        if not cfg.train.local_cbs.at_fractions:
            raise ConfigError(f"{run_dir} was trained without local-CBS branches "
                              "(train.local_cbs.at_fractions is empty): they fork during the "
                              "base run; train a base with them: python -m critbatch.local_cbs "
                              "scale=<scale> optim=<optim> optim.lr=<lr>")
        overrides = json_overrides(run_dir)
        return [(cfg, run_dir, overrides)]
    scale = next((a.split("=", 1)[1] for a in args if a.startswith("scale=")), "cpu")
    optimizer = next((a.split("=", 1)[1] for a in args if a.startswith("optim=")), "adamw")
    rest = [a for a in args if not a.startswith(("scale=", "optim="))]
    if not any(a.startswith("optim.lr=") for a in rest):  # as make sweep-local-cbs does
        rest.append(f"optim.lr={middle_lr(scale, optimizer)!r}")
    return [(j.cfg, j.run_dir, j.overrides) for j in plan_stage("local_cbs", scale, optimizer,
                                                                 rest)]


def json_overrides(run_dir: Path) -> list[str]:
    """The overrides a run saved in its config.json (its branches inherit them)."""
    try:
        return list(json.loads((run_dir / "config.json").read_text())["overrides"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m critbatch.local_cbs",
        description="Train a base run with local-CBS branches (what it lacks).")
    parser.add_argument("target", nargs="+",
                        help="a base run folder, or Hydra overrides of sweeps/local_cbs.yaml")
    args = parser.parse_args(argv)
    with user_errors(), disk_errors():
        for cfg, run_dir, overrides in planned_runs(args.target):
            print(f"== {run_dir}: the base run and {len(cfg.train.local_cbs.at_fractions)} "
                  "checkpoints of local-CBS branches", flush=True)
            trained = train_with_branches(cfg, run_dir, overrides,
                                          skip_finished=finished_run(run_dir, cfg))
            print(f"== {run_dir}: {len(trained)} run(s) trained; the branches are in "
                  f"{run_dir / 'local_cbs'}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
