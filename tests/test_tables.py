"""External results through tables: `analysis/fit_bcrit.py --table` and `--export-table`.

The peer check fits the steps-to-target table of Zhang et al. 2024, "How Does Critical Batch
Size Scale in Pre-training?" (arXiv:2410.21676), copied in tests/assets (see its README),
and compares S_min and E_min with the authors' published fits.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from critbatch.analysis.bcrit import bcrit, tables
from critbatch.analysis.bcrit.report import export_table
from critbatch.analysis.bcrit.synthetic import synthetic_summary, synthetic_sweep
from critbatch.results import runs as results
from critbatch.results.errors import ResultsError
from critbatch.science.synthetic import SyntheticTruth

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "analysis" / "fit_bcrit.py"
ZHANG = REPO / "tests" / "assets" / "zhang2024_steps_to_target.csv"
# plots/chinchilla.ipynb (commit c5b509d8), cell 14: S(B) = a + b/B with B in sequences of
# 512 tokens; a = S_min (steps), b = E_min (sequences).
ZHANG_PUBLISHED = {
    "85M": (1293.8268694659337, 2834258.0888740215),
    "151M-ablation": (1752.4211962796799, 5677478.783007255),
    "302M": (2095.3497601960876, 11383269.891870424),
    "604M": (2459.9274969089824, 19449688.58779496),
    "1.2B": (3897.306597333535, 43381130.22429582),
}


def fit_bcrit(*args, cwd=REPO):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def analyse_tables(*paths, **kwargs) -> dict:
    loaded = tables.load_tables(list(paths))
    return bcrit.analyse(loaded["runs"], left_out=loaded["left_out"], **kwargs,
                         **loaded["analyse_kwargs"])


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def assert_rows_match(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], float):
                assert y[k] == pytest.approx(x[k], rel=1e-9, nan_ok=True), k
            else:
                assert y[k] == x[k], k


# ---------------------------------------------------------------------------------------------
# Round trip: sweep -> table -> the same fits


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_export_then_table_gives_the_same_fits(tmp_path, suffix):
    synthetic_sweep(tmp_path / "runs", batch_sizes=(64, 256, 1024), all_budgets=True,
                    seeds=(0, 1), seed_loss_offsets=[0.0, 0.004], diverged_high_lr=True)
    loaded = results.load_runs([tmp_path / "runs"], progress=False)
    direct = bcrit.analyse(loaded["runs"])
    rows, skipped = tables.export_rows(loaded["runs"])
    assert not skipped and len(rows) == len(loaded["runs"])
    tables.write_table(rows, tmp_path / f"sweep{suffix}")
    again = analyse_tables(tmp_path / f"sweep{suffix}")
    for key in ("per_run", "pareto", "kaplan"):
        assert_rows_match(direct["fits"][key], again["fits"][key])
    assert {r["method"] for r in again["fits"]["kaplan"]} >= {"per_run", "pareto"}
    # the group keeps its sweep name, and diverged runs stay left out as diverged
    assert {r["group"] for r in again["fits"]["per_run"]} == {
        "synthetic V2048 T64 w64 d2 adamw"}
    assert sum(d["reason"] == "diverged" for d in again["left_out"]) == sum(
        d["reason"] == "diverged" for d in direct["left_out"]) > 0


@pytest.mark.slow
def test_cli_export_table_and_report_from_it(tmp_path):
    synthetic_sweep(tmp_path / "runs")
    proc = fit_bcrit(tmp_path / "runs", "--export-table", tmp_path / "runs.csv")
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "runs" / "report").exists()  # export only
    with open(tmp_path / "runs.csv") as handle:
        header = next(csv.reader(handle))
    assert tuple(header) == tables.EXPORT_COLUMNS
    proc = fit_bcrit("--table", tmp_path / "runs.csv", "--out", tmp_path / "rep",
                     "--wandb", "disabled")
    assert proc.returncode == 0, proc.stderr
    fits = json.loads((tmp_path / "rep" / "fits.json").read_text())
    truth = SyntheticTruth()
    rows = [r for r in fits["per_run"] if r["b_crit"]]
    assert rows and all(r["group"] == "synthetic V2048 T64 w64 d2 adamw" for r in rows)
    # the planted world's B_crit: recovered within 1.2% (2026-12-06); 5% still fails a
    # per-run B_crit off by 30% (the fault this guards)
    for r in rows:
        assert r["b_crit"] == pytest.approx(truth.b_crit, rel=0.05)


# ---------------------------------------------------------------------------------------------
# Steps-to-target rows


def test_steps_to_target_rows_give_pareto_fits_and_kaplan(tmp_path):
    """Rows generated from S = S_min + E_min / B at three targets, for two groups, in JSON
    Lines: each fit returns its S_min and E_min, names its group, and feeds Kaplan's law."""
    planted = {("small", 3.2): (1000.0, 2e6), ("small", 3.0): (2000.0, 6e6),
               ("small", 2.9): (3000.0, 1.2e7), ("big", 2.8): (1500.0, 9e6)}
    lines = []
    for (group, target), (s_min, e_min) in planted.items():
        for b in (32, 128, 512, 2048):
            lines.append({"group": group, "optimizer": "adamw", "batch_size": b,
                          "seq_len": 1024, "target_loss": target, "steps": s_min + e_min / b})
            lines.append({**lines[-1], "steps": lines[-1]["steps"] * 1.5})  # a worse lr
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = analyse_tables(tmp_path / "t.jsonl")
    pareto = result["fits"]["pareto"]
    assert len(pareto) == len(planted)
    for row in pareto:
        label = row["group"].removesuffix(" adamw")
        s_min, e_min = planted[(label, row["target_loss"])]
        assert row["group"] == f"{label} adamw" and row["optimizer"] == "adamw"
        assert row["s_min"] == pytest.approx(s_min, rel=1e-6)
        assert row["e_min"] == pytest.approx(e_min, rel=1e-6)
        assert row["b_crit_tokens"] == pytest.approx(e_min / s_min * 1024, rel=1e-6)
        assert row["degenerate"] is None
    kaplan = {(k["optimizer"], k["method"]): k for k in result["fits"]["kaplan"]}
    assert kaplan[("adamw", "pareto")]["n_points"] == 4
    assert {p["unit"] for p in result["fits"]["kaplan_points"]} == {
        "pareto:small adamw", "pareto:big adamw"}
    assert sorted(g["name"] for g in result["groups"]) == ["big adamw", "small adamw"]


