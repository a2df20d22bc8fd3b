"""The report folder and the `analysis/fit_bcrit.py` command line, end to end."""

from __future__ import annotations

import csv
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from critbatch.analysis import render
from critbatch.analysis.bcrit import markdown, plots, report
from critbatch.analysis.bcrit.report import majority_logged_group
from critbatch.analysis.bcrit.synthetic import synthetic_sweep
from critbatch.results.errors import ResultsError

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "analysis" / "fit_bcrit.py"
OUTPUTS = ("report.md", "fits.json", "bcrit.csv", *(f"{name}.png" for name in plots.PLOTS))
PER_RUN_KEYS = {"run_dir", "optimizer", "batch_size", "tokens", "val_loss", "effective_tokens",
                "r", "b_crit", "b_crit_low", "b_crit_high", "extrapolated"}
PARETO_KEYS = {"optimizer", "target_loss", "s_min", "e_min", "b_crit", "b_crit_low",
               "b_crit_high"}
KAPLAN_KEYS = {"optimizer", "method", "b_star_tokens", "b_star_tokens_low", "b_star_tokens_high",
               "exponent", "exponent_low", "exponent_high", "n_points", "interval"}


def fit_bcrit(*args, cwd=REPO):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_cli_end_to_end_writes_every_output(tmp_path):
    synthetic_sweep(tmp_path / "runs", batch_sizes=(64, 256, 1024, 2048), all_budgets=False,
                    optimizers=("adamw", "muon"))
    synthetic_sweep(tmp_path / "runs", batch_sizes=(64, 256), all_budgets=True,
                    optimizers=("adamw",), widths=(128,))
    out = tmp_path / "report"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = fit_bcrit(tmp_path / "runs", "--out", out)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr
    for name in OUTPUTS:
        assert (out / name).stat().st_size > 0, name
    assert list((out / "wandb").glob("offline-run-*")), "W&B analysis run not logged offline"
    # CPU seconds of the analysis process, which a busy machine does not inflate as it does
    # wall time: on a 2-vCPU AMD EPYC this world took 80-91 s (2026-12-02; under 30 s wall
    # on the Intel machines before), most of it the joint model's 100 bootstrap refits and
    # three held-out refits of two widths. The bound catches a regression by 2.5x or more.
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert cpu_s < 240, cpu_s

    fits = json.loads((out / "fits.json").read_text())
    assert set(fits) == {"per_run", "pareto", "kaplan", "kaplan_points", "lr_scaling",
                         "warnings", "online_noise", "consistency", "joint", "summary",
                         "lr_edge_cells", "lr_search", "noise_ratio"}
    assert set(fits["lr_edge_cells"]) <= {"adamw", "muon"} and fits["lr_search"] == {}
    assert set(fits["noise_ratio"]) == {"adamw", "muon"}
    assert all({"ratio", "low", "high", "losses"} <= set(v) for v in fits["noise_ratio"].values())
    assert all(set(r) >= PER_RUN_KEYS for r in fits["per_run"])
    assert all(set(p) >= PARETO_KEYS for p in fits["pareto"]) and fits["pareto"]
    assert fits["kaplan"] and all(set(row) >= KAPLAN_KEYS for row in fits["kaplan"])
    assert {row["optimizer"] for row in fits["kaplan"]} == {"adamw", "muon"}
    assert set(fits["lr_scaling"]) == {"adamw", "muon"}
    assert all("exponent" in v for v in fits["lr_scaling"].values())
    assert all(f"{k}_tokens" in r for r in fits["per_run"] for k in ("b_crit", "b_crit_low",
                                                                      "b_crit_high"))
    with open(out / "bcrit.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(fits["per_run"]) and float(rows[0]["b_crit"]) > 0

    text = (out / "report.md").read_text()
    for heading in ("## Groups", "## Loss at the best learning rate",
                    "## Effective tokens and B_crit per run", "## B_noise measured",
                    "## Pareto frontier", "## Kaplan's law", "## Learning rate versus batch",
                    "## Warnings"):
        assert heading in text, heading
    assert "synthetic V2048 T64 w128 d2 adamw" in text and "extrapolated" in text
    assert "report:" in proc.stdout


@pytest.fixture
def fit_bcrit_main(analysis_main):
    """`main` of analysis/fit_bcrit.py, imported from its file (in-process: fast)."""
    return analysis_main(SCRIPT.name)


def age_runs(folder: Path, seconds: float) -> None:
    """Make every summary.json under `folder` `seconds` old."""
    then = time.time() - seconds
    for path in folder.rglob("summary.json"):
        os.utime(path, (then, then))


@pytest.mark.parametrize("newest", ["batch", "widths"])
def test_default_paths_pick_the_latest_sweep_not_a_single_run(tmp_path, monkeypatch, capsys,
                                                              fit_bcrit_main, newest):
    """No PATHS: the most recently written runs/batch/<scale> or runs/widths/<scale>, never a
    newer ad-hoc run (runs/single, runs/multirun) or another study's sweep; one line says
    which folder and why."""
    runs = tmp_path / "runs"
    # runs/<stage>/<scale>/<run>: here the "scale" level is synthetic_sweep's adamw_w64
    for sweep in ("batch", "widths"):
        synthetic_sweep(runs, batch_sizes=(64,), budgets_tokens=(2**22, 2**23, 2**24),
                        sweep=sweep)
    older = "widths" if newest == "batch" else "batch"
    age_runs(runs / older, 3600)
    age_runs(runs / newest, 180)
    # newer, but not sweeps of this study: a single run, an ad-hoc multirun, a stability sweep
    summary = next((runs / newest).rglob("summary.json")).read_text()
    for run_dir in (runs / "single" / "2026-12-01_10-00-00",
                    runs / "multirun" / "2026-12-01_10-00-00" / "0",
                    runs / "stability" / "cpu" / "b64"):
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(summary)
    monkeypatch.chdir(tmp_path)
    fit_bcrit_main(["--wandb", "disabled"])
    printed = capsys.readouterr().out.splitlines()
    folder = Path("runs") / newest / "adamw_w64"
    assert printed[0] == (f"no paths given: analysing {folder}, the most recent batch or "
                          "widths sweep (its newest run finished 3 min ago)")
    fits = json.loads((folder / "report" / "fits.json").read_text())
    analysed = {r["run_dir"] for r in fits["per_run"]}
    assert analysed and all(f"{newest}/adamw_w64" in d for d in analysed)


def test_default_paths_without_a_sweep_is_a_one_line_error(tmp_path, monkeypatch, capsys,
                                                          fit_bcrit_main):
    synthetic_sweep(tmp_path, batch_sizes=(), budgets_tokens=(2**20,), lr_multipliers=(1.0,))
    single = tmp_path / "runs" / "single" / "2026-12-01_10-00-00"
    single.mkdir(parents=True)
    (single / "summary.json").write_text(next(tmp_path.rglob("summary.json")).read_text())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        fit_bcrit_main(["--wandb", "disabled"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "no batch or widths sweep with finished runs under runs/" in err
    assert "runs/batch/<scale>/" in err and "make sweep-batch" in err


def test_sweep_folder_age_reads_in_words():
    folder = render.SweepFolder(Path("runs/batch/cpu"), newest_s=1000.0)
    assert folder.age(now=1030.0) == "just now"
    assert folder.age(now=1000.0 + 3 * 60 + 5) == "3 min ago"
    assert folder.age(now=1000.0 + 5 * 3600) == "5 h ago"
    assert folder.age(now=1000.0 + 3 * 86400) == "3 days ago"


@pytest.mark.slow
def test_a_group_from_several_sweeps_is_labelled_with_all_of_them(tmp_path):
    """The groups table names a group's sweep; when its runs come from several (an old
    folder's `baseline` stage beside the `batch` sweep), each with its count, never the
    majority alone."""
    synthetic_sweep(tmp_path, batch_sizes=(), budgets_tokens=(2**20, 2**21, 2**22, 2**23),
                    sweep="baseline")  # 4 budgets x 3 lrs
    synthetic_sweep(tmp_path, batch_sizes=(64, 256), budgets_tokens=(2**24,),
                    sweep="batch")  # 3 batch sizes x 3 lrs
    out = report.run_analysis([str(tmp_path)], str(tmp_path / "rep"), wandb_mode="disabled",
                              resamples=20)
    groups = out["result"]["groups"]
    assert len(groups) == 1 and markdown.sweep_label(groups[0]) == (
        "mixed: baseline (12 runs), batch (9 runs)")
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "| mixed: baseline (12 runs), batch (9 runs) |" in text
    assert "| baseline |" not in text
    synthetic_sweep(tmp_path / "one", batch_sizes=(64,), sweep="batch")
    one = report.run_analysis([str(tmp_path / "one")], str(tmp_path / "rep1"),
                              wandb_mode="disabled", resamples=20)
    assert markdown.sweep_label(one["result"]["groups"][0]) == "batch"


def test_no_runs_found_is_a_one_line_error(tmp_path):
    proc = fit_bcrit(tmp_path, "--wandb", "disabled")
    assert proc.returncode == 2
    assert proc.stderr.startswith("critbatch: error: no runs found")
    assert proc.stderr.count("\n") == 1
    proc = fit_bcrit(cwd=tmp_path)  # no runs/ folder at all
    assert proc.returncode == 2 and "no batch or widths sweep" in proc.stderr


def test_only_corrupt_or_diverged_runs_is_an_error(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text("{not json")
    synthetic_sweep(tmp_path, batch_sizes=(), budgets_tokens=(2**20,), lr_multipliers=(1.0,))
    bad = next(tmp_path.glob("synthetic/*/*/summary.json"))
    summary = json.loads(bad.read_text())
    summary.update(status="diverged", val_loss=float("nan"))
    bad.write_text(json.dumps(summary))
    proc = fit_bcrit(tmp_path, "--wandb", "disabled")
    assert proc.returncode == 2
    assert "all 2 runs were left out (1 corrupt, 1 diverged)" in proc.stderr
    with pytest.raises(ResultsError):
        report.run_analysis([str(tmp_path)], str(tmp_path / "r"), wandb_mode="disabled")


@pytest.mark.slow
def test_thin_data_gives_a_partial_report(tmp_path):
    synthetic_sweep(tmp_path, batch_sizes=(), budgets_tokens=(2**24,))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("[]")
    proc = fit_bcrit(tmp_path, "--out", tmp_path / "rep", "--wandb", "disabled")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "one batch size only" in text and "make sweep-batch" in text
    assert "corrupt" in text and "is not a JSON object" in text
    fits = json.loads((tmp_path / "rep" / "fits.json").read_text())
    assert fits["per_run"] == [] and fits["kaplan"] == []
    for name in OUTPUTS:
        assert (tmp_path / "rep" / name).exists(), name


def test_cli_rejects_group_without_wandb(tmp_path):
    proc = fit_bcrit(tmp_path, "--group", "x")
    assert proc.returncode == 2 and "--group needs --from-wandb" in proc.stderr


def test_json_clean_makes_strict_json():
    import numpy as np

    cleaned = render.json_clean({"a": float("nan"), "b": [np.float64(1.5), float("inf")]})
    assert json.dumps(cleaned, allow_nan=False) == '{"a": null, "b": [1.5, null]}'


def test_wandb_group_follows_the_trainer(tmp_path):
    synthetic_sweep(tmp_path, batch_sizes=(64,), sweep="batch")
    from critbatch.analysis.bcrit.bcrit import analyse
    from critbatch.results.runs import load_runs

    result = analyse(load_runs([tmp_path], progress=False)["runs"])
    assert majority_logged_group(result["groups"]) == "batch"  # no config.json: the sweep name
    run_dir = Path(result["groups"][0]["cells"][0].run_dir)
    (run_dir / "config.json").write_text(json.dumps({"config": {"logger": {"group":
                                                                           "batch-cpu"}}}))
    assert majority_logged_group(result["groups"]) == "batch-cpu"


@pytest.mark.slow
def test_analysis_never_imports_the_trainer_or_torch(tmp_path):
    synthetic_sweep(tmp_path, batch_sizes=(64,))
    code = "\n".join([
        "import sys",
        "from critbatch.analysis.bcrit.report import run_analysis",
        f"run_analysis([{str(tmp_path)!r}], {str(tmp_path / 'rep')!r}, wandb_mode='disabled')",
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'"
        " or m.startswith('critbatch.training')))",
    ])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_warnings_are_grouped_counted_and_name_their_fix():
    from critbatch.analysis.render import warning_lines, warnings_section

    warnings = [f"stdlib V2048 T64 w64 d2 adamw: batch {b} at {t:,} tokens has its best lr on "
                f"the high edge of the grid (0.0{b}); widen the lr grid"
                for b, t in [(64, 184_320), (128, 368_640), (32, 186_368)]]
    warnings += ["joint model (muon): chi2/dof = 7.65: the losses scatter about the model"]
    section = warnings_section(warnings)
    assert "4 warning(s) of 2 kind(s)" in section[2]
    head = next(line for line in section if line.startswith("- **3 x"))
    assert "`grid.lrs.adamw`" in head  # the override that fixes it, for the one optimizer
    assert sum(line.startswith("  - ") for line in section) == 3  # every instance kept
    assert "- joint model (muon): chi2/dof = 7.65" in "\n".join(section)
    printed = warning_lines(warnings)
    assert len(printed) == 2 and "(3 like it; all in report.md)" in printed[0]
