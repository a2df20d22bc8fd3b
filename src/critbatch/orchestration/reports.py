"""A study's report: its analysis script over its sweep folders, skipped when the report is
up to date with them (`analyse_sweep`), and every study's report again at once, without
training (`report_all`: `python -m critbatch.sweep report`, `make report`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from critbatch.orchestration import report_inputs
from critbatch.orchestration.experiments import ANALYSIS_DIR, EXPERIMENTS, REPO, Experiment
from critbatch.results.errors import ResultsError


def analyse_sweep(exp: Experiment, folders: list[str], out: Path, title: str,
                  force: bool = False, wandb_mode: str | None = None) -> bool:
    """Run the experiment's analysis script over `folders` into `out`, unless (without
    `force`) the report there was written from the same inputs (`report_inputs`); True if it
    succeeded or was up to date. `wandb_mode`: how the report goes to W&B (the runs'
    logger.mode: a sweep trained with W&B disabled logs no report either); None: the
    script's default."""
    script = ANALYSIS_DIR / exp.analysis
    args = [*folders, "--out", str(out)]
    if wandb_mode and exp.wandb:
        args += ["--wandb", wandb_mode]
    if exp.compare_with:  # out is <runs>/<stage>/<scale>/report
        other = out.parents[2] / exp.compare_with / out.parent.name
        if (other / "report" / "fits.json").is_file():
            args += ["--batch-sweep", str(other)]
    stamp = report_inputs.fingerprint(folders, args, ANALYSIS_DIR)
    if not force and report_inputs.up_to_date(out, stamp):
        print(f"\n== {title}: {out / 'report.md'} is up to date (no run, noise measurement or "
              f"analysis code changed since it was written; `make report` redoes it)", flush=True)
        return True
    print(f"\n== {title}: python {script.relative_to(REPO)} {' '.join(args)}", flush=True)
    if subprocess.call([sys.executable, "-u", str(script), *args]) != 0:  # lines as they come
        return False
    report_inputs.record(out, stamp)
    return True


def report_all(runs_root: Path = Path("runs")) -> int:
    """Re-run the analysis of every experiment's sweeps found under `runs_root` (no
    training): one report per experiment and scale, where it stands after a sweep. Returns
    the number of analyses that failed."""
    done = failed = 0
    for name, exp in EXPERIMENTS.items():
        scales = sorted(d.name for d in (runs_root / exp.report_stage).glob("*") if d.is_dir())
        for scale in scales:
            folders = [str(runs_root / stage / scale) for stage in exp.stages
                       if (runs_root / stage / scale).is_dir()]
            out = runs_root / exp.report_stage / scale / "report"
            done += 1
            if not analyse_sweep(exp, folders, out, f"{name} at scale={scale}", force=True):
                failed += 1
                print(f"warning: the {name} analysis at scale={scale} failed (its message is "
                      "above)")
    if not done:
        raise ResultsError(f"no sweep folders under {runs_root}/ (runs/<stage>/<scale>); run a "
                           "sweep first, e.g. make sweep-batch")
    print(f"\n{done - failed}/{done} reports written")
    return failed
