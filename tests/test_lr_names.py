"""The lr a run trained, named beside the base lr its folder is named by: train.log's first
lines, the run's last console line, summary.json and the B_crit report's loss table."""

from __future__ import annotations

import json
import math
import sys

import pytest

from critbatch.analysis.bcrit import markdown as bcrit_markdown
from critbatch.analysis.bcrit import report as bcrit_report
from critbatch.analysis.bcrit.synthetic import synthetic_sweep
from critbatch.results.runs import load_runs
from critbatch.training import cli
from critbatch.training.trainer import lr_words


@pytest.mark.parametrize(("overrides", "lr", "batch", "words"), [
    (["optim.lr_scaling=sqrt", "optim.lr=0.0016", "optim.base_batch_size=4"], 0.0032, 16,
     "base lr 0.0016 (optim.lr, at batch 4), trained at 0.0032 by the sqrt rule at batch 16"),
    (["optim.lr_scaling=linear", "optim.lr=0.001", "optim.base_batch_size=8"], 0.001, 8,
     "lr 0.001 (optim.lr, trained as given at its base batch 8)"),
    (["optim.lr=0.003"], 0.003, 16, "lr 0.003 (optim.lr; optim.lr_scaling=none)"),
])
def test_lr_words_name_the_base_lr_and_the_lr_trained(overrides, lr, batch, words):
    assert lr_words(cli.check_overrides(overrides), lr, batch) == words


def test_a_run_names_the_lr_it_trained_beside_optim_lr(tiny_overrides, tmp_path, monkeypatch,
                                                       capsys):
    run_dir = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", [
        "critbatch.train", *tiny_overrides, "train.batch_size=16", "train.tokens=2048",
        "optim.lr=0.0016", "optim.lr_scaling=sqrt", "optim.base_batch_size=4",
        f"hydra.run.dir={run_dir}"])
    cli.main()
    said = "base lr 0.0016 (optim.lr, at batch 4), trained at 0.0032 by the sqrt rule at batch 16"
    head = (run_dir / "train.log").read_text().splitlines()[:4]
    assert any(f"optim: adamw, {said}; " in line for line in head), head
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("completed: val_loss") and f"; {said}; {run_dir}" in last, last
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["lr"] == pytest.approx(0.0032) and summary["base_lr"] == 0.0016
    assert (summary["lr_scaling"], summary["base_batch_size"]) == ("sqrt", 4)


def test_the_report_gives_the_base_lr_beside_each_best_lr_trained(tmp_path):
    synthetic_sweep(tmp_path, batch_sizes=(64, 128))  # baseline 16 at four budgets
    loaded = load_runs([tmp_path], progress=False)
    for run in loaded["runs"]:
        run.update(lr_scaling="sqrt", base_batch_size=16)
    result = bcrit_report.analyse(loaded["runs"], left_out=loaded["left_out"])
    (table,) = bcrit_markdown.loss_tables(result["groups"])
    assert "adamw best lr trained" in table
    cells = {c.batch_size: c for c in result["groups"][0]["cells"]}
    row_64 = next(line for line in table.splitlines() if line.startswith("| 64 |"))
    base_64 = cells[64].lr / math.sqrt(64 / 16)
    assert f"| {cells[64].lr:.3g} (optim.lr {base_64:.3g})" in row_64, row_64
    rows_16 = [line for line in table.splitlines() if line.startswith("| 16 |")]
    assert rows_16 and not any("optim.lr" in line for line in rows_16)  # the base batch
