"""A sweep's run folders -> `--export-table` -> `--table`: the same fits.json, intervals included.

The folders are the branched design of `make sweep-batch` (`synthetic_branched_sweep`: a wsd
run per batch and lr with cooldown branches, `branch_of` naming their trunk, the online
tracker's B_noise on every eval point), with what a real sweep adds: noise.json from the
noise program on three runs (one unresolved), the online tracker's end-of-run B_noise in
each main run's summary, and a warmup long enough that the largest batch's shortest branch is
flagged. Each of these was lost by the table before (issue 23, item 9): B_noise, the trunks
(the per-run Kaplan bootstrap resampled 9 runs instead of 5 trunks), the warmup flag and the
joint model's width labels.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from critbatch.analysis.bcrit import best_lr, tables
from critbatch.analysis.bcrit import cli as fit_bcrit_cli
from critbatch.analysis.bcrit import report as bcrit_report
from critbatch.analysis.bcrit.synthetic import NoiseLaw, synthetic_branched_sweep, synthetic_sweep
from critbatch.results import runs as results
from critbatch.results.errors import ResultsError
from critbatch.results.files import write_json_atomic

# The columns of a table written before the trunk, warmup, model and B_noise columns.
OLD_COLUMNS = ("run", "group", "optimizer", "lr", "seed", "status", "batch_size", "seq_len",
               "tokens", "loss", "bytes_per_token", "params")
NOISE_RUNS = ("b8_lr1_s0", "b32_lr1_s0", "b128_lr1_s0")  # noise.json, at three losses
UNRESOLVED_RUN = "b64_lr1_s0"  # noise.json with |G|^2 <= 0
LONG_WARMUP = 50  # steps, on batch 128: its 1/8 branch (128 steps) is < 3 x 50


def noise_json(summary: dict, law: NoiseLaw, resolved: bool = True) -> dict:
    """noise.json (results.NOISE_KEYS) as the noise program writes it, at the run's end."""
    seq_len, loss = summary["seq_len"], summary["val_loss"]
    b = law.b_noise(loss, seq_len) if resolved else None
    return {"schema_version": 1, "step": summary["steps"], "tokens": summary["tokens"],
            "seq_len": seq_len, "micro_batches": 128, "micro_batch_size": 4,
            "val_loss": loss, "val_loss_per_byte": summary["val_loss_per_byte"],
            "g2": 0.04 if resolved else -0.01, "trace": 28.0, "b_noise": b,
            "b_noise_tokens": b * seq_len if resolved else None,
            "b_noise_low": 0.86 * b if resolved else None,
            "b_noise_high": 1.16 * b if resolved else None, "resolved": resolved,
            "interval": "68%: jackknife over 16 groups of micro-batches, log B_noise"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> dict:
    """The run folders, their loaded runs and the fits.json analysed from the folders."""
    root = tmp_path_factory.mktemp("roundtrip") / "runs"
    law = NoiseLaw()
    synthetic_branched_sweep(root, noise_law=law)
    for path in sorted(root.rglob("summary.json")):
        summary = json.loads(path.read_text())
        if summary["batch_size"] == 128:
            summary["warmup_steps"] = LONG_WARMUP
        if not summary.get("branch_of"):  # the online tracker's end-of-run value
            loss = summary["val_loss"] + 0.3  # a training loss (EMA), above the final eval's
            b = law.b_noise(loss, summary["seq_len"])
            summary.update(b_noise=b, b_noise_tokens=b * summary["seq_len"], b_noise_loss=loss)
        write_json_atomic(path, summary)
        if path.parent.name in NOISE_RUNS + (UNRESOLVED_RUN,):
            write_json_atomic(path.parent / "noise.json",
                              noise_json(summary, law, path.parent.name != UNRESOLVED_RUN))
    loaded = results.load_runs([root], progress=False)
    direct = bcrit_report.analyse(loaded["runs"], left_out=loaded["left_out"])
    return {"root": root, "loaded": loaded, "direct": direct,
            "fits": bcrit_report.fits_document(direct)}


def fits_from_table(path: Path) -> tuple[dict, dict]:
    """(result, fits.json document) of `bcrit_report.analyse` on a table, as --table runs it."""
    loaded = tables.load_tables([path])
    result = bcrit_report.analyse(loaded["runs"], left_out=loaded["left_out"],
                                  **loaded["analyse_kwargs"])
    return result, bcrit_report.fits_document(result)


def differences(a, b, path: str = "") -> list[str]:
    """Where two JSON-like documents differ (NaN equals NaN); empty when they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a.keys() ^ b.keys())}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} against {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b and type(a) is type(b) else [f"{path}: {a!r} against {b!r}"]


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_exported_table_gives_the_same_fits_and_intervals(sweep, tmp_path, suffix):
    table = tmp_path / f"sweep{suffix}"
    bcrit_report.export_table(str(table), [str(sweep["root"])])
    result, fits = fits_from_table(table)
    expected = sweep["fits"]
    # every fit and interval of fits.json, to the bit; the warnings differ only in the words of
    # the fix (rows to add to a table, not sweeps to run)
    for key in bcrit_report.FITS_KEYS:
        if key != "warnings":
            assert differences(expected[key], fits[key]) == [], key
    assert len(fits["warnings"]) == len(expected["warnings"])
    assert differences(sweep["direct"]["noise"], result["noise"]) == []

    # what the equality is made of: none of it is empty or trivially equal
    kaplan = {r["method"]: r for r in fits["kaplan"]}
    assert set(kaplan) == {"per_run", "pareto", "noise", "online_noise", "joint"}
    per_run = kaplan["per_run"]
    assert per_run["n_units"] < per_run["n_points"]  # branches share their trunk's unit
    assert per_run["exponent_low"] < per_run["exponent_high"]
    assert kaplan["noise"]["n_points"] == len(NOISE_RUNS)
    assert fits["online_noise"] and fits["joint"]["adamw"]["widths"] == ["width 64 depth 2"]
    assert any(r.get("few_steps") for r in fits["per_run"])  # the warmup flag came back
    assert any(p.get("unresolved") for p in result["noise"])
    assert {p["kind"] for p in result["noise"] if "loss" in p} == {"b_noise",
                                                                   "b_noise_online"}


def test_an_old_table_without_the_new_columns_still_loads(sweep, tmp_path):
    """Rows of the first export format: each run its own trunk, no warmup flag, no B_noise."""
    rows, _ = tables.export_rows(sweep["loaded"]["runs"])
    path = tmp_path / "old.csv"
    path.write_text(tables.csv_text(OLD_COLUMNS, [
        {k: "" if r[k] is None or r[k] != r[k] else r[k] for k in OLD_COLUMNS} for r in rows]))
    loaded = tables.load_tables([path])
    runs = loaded["runs"]
    assert len(runs) == len(rows)
    assert all(r["branch_of"] is None and r["warmup_steps"] is None and r["noise"] is None
               and r["b_noise"] is None and len(r["curve"]) == 1 for r in runs)
    assert {r["group_label"] for r in runs} == {"synthetic V2048 T64 w64 d2"}
    by_run = {r["run_dir"]: r for r in sweep["loaded"]["runs"]}
    assert all(r["val_loss"] == by_run[r["run_dir"]]["val_loss"] for r in runs)


@pytest.mark.slow
def test_report_of_a_table_goes_beside_it_as_help_says(tmp_path, capsys):
    synthetic_sweep(tmp_path / "runs", batch_sizes=(64, 256))
    table = tmp_path / "tables" / "grid.csv"
    fit_bcrit_cli.main([str(tmp_path / "runs"), "--export-table", str(table)])
    fit_bcrit_cli.main(["--table", str(table), "--wandb", "disabled"])
    assert (tmp_path / "tables" / "grid-report" / "fits.json").exists()
    assert not (tmp_path / "runs" / "report").exists()
    with pytest.raises(SystemExit):
        fit_bcrit_cli.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "with --table grid.csv, grid-report beside the table" in help_text


@pytest.mark.parametrize("cells, expected", [
    ({"curve": "[{"}, "row 2, column curve: not valid JSON"),
    ({"curve": '[{"step": 1}]'}, "row 2, column curve: not a list of eval points"),
    ({"noise": '{"b_noise": 3}'}, "row 2, column noise lacks"),
    ({"b_noise": "700"}, "row 2, column b_noise_loss: empty beside b_noise"),
    ({"width": "0.5"}, "row 2, column width: '0.5' is not a positive whole number"),
])
def test_bad_new_cells_are_one_line_naming_row_and_column(tmp_path, cells, expected):
    row = {"batch_size": 8, "seq_len": 64, "tokens": 65536, "loss": 3.5, **cells}
    path = tmp_path / "t.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    with pytest.raises(ResultsError, match=expected.replace("(", r"\(").replace("[", r"\[")):
        tables.read_table(path)


def test_branch_of_names_its_trunk_by_run_or_folder_name(tmp_path):
    """Cooldown branches of a table from another codebase share their trunk, whether
    `branch_of` holds the parent's whole `run` or its last part."""
    path = tmp_path / "t.csv"
    path.write_text("run,branch_of,batch_size,seq_len,tokens,loss\n"
                    "exp/main,,8,64,65536,3.5\n"
                    "exp/main/cool1,exp/main,8,64,32768,3.7\n"
                    "exp/main/cool2,main,8,64,16384,3.9\n"
                    "exp/other,,8,64,65536,3.6\n")
    runs, _ = tables.read_table(path)
    assert best_lr.trunks(runs) == {"exp/main": "exp/main", "exp/main/cool1": "exp/main",
                                  "exp/main/cool2": "exp/main", "exp/other": "exp/other"}
