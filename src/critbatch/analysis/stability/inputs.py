"""Where the stability study's runs come from: the stage folders of the latest scale
(`default_inputs`), the report folder beside them (`default_out`), and the runs with their
per-step metrics (`load_stability_runs`).

The sweeps write three stages, `runs/<stage>/<scale>/<override_dirname>/` (`rules.STAGES`);
the report goes to `runs/stability/<scale>/report`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from critbatch.analysis import render
from critbatch.analysis.stability.rules import BATCH_STAGE, STAGES
from critbatch.results.errors import ResultsError
from critbatch.results.runs import is_number, load_runs, read_metrics


def stage_scale(path: str | Path) -> tuple[Path, str] | None:
    """(runs root, scale) when `path` lies in `<root>/<stage>/<scale>/...` of a stability
    stage; else None."""
    parts = Path(path).resolve().parts
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in STAGES:
            return Path(*parts[:i]), parts[i + 1]
    return None


def default_inputs(runs_root: str | Path = "runs") -> tuple[list[Path], Path, str]:
    """The stage folders of the most recently written scale under `runs_root`.

    Returns (paths, report folder `runs/stability/<scale>/report`, a sentence saying so). The
    scale is the one whose newest summary.json, over the three stages, is the most recent.
    """
    root = Path(runs_root)
    scale = render.latest_scale(root, STAGES)
    if scale is None:
        raise ResultsError(f"no stability runs under {root}/ (looked in "
                           f"{', '.join(f'{s}/<scale>/' for s in STAGES)}); pass run "
                           "directories, or run the stability sweep first")
    paths = [root / stage / scale for stage in STAGES if (root / stage / scale).is_dir()]
    sentence = ("no paths given: analysing the latest stability study, "
                + " and ".join(str(p) for p in paths))
    return paths, root / BATCH_STAGE / scale / "report", sentence


def default_out(paths: list[Path]) -> Path:
    """`<root>/stability/<scale>/report` when every path lies in a stage folder of one scale;
    otherwise `<common folder>/report` (`render.default_out`)."""
    found = {stage_scale(p) for p in paths}
    if len(found) == 1 and None not in found:
        root, scale = found.pop()
        return root / BATCH_STAGE / scale / "report"
    return render.default_out(paths)


def _num(x: Any) -> float:
    return float(x) if is_number(x) else math.nan


def clean_metrics(rows: list) -> list[dict]:
    """Per-step rows sorted by step, one per step (the last written wins), with `train_loss`
    and `grad_norm` as floats (NaN when missing or not a number)."""
    by_step: dict[int, dict] = {}
    for row in rows:
        if isinstance(row, dict) and is_number(row.get("step")):
            by_step[int(row["step"])] = {
                **row, "step": int(row["step"]),
                "train_loss": _num(row.get("train_loss")), "grad_norm": _num(row.get("grad_norm"))}
    return [by_step[s] for s in sorted(by_step)]


def load_stability_runs(paths: list[str | Path]) -> dict:
    """Read the runs under `paths` (`runs.load_runs`) and each run's `metrics.jsonl`.

    Returns {"runs", "left_out", "warnings"} like `load_runs`; each run gains `stage` (its
    sweep) and `metrics` (clean per-step rows; [] when metrics.jsonl is missing, with a
    warning). A run of another sweep is left out with reason "other sweep".
    """
    loaded = load_runs(paths, progress=False)
    runs, left_out, warnings = [], list(loaded["left_out"]), list(loaded["warnings"])
    for run in loaded["runs"]:
        if run.get("sweep") not in STAGES:
            left_out.append({"run_dir": run["run_dir"], "reason": "other sweep",
                             "detail": f"sweep {run.get('sweep')!r} is not a stability stage "
                                       f"({', '.join(STAGES)})"})
            continue
        try:
            rows = clean_metrics(read_metrics(run["run_dir"]))
            problem = None if rows else "metrics.jsonl holds no rows"
        except FileNotFoundError:
            rows, problem = [], "no metrics.jsonl"
        except (OSError, UnicodeDecodeError) as err:
            rows, problem = [], f"metrics.jsonl unreadable ({type(err).__name__})"
        if problem:
            warnings.append(f"{run['run_dir']}: {problem}; its verdict rests on summary.json "
                            "alone")
        runs.append({**run, "stage": run["sweep"], "metrics": rows})
    return {"runs": runs, "left_out": left_out, "warnings": warnings}

