"""The small-batch stability analysis (science.md section 6) on scripted run directories."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from critbatch.analysis.stability import accumulation, inputs, rules
from critbatch.analysis.stability import report as stability_report
from critbatch.analysis.stability.accumulation import compare_curves
from critbatch.analysis.stability.rules import ACCUM_STAGE, BATCH_STAGE, DIFFERS, LR_STAGE, MATCHES
from critbatch.analysis.stability.stability import (
    analyse,
    detrended_variance,
    lr_tuning,
    tail_stats,
    tail_window,
)
from critbatch.results.runs import SCHEMA_VERSION, SUMMARY_KEYS, read_summary

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "analysis" / "stability.py"
OUTPUTS = ("report.md", "stability.json", *(f"{name}.png" for name in stability_report.PLOTS))
STEPS = 200  # a tail window of 100 steps
BASE_LR = 2e-3


def scripted(batch_size: int, steps: int = STEPS, noise: float = 0.4, gn_cv: float = 0.05):
    """A stable run's per-step curves: loss falling 5 -> 3 plus an alternating +-noise/sqrt(B)
    (sampling noise: variance 1/B), grad norm (1 + 4/sqrt(B)) alternating by +-gn_cv."""
    t = np.arange(1, steps + 1)
    sign = (-1.0) ** t
    loss = 3.0 + 2.0 * np.exp(-t / (steps / 5)) + sign * noise / math.sqrt(batch_size)
    gnorm = (1 + 4 / math.sqrt(batch_size)) * (1 + gn_cv * sign)
    return list(loss), list(gnorm)


def write_run(root: Path, stage: str, name: str, losses, grad_norms=None, *,
              optimizer: str = "adamw", batch_size: int = 64, lr: float | None = None,
              lr_scaling: str = "sqrt", micro_batch_size: int | None = None,
              status: str = "completed", val_loss: float | None = None, scale: str = "smoke",
              seed: int = 0, diverged_step: int | None = None) -> Path:
    """A run directory with a valid summary.json (every SUMMARY_KEYS key) and metrics.jsonl."""
    if lr is None:
        lr = BASE_LR * math.sqrt(batch_size / 64) if lr_scaling == "sqrt" else BASE_LR
    grad_norms = grad_norms if grad_norms is not None else [1.0] * len(losses)
    seq_len, bytes_per_token = 32, 4.0
    if val_loss is None:
        val_loss = float(losses[-1]) if status == "completed" else math.nan
    steps = diverged_step or len(losses)
    summary = {
        "schema_version": SCHEMA_VERSION, "status": status, "sweep": stage, "seed": seed,
        "optimizer": optimizer, "lr": lr, "width": 32, "depth": 2, "heads": 2,
        "seq_len": seq_len, "vocab_size": 512, "params": 50_000, "params_nonembedding": 20_000,
        "batch_size": batch_size, "micro_batch_size": micro_batch_size or batch_size,
        "steps": steps, "tokens": steps * batch_size * seq_len, "warmup_steps": 10,
        "schedule": "cosine", "bytes_per_token": bytes_per_token, "val_loss": val_loss,
        "val_loss_per_byte": val_loss / bytes_per_token,
        "curve": [] if status == "diverged" else [
            {"step": steps, "tokens": steps * batch_size * seq_len, "val_loss": val_loss,
             "val_loss_per_byte": val_loss / bytes_per_token}],
        "wall_time_s": 1.0, "tokens_per_s": 1e4, "data_name": "stdlib",
        "data_fingerprint": "f" * 64, "git_revision": "test", "critbatch_version": "0.1.0",
        "scale": scale, "lr_scaling": lr_scaling, "base_lr": BASE_LR, "base_batch_size": 64,
        "batch_schedule": "constant", "status_reason": "loss > 2x" if status == "diverged"
        else None, "diverged_step": diverged_step, "dtype": "float32",
    }
    assert set(SUMMARY_KEYS) <= set(summary)
    run_dir = root / stage / scale / name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    rows = [{"step": i + 1, "tokens": (i + 1) * batch_size * seq_len, "lr": lr,
             "train_loss": float(loss), "grad_norm": float(g), "time_s": 0.01 * i,
             "batch_size": batch_size}
            for i, (loss, g) in enumerate(zip(losses, grad_norms, strict=True))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    read_summary(run_dir)  # valid
    return run_dir


def write_study(root: Path, optimizers=("adamw",)) -> None:
    """The three stages: an lr grid at 64 (best 2e-3), batch sizes 1..256 (1 diverged), and
    64 as 16 x 4 with curves identical to the plain 64."""
    for opt in optimizers:
        for i, lr in enumerate((1e-3, 2e-3, 4e-3)):
            loss, gn = scripted(64)
            write_run(root, LR_STAGE, f"{opt}_lr{i}", loss, gn, optimizer=opt, lr=lr,
                      val_loss=3.1 + 0.05 * math.log2(lr / BASE_LR) ** 2)
        for b in (1, 4, 16, 64, 256):
            loss, gn = scripted(b)
            if b == 1:
                loss[40:] = [float("nan")] * 2
                loss, gn = loss[:42], gn[:42]
                write_run(root, BATCH_STAGE, f"{opt}_b{b}", loss, gn, optimizer=opt,
                          batch_size=b, status="diverged", diverged_step=42)
            else:
                write_run(root, BATCH_STAGE, f"{opt}_b{b}", loss, gn, optimizer=opt,
                          batch_size=b)
        loss, gn = scripted(64)
        write_run(root, ACCUM_STAGE, f"{opt}_accum", loss, gn, optimizer=opt,
                  micro_batch_size=4)


def analyse_dir(*paths):
    loaded = inputs.load_stability_runs(list(paths))
    return analyse(loaded["runs"], loaded["left_out"], loaded["warnings"])


def by_batch(group: dict) -> dict[int, dict]:
    return {r["batch_size"]: r for r in group["per_batch"]}


# ---------------------------------------------------------------------------------------------
# Tail statistics


def test_tail_window_is_100_steps_or_the_last_half():
    assert tail_window(500) == 100 and tail_window(200) == 100
    assert tail_window(199) == 99 and tail_window(100) == 50 and tail_window(1) == 1


def test_tail_statistics_of_a_scripted_run():
    # steps 1..100 at loss 5 / grad norm 3; the tail (101..200) alternates 2.1, 1.9 and 1.5, 0.5
    loss = [5.0] * 100 + [2.1, 1.9] * 50
    gnorm = [3.0] * 100 + [1.5, 0.5] * 50
    rows = [{"step": i + 1, "train_loss": x, "grad_norm": g}
            for i, (x, g) in enumerate(zip(loss, gnorm, strict=True))]
    s = tail_stats(rows, tail_window(200), batch_size=16)
    assert (s["tail_steps"], s["tail_first_step"], s["tail_last_step"]) == (100, 101, 200)
    assert s["tail_mean_train_loss"] == pytest.approx(2.0, abs=1e-12)
    assert s["tail_var_train_loss"] == pytest.approx(0.01, rel=1e-9)
    assert s["tail_mean_grad_norm"] == pytest.approx(1.0) and s["tail_var_grad_norm"] == (
        pytest.approx(0.25))
    assert s["grad_norm_cv"] == pytest.approx(0.5)
    assert s["max_grad_norm"] == 3.0 and s["first_nonfinite_step"] is None
    assert (s["first_train_loss"], s["final_train_loss"]) == (5.0, 1.9)
    # B x the variance around the fitted parabola: 16 x (0.01 - a few 1e-6 of trend)
    assert s["loss_noise"] == pytest.approx(16 * 0.01, rel=1e-3)


def test_detrended_variance_removes_a_parabola():
    steps = np.arange(1.0, 101.0)
    trend = 4.0 - 0.01 * steps + 2e-4 * (steps - 50) ** 2
    assert detrended_variance(steps, trend) == pytest.approx(0.0, abs=1e-20)
    wiggle = trend + 0.1 * (-1.0) ** steps
    assert detrended_variance(steps, wiggle) == pytest.approx(0.01, rel=1e-3)
    assert math.isnan(detrended_variance(steps[:3], wiggle[:3]))


# ---------------------------------------------------------------------------------------------
# Verdicts


def test_divergence_and_instability_verdicts(tmp_path):
    for b in (16, 64, 256):
        write_run(tmp_path, BATCH_STAGE, f"b{b}", *scripted(b), batch_size=b)
    loss, gn = scripted(1)
    loss[30] = float("nan")  # the trainer did not stop it, the analysis must
    write_run(tmp_path, BATCH_STAGE, "b1", loss, gn, batch_size=1)
    rising = list(np.linspace(5.0, 6.5, STEPS))  # never 2x the first loss: not stopped
    write_run(tmp_path, BATCH_STAGE, "b2", rising, batch_size=2)
    loss, gn = scripted(4)
    gn = [g * (8.0 if i % 10 == 0 else 1.0) for i, g in enumerate(gn)]  # grad-norm spikes
    write_run(tmp_path, BATCH_STAGE, "b4", loss, gn, batch_size=4)
    # the grad-norm CV grows as sqrt(B_ref / B) under sampling noise alone: stable
    write_run(tmp_path, BATCH_STAGE, "b3", *scripted(3, gn_cv=0.05 * math.sqrt(64 / 3)),
              batch_size=3)
    # 4x more variation than sampling noise explains: unstable
    write_run(tmp_path, BATCH_STAGE, "b6", *scripted(6, gn_cv=4 * 0.05 * math.sqrt(64 / 6)),
              batch_size=6)
    write_run(tmp_path, BATCH_STAGE, "b8", *scripted(8, noise=0.4 * 3), batch_size=8)
    write_run(tmp_path, BATCH_STAGE, "b32", *scripted(32)[:1], batch_size=32, status="diverged",
              diverged_step=25)
    (group,) = analyse_dir(tmp_path)["groups"]
    rows = by_batch(group)
    assert rows[1]["verdict"] == "diverged" and "non-finite" in rows[1]["verdict_reason"]
    assert "step 31" in rows[1]["verdict_reason"]
    assert rows[2]["verdict"] == "diverged" and "first-step" in rows[2]["verdict_reason"]
    assert rows[32]["verdict"] == "diverged" and "step 25" in rows[32]["verdict_reason"]
    assert rows[4]["verdict"] == "unstable" and "tail's median" in rows[4]["verdict_reason"]
    assert 7 < rows[4]["tail_spike_ratio"] < 8  # 8x a value 5% below a median 5% above it
    assert rows[3]["verdict"] == "stable", rows[3]
    assert rows[3]["grad_norm_cv_ratio"] == pytest.approx(math.sqrt(64 / 3))
    assert rows[3]["grad_norm_cv_excess"] == pytest.approx(1)
    assert rows[6]["verdict"] == "unstable" and "grad-norm CV" in rows[6]["verdict_reason"]
    assert rows[6]["grad_norm_cv_excess"] == pytest.approx(4)
    assert rows[8]["verdict"] == "unstable" and "loss noise" in rows[8]["verdict_reason"]
    assert rows[8]["loss_noise_ratio"] == pytest.approx(9, rel=0.1)  # 3x the amplitude
    for b in (16, 64, 256):  # noise 1/sqrt(B): the same B x Var, the same grad-norm CV
        assert rows[b]["verdict"] == "stable", rows[b]
        assert rows[b]["loss_noise_ratio"] == pytest.approx(1, rel=0.1)
        assert rows[b]["grad_norm_cv_ratio"] == pytest.approx(1, rel=1e-6)
    assert group["tail_window"]["steps"] == 100 and group["base_batch_size"] == 64


def test_a_run_without_metrics_is_judged_on_its_summary(tmp_path):
    write_run(tmp_path, BATCH_STAGE, "b64", *scripted(64))
    (write_run(tmp_path, BATCH_STAGE, "b4", *scripted(4), batch_size=4) / "metrics.jsonl").unlink()
    write_run(tmp_path, BATCH_STAGE, "b1", *scripted(1), batch_size=1, status="diverged",
              diverged_step=9)
    (tmp_path / BATCH_STAGE / "smoke" / "b1" / "metrics.jsonl").write_text("")
    result = analyse_dir(tmp_path)
    rows = by_batch(result["groups"][0])
    assert rows[4]["verdict"] == "stable" and rows[4]["tail_steps"] is None
    assert "no per-step metrics" in rows[4]["verdict_reason"]
    assert rows[1]["verdict"] == "diverged" and rows[1]["n_steps_logged"] == 0
    assert any("b4: no metrics.jsonl" in w for w in result["warnings"])
    assert any("b1: metrics.jsonl holds no rows" in w for w in result["warnings"])


def test_short_runs_use_the_last_half_as_tail(tmp_path):
    for b in (4, 64):
        write_run(tmp_path, BATCH_STAGE, f"b{b}", *scripted(b, steps=100), batch_size=b)
    (group,) = analyse_dir(tmp_path)["groups"]
    assert group["tail_window"] == {"steps": 50, "planned_steps": 100,
                                    "rule": rules.RULES["tail_window"]}
    assert all(r["tail_first_step"] == 51 for r in group["per_batch"])


# ---------------------------------------------------------------------------------------------
# Gradient accumulation against the plain batch


def rows_of(losses, grad_norms=None):
    grad_norms = grad_norms or [1.0] * len(losses)
    return [{"step": i + 1, "train_loss": x, "grad_norm": g}
            for i, (x, g) in enumerate(zip(losses, grad_norms, strict=True))]


def test_identical_curves_match_exactly():
    plain = rows_of(scripted(64)[0])
    c = compare_curves(plain, plain)
    assert c["steps_compared"] == STEPS
    assert c["max_abs_diff"] == c["max_rel_diff"] == c["first_steps_max_rel_diff"] == 0.0
    assert c["first_step_rel_above"] is None
    assert accumulation.accumulation_verdict(c["first_steps_max_rel_diff"], STEPS) == MATCHES


def test_an_offset_of_1e_3_is_detected():
    loss = scripted(64)[0]  # 3..5 nats/token: 1e-3 is a relative 2e-4..3.3e-4
    c = compare_curves(rows_of([x + 1e-3 for x in loss]), rows_of(loss))
    assert c["first_steps_max_abs_diff"] == pytest.approx(1e-3, rel=1e-6)
    assert c["first_steps_max_rel_diff"] == pytest.approx(1e-3 / min(loss[:10]), rel=1e-6)
    assert c["first_step_rel_above"] == 1
    assert accumulation.accumulation_verdict(c["first_steps_max_rel_diff"], STEPS) == DIFFERS
    # under bf16 autocast the same offset is rounding
    bf16 = accumulation.accum_tolerance("bfloat16")
    assert accumulation.accumulation_verdict(c["first_steps_max_rel_diff"], STEPS, bf16) == MATCHES
    assert accumulation.accum_tolerance(None) == accumulation.accum_tolerance("float32") == 1e-4
    # the same offset from step 20 on: the first 10 steps still match, the separation is found
    late = [x + (1e-3 if i >= 19 else 0.0) for i, x in enumerate(loss)]
    c = compare_curves(rows_of(late), rows_of(loss))
    assert c["first_steps_max_abs_diff"] == 0.0 and c["first_step_rel_above"] == 20
    assert c["max_abs_diff"] == pytest.approx(1e-3, rel=1e-6)
    assert accumulation.accumulation_verdict(c["first_steps_max_rel_diff"], STEPS) == MATCHES
    # float-rounding size differences match
    c = compare_curves(rows_of([x * (1 + 1e-7) for x in loss]), rows_of(loss))
    assert c["first_steps_max_rel_diff"] == pytest.approx(1e-7, rel=1e-3)
    assert c["first_step_rel_above"] is None


def test_accumulation_pairs_with_the_plain_run_of_the_same_lr(tmp_path):
    loss, gn = scripted(64)
    write_run(tmp_path, LR_STAGE, "lr_other", loss, gn, lr=4e-3, val_loss=3.5)
    write_run(tmp_path, LR_STAGE, "lr_same", loss, gn, val_loss=3.2)
    plain = write_run(tmp_path, BATCH_STAGE, "b64", loss, gn, val_loss=3.0)
    write_run(tmp_path, ACCUM_STAGE, "accum", [x + 1e-3 for x in loss], gn,
              micro_batch_size=4, val_loss=3.01)
    (group,) = analyse_dir(tmp_path)["groups"]
    (entry,) = group["accumulation"]
    assert entry["plain_run_dir"] == str(plain) and entry["plain_stage"] == BATCH_STAGE
    assert entry["delta_val_loss"] == pytest.approx(0.01) and entry["verdict"] == DIFFERS
    assert entry["first_step_rel_above"] == 1
    # without the stability-stage run, the lr grid's run at the same lr stands in
    import shutil

    shutil.rmtree(plain)
    (group,) = analyse_dir(tmp_path)["groups"]
    (entry,) = group["accumulation"]
    assert entry["plain_run_dir"].endswith("lr_same")
    assert entry["delta_val_loss"] == pytest.approx(3.01 - 3.2)


def test_accumulation_without_a_plain_run_is_a_warning(tmp_path):
    write_run(tmp_path, ACCUM_STAGE, "accum", *scripted(64), micro_batch_size=4)
    result = analyse_dir(tmp_path)
    (entry,) = result["groups"][0]["accumulation"]
    assert entry["verdict"] == rules.NO_PLAIN and entry["steps_compared"] == 0
    assert any("no plain batch-64 run" in w for w in result["warnings"])


# ---------------------------------------------------------------------------------------------
# Learning-rate tuning


def grid(val_losses, lrs=(1e-3, 2e-3, 4e-3, 8e-3)):
    return [{"lr": lr, "val_loss": v, "val_loss_per_byte": v / 4, "run_dir": f"r{i}",
             "status": "completed" if math.isfinite(v) else "diverged", "optimizer": "adamw",
             "batch_size": 64} for i, (lr, v) in enumerate(zip(lrs, val_losses, strict=True))]


def test_lr_tuning_picks_the_best_and_warns_on_the_grid_edge():
    t = lr_tuning(grid([3.3, 3.1, 3.2, 3.6]), 64)
    assert t["best_lr"] == 2e-3 and t["best_val_loss"] == 3.1 and t["edge"] is None
    assert [r["best"] for r in t["rows"]] == [False, True, False, False] and not t["warnings"]
    t = lr_tuning(grid([3.6, 3.4, 3.2, 3.1]), 64)
    assert t["best_lr"] == 8e-3 and t["edge"] == "high"
    assert "highest of the grid" in t["warnings"][0]
    t = lr_tuning(grid([3.0, 3.1, 3.2, 3.3]), 64)
    assert t["edge"] == "low" and "extend the grid down" in t["warnings"][0]
    # a diverged lr above the best keeps the best off the edge
    t = lr_tuning(grid([3.3, 3.1, 3.2, float("nan")]), 64)
    assert t["best_lr"] == 2e-3 and t["edge"] is None and t["rows"][-1]["status"] == "diverged"
    assert lr_tuning(grid([3.0], lrs=(1e-3,)), 64)["edge"] == "single"


def test_stability_runs_off_the_tuned_lr_are_flagged(tmp_path):
    write_run(tmp_path, LR_STAGE, "lr0", *scripted(64), lr=1e-3, val_loss=3.0)
    write_run(tmp_path, LR_STAGE, "lr1", *scripted(64), lr=2e-3, val_loss=3.2)
    write_run(tmp_path, BATCH_STAGE, "b16", *scripted(16), batch_size=16, lr=5e-3)
    result = analyse_dir(tmp_path)
    text = "\n".join(result["warnings"])
    assert "lowest of the grid" in text
    assert "but the best lr of the grid at batch 64 is 0.001" in text
    assert "is not base lr 0.002 x sqrt(16/64) = 0.001" in text


# ---------------------------------------------------------------------------------------------
# The command line


def cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def strict_json(text: str):
    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.slow
def test_cli_end_to_end_writes_the_report(tmp_path):
    runs = tmp_path / "runs"
    write_study(runs, optimizers=("adamw", "muon"))
    (runs / BATCH_STAGE / "smoke" / "broken").mkdir()
    (runs / BATCH_STAGE / "smoke" / "broken" / "summary.json").write_text("{not json")
    out = tmp_path / "report"
    stages = [runs / s / "smoke" for s in rules.STAGES]
    proc = cli(*stages, "--out", out)
    assert proc.returncode == 0, proc.stderr
    for name in OUTPUTS:
        assert (out / name).stat().st_size > 0, name
    assert f"report: {out / 'report.md'}" in proc.stdout
    assert "B=1" in proc.stdout and "diverged" in proc.stdout
    assert list((out / "wandb").glob("offline-run-*")), "W&B analysis run not logged offline"

    doc = strict_json((out / "stability.json").read_text())
    assert set(doc) == {"schema_version", "inputs", "n_runs", "rules", "thresholds", "groups",
                        "warnings", "left_out"}
    assert doc["n_runs"] == 2 * (3 + 5 + 1)
    assert [d["reason"] for d in doc["left_out"]] == ["corrupt"]
    assert [g["name"] for g in doc["groups"]] == ["adamw, lr_scaling sqrt",
                                                  "muon, lr_scaling sqrt"]
    g = doc["groups"][0]
    assert set(g) == set(stability_report.GROUP_KEYS)
    assert g["lr_tuning"]["best_lr"] == BASE_LR and g["lr_tuning"]["edge"] is None
    verdicts = {r["batch_size"]: r["verdict"] for r in g["per_batch"]}
    assert verdicts == {1: "diverged", 4: "stable", 16: "stable", 64: "stable", 256: "stable"}
    b1 = next(r for r in g["per_batch"] if r["batch_size"] == 1)
    assert b1["val_loss"] is None and b1["first_nonfinite_step"] == 41  # NaN -> null
    (acc,) = g["accumulation"]
    assert acc["verdict"] == MATCHES and acc["max_abs_diff"] == 0.0
    assert acc["plain_stage"] == BATCH_STAGE and acc["steps_compared"] == STEPS

    text = (out / "report.md").read_text()
    for part in ("# Small-batch stability report", "## Rules", "## adamw, lr_scaling sqrt",
                 "### Learning-rate tuning at batch 64", "### Per batch size",
                 "### Gradient accumulation versus the plain batch", "## Plots", "## Warnings",
                 "## Runs left out", "the last 100 steps", "**matches to float tolerance**",
                 "below 0.0001", "![", "broken", "is not valid JSON"):
        assert part in text, part


@pytest.mark.slow
def test_default_paths_and_no_torch(tmp_path):
    """No PATHS: the latest scale's stages, report in runs/stability/<scale>/report; and the
    analysis imports neither torch nor the trainer."""
    write_study(tmp_path / "runs")
    older = tmp_path / "runs" / BATCH_STAGE / "cpu" / "b64"
    write_run(tmp_path / "runs", BATCH_STAGE, "b64", *scripted(64), scale="cpu")
    old = time.time() - 3600
    import os

    os.utime(older / "summary.json", (old, old))
    code = "\n".join([
        "import sys",
        "from critbatch.analysis.stability.report import run_analysis",
        "run_analysis()",
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'"
        " or m.startswith('critbatch.training')))",
    ])
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert "latest stability study" in proc.stdout
    report = tmp_path / "runs" / BATCH_STAGE / "smoke" / "report"
    doc = json.loads((report / "stability.json").read_text())
    assert doc["n_runs"] == 9 and len(doc["inputs"]) == 3
    assert not (tmp_path / "runs" / BATCH_STAGE / "cpu" / "report").exists()


def test_default_out_beside_the_stages(tmp_path):
    stages = [tmp_path / "runs" / s / "cpu" for s in (LR_STAGE, ACCUM_STAGE)]
    expected = (tmp_path / "runs" / BATCH_STAGE / "cpu" / "report").resolve()
    assert inputs.default_out(stages) == expected
    assert inputs.default_out([stages[0] / "some_run"]) == expected
    assert inputs.default_out([tmp_path / "elsewhere"]) == (
        tmp_path / "elsewhere" / "report").resolve()


def run_main(capsys, *args):
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("stability_cli", SCRIPT)
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as exc:
        module.main([str(a) for a in args])
    return exc.value.code, capsys.readouterr().err


def test_bad_input_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    code, err = run_main(capsys, tmp_path)  # an empty folder
    assert code == 2 and err.startswith("critbatch: error: no runs found") and (
        err.count("\n") == 1)
    code, err = run_main(capsys, tmp_path / "missing")
    assert code == 2 and "does not exist" in err and err.count("\n") == 1
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text("[]")
    code, err = run_main(capsys, tmp_path)
    assert code == 2 and "all 1 runs were left out (1 corrupt)" in err and err.count("\n") == 1
    other = tmp_path / "other"
    write_run(other, "batch", "b64", *scripted(64))
    code, err = run_main(capsys, other)
    assert code == 2 and "1 other sweep" in err and "not a stability stage" in err
    monkeypatch.chdir(tmp_path)  # no runs/ folder at all
    code, err = run_main(capsys)
    assert code == 2 and "no stability runs under runs/" in err and err.count("\n") == 1