def test_steps_to_target_warnings_name_rows_to_add(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["batch_size", "seq_len", "target_loss", "steps"],
                     [[64, 512, 3.0, 5000], [256, 512, 3.0, 2000], [64, 512, 2.9, 9000]])
    result = analyse_tables(path)
    text = " ".join(result["warnings"])
    assert "two batch sizes: exact fit" in text and "one batch size only (64)" in text
    assert "add" in text and "make" not in text and "rerun" not in text


# ---------------------------------------------------------------------------------------------
# The peer study


@pytest.mark.slow
def test_zhang2024_published_fits_are_reproduced(tmp_path):
    """S_min and E_min per model within 2% of Zhang et al.'s (their fit: unweighted least
    squares of log S; ours: relative errors, weights 1/S). B in sequences of 512 tokens."""
    proc = fit_bcrit("--table", ZHANG, "--out", tmp_path / "rep", "--wandb", "disabled")
    assert proc.returncode == 0, proc.stderr
    fits = json.loads((tmp_path / "rep" / "fits.json").read_text())
    pareto = {r["group"]: r for r in fits["pareto"]}
    assert set(pareto) == set(ZHANG_PUBLISHED)
    for model, (s_min, e_min) in ZHANG_PUBLISHED.items():
        row = pareto[model]
        assert row["s_min"] == pytest.approx(s_min, rel=0.02), model
        assert row["e_min"] == pytest.approx(e_min, rel=0.02), model
        assert row["b_crit_tokens"] == pytest.approx(row["e_min"] / row["s_min"] * 512)
        assert row["degenerate"] is None and row["n_batch_sizes"] == 9
    kaplan = [k for k in fits["kaplan"] if k["method"] == "pareto"]
    assert len(kaplan) == 1 and kaplan[0]["n_points"] == 5
    assert (tmp_path / "rep" / "report.md").exists() and (tmp_path / "rep" / "pareto.png").exists()


# ---------------------------------------------------------------------------------------------
# Run rows and their fix hints


def test_run_rows_without_lr_or_optimizer_are_one_group_with_table_hints(tmp_path):
    path = write_csv(tmp_path / "runs.csv", ["batch_size", "seq_len", "tokens", "loss"],
                     [[16, 512, 2**22, 3.5], [64, 512, 2**22, 3.6]])
    result = analyse_tables(path)
    assert [g["name"] for g in result["groups"]] == [tables.DEFAULT_GROUP]
    text = " ".join(result["warnings"])
    assert "add rows of batch 16 at 2 more token budget(s)" in text
    assert "trained at one lr only" in text
    assert "make " not in text and "python -m" not in text


def test_sweep_folders_keep_their_sweep_hints(tmp_path):
    synthetic_sweep(tmp_path, batch_sizes=(), budgets_tokens=(2**22,))
    loaded = results.load_runs([tmp_path], progress=False)
    text = " ".join(bcrit.analyse(loaded["runs"])["warnings"])
    assert "make sweep-batch" in text and "add rows" not in text


# ---------------------------------------------------------------------------------------------
# Bad tables: one line naming the file, the row and the column; exit 2


@pytest.mark.parametrize("name, content, expected", [
    ("missing.csv", "batch_size,seq_len,tokens\n16,512,1000000\n",
     ["row 1 (the header)", "no column loss", "add it"]),
    ("text.csv", "batch_size,seq_len,tokens,loss\n16,512,1000000,3.4\n16,512,lots,3.2\n",
     ["row 3", "column tokens", "'lots' is not a positive whole number"]),
    ("empty.csv", "", ["the file is empty", "write a header row"]),
    ("runs.xlsx", "batch_size\n", ["unknown table format '.xlsx'", ".csv", ".jsonl"]),
    ("missing.jsonl", '{"batch_size": 16, "seq_len": 512, "target_loss": 3.0}\n',
     ["row 1", "no column steps"]),
    ("negative.jsonl", '\n{"batch_size": 16, "seq_len": 512, "target_loss": 3.0, '
     '"steps": -4}\n', ["row 2", "column steps", "not a positive number"]),
    ("schedule.csv", "batch_size,seq_len,tokens,loss,schedule\n16,512,1000000,3.4,wsdd\n",
     ["row 2", "column schedule", "'wsdd' is not one of wsd, constant, cosine, linear"]),
    ("cooldown.csv", "batch_size,seq_len,tokens,loss,cooldown_fraction\n16,512,1000000,3.4,1.5\n",
     ["row 2", "column cooldown_fraction", "is not a number in (0, 1]"]),
    ("readings.jsonl", '{"batch_size": 16, "seq_len": 512, "tokens": 1000000, "loss": 3.4, '
     '"noise_readings": [{"step": 10}]}\n', ["row 1", "column noise_readings",
                                              "not a list of readings"]),
])
def test_bad_table_is_one_line_with_file_row_column(tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_text(content)
    proc = fit_bcrit("--table", path, "--wandb", "disabled")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], proc.stderr
    for text in expected:
        assert text in lines[0]
    assert "rerun" not in lines[0] and "make " not in lines[0]


def test_table_and_paths_together_are_refused(tmp_path):
    proc = fit_bcrit(tmp_path, "--table", ZHANG)
    assert proc.returncode == 2 and "one of PATHS, --from-wandb or --table" in proc.stderr


def test_lr_column_must_be_filled_in_every_run_row(tmp_path):
    path = write_csv(tmp_path / "lr.csv", ["batch_size", "seq_len", "tokens", "loss", "lr"],
                     [[16, 512, 10**6, 3.4, 1e-3], [16, 512, 2 * 10**6, 3.3, ""]])
    with pytest.raises(ResultsError, match=r"lr.csv row 3, column lr: empty"):
        tables.read_table(path)


# ---------------------------------------------------------------------------------------------
# W&B: every job type but the reports'


class FakeRun:
    def __init__(self, name: str, job_type: str, summary: dict):
        self.path = ["me", "proj", name]
        self.job_type = job_type
        self.config = {}
        self.summary = {k: v for k, v in summary.items() if k != "curve"}
        self._history = [{"_step": p["step"], **p} for p in summary["curve"]]

    def scan_history(self, keys=None):
        return list(self._history)


def test_wandb_runs_of_every_job_type_but_analysis(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    truth = SyntheticTruth()
    made = {"b16": ("baseline", 16), "b64": ("batch", 64), "single": ("train", 32),
            "report": ("analysis", 16), "noise": ("noise", 16)}
    fake_runs = [FakeRun(name, job, synthetic_summary(truth, batch_size=b, tokens=2**22,
                                                      lr=1e-3))
                 for name, (job, b) in made.items()]
    asked = {}

    class FakeApi:
        def runs(self, path, filters=None):
            asked.update(path=path, filters=filters)
            return fake_runs

    monkeypatch.setattr(wandb, "Api", FakeApi)
    loaded = results.load_wandb_runs("me/proj", group="batch-cpu")
    assert asked == {"path": "me/proj", "filters": {"group": "batch-cpu"}}
    assert sorted(r["run_dir"] for r in loaded["runs"]) == [
        "wandb:me/proj/b16", "wandb:me/proj/b64", "wandb:me/proj/single"]
    assert not loaded["left_out"]
    # and the W&B runs export through the same table rows as local folders
    rows = export_table(str(tmp_path / "wandb.jsonl"), from_wandb="me/proj")
    assert [r["batch_size"] for r in rows] == [16, 64, 32]
    again = tables.read_table(tmp_path / "wandb.jsonl")[0]
    assert [r["run_dir"] for r in again] == [r["run"] for r in rows]
    assert all(math.isclose(a["val_loss"], r["loss"]) for a, r in zip(again, rows, strict=True))


def test_a_table_s_warnings_speak_of_rows_not_of_a_sweep_s_config(tmp_path, capsys):
    """Every fix a sweep's warning gets has a table counterpart that names rows and columns,
    never `grid.*` or `train.*` keys; a thin table's printed warnings and report hold none."""
    from critbatch.analysis import render
    from critbatch.analysis.bcrit.cli import main

    assert [p for p, _ in render.TABLE_WARNING_FIXES] == [p for p, _ in render.WARNING_FIXES]
    assert not any("grid." in fix or "train." in fix for _, fix in render.TABLE_WARNING_FIXES)
    table = tmp_path / "runs.csv"
    table.write_text("batch_size,seq_len,tokens,loss,lr,warmup_steps\n"
                     "8,64,32000,4.6,1e-3,100\n8,64,64000,4.4,1e-3,100\n8,64,128000,4.3,1e-3,100\n"
                     "8,64,128000,4.5,2e-3,100\n16,64,64000,4.5,1e-3,100\n"
                     "16,64,128000,4.4,1e-3,100\n")
    main(["--table", str(table), "--out", str(tmp_path / "out"), "--wandb", "disabled"])
    printed = capsys.readouterr().out
    report = (tmp_path / "out" / "report.md").read_text()
    warnings = report.split("## Warnings", 1)[1]
    assert "warmup" in warnings and "a second seed (a seed column)" in warnings
    assert "grid." not in warnings and "`train." not in warnings
    assert "grid." not in printed and "`train." not in printed
