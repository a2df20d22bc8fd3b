"""The batch-size schedule study's analysis and report, on synthetic run directories."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from critbatch.analysis.schedules import plots, report, schedules
from critbatch.results.errors import ResultsError
from critbatch.results.files import write_json_atomic
from critbatch.results.runs import SCHEMA_VERSION, load_runs

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "analysis" / "schedules.py"
SEQ_LEN = 64
BYTES_PER_TOKEN = 4.0
A, C = 3.0, 4.0  # the constant-small run's curve: L(S) = A + C / sqrt(S)
SMALL_STEPS = 1024
SMALL_BATCH = 16


def small_loss(step: float) -> float:
    return A + C * step**-0.5


def write_run(root: Path, name: str, batches: list[int], final_loss: float, *,
              optimizer: str = "adamw", schedule: str = "constant",
              batch_size: int | None = None, curve: list[tuple[int, float]] | None = None,
              status: str = "completed", sweep: str = "schedules", new_keys: bool = True,
              b_noise: float | None = None, per_step_batch: bool = True) -> Path:
    """A run directory with a valid summary.json and metrics.jsonl.

    `batches`: the batch size (sequences) of every optimizer step. `curve`: eval points
    (step, val_loss), default log-spaced (powers of two) ending at `final_loss`.
    """
    steps = len(batches)
    cum = [0]
    for b in batches:
        cum.append(cum[-1] + b * SEQ_LEN)
    if curve is None:
        points = sorted({2**k for k in range(3, int(math.log2(steps)) + 1)} | {steps})
        curve = [(s, final_loss + C * (s**-0.5 - steps**-0.5)) for s in points]
    diverged = status == "diverged"
    summary = {
        "schema_version": SCHEMA_VERSION, "status": status, "sweep": sweep, "seed": 0,
        "optimizer": optimizer, "lr": 1e-3, "width": 64, "depth": 2, "heads": 2,
        "seq_len": SEQ_LEN, "vocab_size": 512, "params": 100_000,
        "params_nonembedding": 50_000, "batch_size": batch_size or max(batches),
        "micro_batch_size": 16, "steps": steps, "tokens": cum[-1], "warmup_steps": 10,
        "schedule": "cosine", "bytes_per_token": BYTES_PER_TOKEN,
        "val_loss": float("nan") if diverged else final_loss,
        "val_loss_per_byte": float("nan") if diverged else final_loss / BYTES_PER_TOKEN,
        "curve": [{"step": s, "tokens": cum[s], "val_loss": v,
                   "val_loss_per_byte": v / BYTES_PER_TOKEN} for s, v in curve],
        "wall_time_s": 1.0, "tokens_per_s": 1e5, "data_name": "synthetic",
        "data_fingerprint": "f" * 64, "git_revision": "test", "critbatch_version": "0.1.0",
    }
    if new_keys:
        changes = [{"step": i, "tokens": cum[i], "batch_size": batches[i]}
                   for i in range(1, steps) if batches[i] != batches[i - 1]]
        summary.update(batch_schedule=schedule, batch_size_start=batches[0],
                       batch_size_final=batches[-1], batch_size_max=max(batches),
                       batch_size_mean=cum[-1] / (steps * SEQ_LEN), batch_changes=changes,
                       b_noise=b_noise)
    run_dir = root / name
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / "summary.json", summary)
    rows = []
    for i, b in enumerate(batches, start=1):
        row = {"step": i, "tokens": cum[i], "lr": 1e-3, "train_loss": 4.0, "grad_norm": 1.0,
               "time_s": 0.01 * i}
        if per_step_batch:
            row["batch_size"] = b
        if b_noise is not None:
            row["b_noise"] = b_noise * i / steps if i > 5 else None
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


# Four arms at equal tokens (16,384 sequences): small 16 x 1024 steps, large 256 x 64,
# a ramp 16 -> 256 in powers of two (272 steps), adaptive 16 -> 128 (264 steps).
RAMP = [16] * 128 + [32] * 64 + [64] * 32 + [128] * 16 + [256] * 32
ADAPTIVE = [16] * 64 + [32] * 64 + [64] * 64 + [128] * 72
LARGE_LOSS, RAMP_LOSS, ADAPTIVE_LOSS = 3.30, 3.14, 3.10


def write_study(root: Path, optimizers=("adamw", "muon")) -> Path:
    for opt in optimizers:
        small = [SMALL_BATCH] * SMALL_STEPS
        write_run(root, f"arm=small,optim={opt}", small, small_loss(SMALL_STEPS),
                  optimizer=opt,
                  curve=[(2**k, small_loss(2**k)) for k in range(3, 11)])
        write_run(root, f"arm=large,optim={opt}", [256] * 64, LARGE_LOSS, optimizer=opt)
        write_run(root, f"arm=ramp,optim={opt}", RAMP, RAMP_LOSS, optimizer=opt,
                  schedule="ramp")
        write_run(root, f"arm=adaptive,optim={opt}", ADAPTIVE, ADAPTIVE_LOSS, optimizer=opt,
                  schedule="adaptive", batch_size=256, b_noise=150.0)
    return root


def analyse(root: Path) -> dict:
    loaded = load_runs([root], progress=False)
    return schedules.analyse(loaded["runs"], loaded["left_out"], loaded["warnings"])


def arms_by_name(result: dict, group: str = "adamw") -> dict:
    g = next(g for g in result["groups"] if g["name"] == group)
    return {a["arm"]: a for a in g["arms"]}


def log_linear(s0: float, l0: float, s1: float, l1: float, loss: float) -> float:
    """By hand: the step at which the straight line in (log step, loss) reaches `loss`."""
    t = (loss - l0) / (l1 - l0)
    return math.exp((1 - t) * math.log(s0) + t * math.log(s1))


# ---------------------------------------------------------------------------------------------
# Steps to reach a loss


def test_steps_to_reach_interpolates_linearly_in_log_step():
    curve = [{"step": 2**k, "val_loss": small_loss(2**k)} for k in range(3, 11)]
    # 3.30 lies between S=128 (3.3536) and S=256 (3.25)
    expected = log_linear(128, A + C / math.sqrt(128), 256, A + C / 16, 3.30)
    crossing = schedules.steps_to_reach(curve, 3.30)
    assert crossing.kind == "interpolated"
    assert crossing.steps == pytest.approx(expected, rel=1e-12)
    assert 128 < crossing.steps < 256
    # on an eval point exactly: that point's step
    assert schedules.steps_to_reach(curve, A + C / 16).steps == pytest.approx(256)


def test_steps_to_reach_takes_the_first_crossing_of_a_non_monotone_curve():
    curve = [{"step": 10, "val_loss": 5.0}, {"step": 100, "val_loss": 3.0},
             {"step": 1000, "val_loss": 3.5}, {"step": 10000, "val_loss": 2.0}]
    # 3.25 is crossed between 10 and 100 steps, again between 1000 and 10000: the first counts
    crossing = schedules.steps_to_reach(curve, 3.25)
    assert crossing.steps == pytest.approx(log_linear(10, 5.0, 100, 3.0, 3.25))
    assert 10 < crossing.steps < 100
    assert schedules.steps_to_reach(curve, 4.0).steps == pytest.approx(10**1.5)


def test_steps_to_reach_not_reached_first_eval_and_no_curve():
    curve = [{"step": 8, "val_loss": 4.0}, {"step": 64, "val_loss": 3.5}]
    assert schedules.steps_to_reach(curve, 3.4) == (None, "not_reached")
    assert schedules.steps_to_reach(curve, 4.5) == (8.0, "first_eval")
    assert schedules.steps_to_reach([], 3.0) == (None, "no_curve")
    nan_curve = [{"step": 8, "val_loss": float("nan")}]
    assert schedules.steps_to_reach(nan_curve, 3.0).kind == "no_curve"


# ---------------------------------------------------------------------------------------------
# Arms and steps saved


def test_four_arms_are_identified_and_compared_with_the_small_batch(tmp_path):
    result = analyse(write_study(tmp_path))
    assert [g["name"] for g in result["groups"]] == ["adamw", "muon"]
    arms = arms_by_name(result)
    assert list(arms) == ["constant small", "ramp", "adaptive", "constant large"]
    small, large = arms["constant small"], arms["constant large"]
    ramp, adaptive = arms["ramp"], arms["adaptive"]
    assert small["is_reference"] and small["s_small_kind"] == "reference"
    assert (ramp["batch_size_start"], ramp["batch_size_final"]) == (16, 256)
    assert ramp["batch_size_mean"] == pytest.approx(16384 / 272)
    assert (adaptive["batch_size_start"], adaptive["batch_size_final"]) == (16, 128)
    assert adaptive["b_noise"] == 150.0
    for a in arms.values():
        assert a["tokens_ratio"] == pytest.approx(1.0)
    assert not result["warnings"]

    # large: 3.30 between the small run's eval points at 128 and 256 steps
    s = log_linear(128, small_loss(128), 256, small_loss(256), LARGE_LOSS)
    assert large["s_small_kind"] == "interpolated"
    assert large["s_small"] == pytest.approx(s)
    assert large["steps_saved"] == pytest.approx(s - 64)
    assert large["steps_saved_percent"] == pytest.approx(100 * (s - 64) / s)
    assert large["steps_saved_bound"] is None
    assert large["val_loss_per_byte_delta"] == pytest.approx(
        (LARGE_LOSS - small_loss(SMALL_STEPS)) / BYTES_PER_TOKEN)
    # ramp: 3.14 between 512 and 1024
    s = log_linear(512, small_loss(512), 1024, small_loss(1024), RAMP_LOSS)
    assert ramp["s_small"] == pytest.approx(s) and ramp["steps_saved"] == pytest.approx(s - 272)
    # adaptive: 3.10 is below the small run's final 3.125 -> a lower bound
    assert adaptive["s_small_kind"] == "not_reached" and adaptive["s_small"] is None
    assert adaptive["steps_saved"] == SMALL_STEPS - 264
    assert adaptive["steps_saved_bound"] == "lower"
    assert "not reached by the constant small batch" in adaptive["note"]


ANNEALED_A = 2.9  # the annealed small batch: L(S) = ANNEALED_A + C / sqrt(S), below its curve
BRANCH_STEPS = (32, 64, 128, 256, 512)
MEASURED = [16] * 96 + [32] * 48 + [64] * 48 + [128] * 80  # 16,384 sequences in 272 steps
MEASURED_LOSS = 3.10


def annealed_loss(step: float) -> float:
    return ANNEALED_A + C * step**-0.5


def write_annealed_study(root: Path) -> Path:
    """One optimizer's five arms; the small batch (wsd) has cooldown branches whose final
    losses, and its own, lie on `annealed_loss`, while its eval curve lies on `small_loss`."""
    small = "arm=small,optim=adamw"
    write_run(root, small, [SMALL_BATCH] * SMALL_STEPS, annealed_loss(SMALL_STEPS),
              curve=[(2**k, small_loss(2**k)) for k in range(3, 10)]
              + [(SMALL_STEPS, annealed_loss(SMALL_STEPS))])
    for steps in BRANCH_STEPS:
        tokens = steps * SMALL_BATCH * SEQ_LEN
        branch = write_run(root, f"{small}/branches/tokens={tokens}", [SMALL_BATCH] * steps,
                           annealed_loss(steps))
        summary = json.loads((branch / "summary.json").read_text())
        summary.update(branch_of=small, branch_at_tokens=int(0.8 * tokens))
        write_json_atomic(branch / "summary.json", summary)
    write_run(root, "arm=large,optim=adamw", [256] * 64, LARGE_LOSS)
    write_run(root, "arm=ramp,optim=adamw", RAMP, RAMP_LOSS, schedule="ramp")
    write_run(root, "arm=adaptive,optim=adamw", ADAPTIVE, ADAPTIVE_LOSS, schedule="adaptive",
              batch_size=256)
    write_run(root, "arm=measured,optim=adamw", MEASURED, MEASURED_LOSS, schedule="measured",
              batch_size=256)
    return root


def test_steps_saved_are_read_off_the_annealed_small_batch(tmp_path):
    """The cooldown branches are the reference's annealed points, not arms; S_small is the
    log-step interpolation between the two annealed points that bracket each arm's loss."""
    result = analyse(write_annealed_study(tmp_path))
    (group,) = result["groups"]
    arms = {a["arm"]: a for a in group["arms"]}
    assert list(arms) == ["constant small", "ramp", "adaptive", "measured", "constant large"]
    assert group["s_small_reference"] == "annealed"
    assert [p["step"] for p in group["annealed_points"]] == [*BRANCH_STEPS, SMALL_STEPS]
    assert {a["s_small_reference"] for a in arms.values()} == {"annealed"}
    # large: 3.30 lies between the annealed points at 64 (3.40) and 128 (3.2536) steps
    s = log_linear(64, annealed_loss(64), 128, annealed_loss(128), LARGE_LOSS)
    assert arms["constant large"]["s_small_kind"] == "interpolated"
    assert arms["constant large"]["s_small"] == pytest.approx(s, rel=1e-12)
    assert arms["constant large"]["steps_saved"] == pytest.approx(s - 64)
    assert arms["constant large"]["steps_saved_bound"] is None
    # measured: 3.10 between 256 (3.15) and 512 (3.0768)
    s = log_linear(256, annealed_loss(256), 512, annealed_loss(512), MEASURED_LOSS)
    measured = arms["measured"]
    assert measured["s_small"] == pytest.approx(s, rel=1e-12)
    assert measured["steps_saved_percent"] == pytest.approx(100 * (s - 272) / s)
    assert (measured["batch_size_start"], measured["batch_size_max"]) == (16, 128)
    # the unannealed curve would have put the large batch's loss much later (128-256 steps)
    assert arms["constant large"]["s_small"] < schedules.steps_to_reach(
        [{"step": 2**k, "val_loss": small_loss(2**k)} for k in range(3, 10)], LARGE_LOSS).steps


@pytest.mark.slow
def test_the_report_says_which_reference_steps_saved_were_read_off(tmp_path):
    annealed = report.run_analysis([str(write_annealed_study(tmp_path / "new"))],
                                   str(tmp_path / "rep_new"))
    old = report.run_analysis([str(write_study(tmp_path / "old", optimizers=("adamw",)))],
                              str(tmp_path / "rep_old"))
    assert annealed["document"]["groups"][0]["s_small_reference"] == "annealed"
    assert "exact up to that interpolation" in annealed["document"]["caveat"]
    text = (tmp_path / "rep_new" / "report.md").read_text()
    assert "S_small read off annealed at 6 budgets" in text and "| annealed |" in text
    assert "Caveat: steps saved are an upper estimate" not in text
    # an older sweep, without branches: its own curve, labelled an upper estimate
    (group,) = old["document"]["groups"]
    assert group["s_small_reference"] == "unannealed curve: upper estimate"
    assert group["annealed_points"] == []
    assert {a["s_small_reference"] for a in group["arms"]} == {
        "unannealed curve: upper estimate"}
    assert "steps saved are an upper estimate" in old["document"]["caveat"]
    text = (tmp_path / "rep_old" / "report.md").read_text()
    assert "| unannealed curve (upper estimate) |" in text and "its unannealed curve" in text


def test_several_arms_of_a_kind_are_named_by_their_batch_range(tmp_path):
    write_run(tmp_path, "small", [16] * 64, 3.5)
    write_run(tmp_path, "mid", [64] * 16, 3.6)
    write_run(tmp_path, "large", [128] * 8, 3.7)
    write_run(tmp_path, "ramp_a", [16] * 16 + [32] * 24, 3.4, schedule="ramp")
    # its last step shrank to fit the budget: named by its configured range, max shown
    write_run(tmp_path, "ramp_b", [16] * 16 + [64] * 11 + [32] * 2, 3.45, schedule="ramp")
    arms = arms_by_name(analyse(tmp_path))
    assert list(arms) == ["constant small", "ramp 16->32", "ramp 16->64", "constant B=64",
                          "constant large"]
    ramp_b = arms["ramp 16->64"]
    assert (ramp_b["batch_size_final"], ramp_b["batch_size_max"]) == (32, 64)
    assert report.arm_cells(ramp_b)[1] == "16 -> 64 (35.31; last step 32)"  # 1024 seq / 29 steps
    assert report.arm_cells(arms["ramp 16->32"])[1] == "16 -> 32 (25.6)"


def test_duplicate_small_runs_use_the_best_as_reference(tmp_path):
    write_run(tmp_path, "small_a", [16] * 64, 3.6)
    write_run(tmp_path, "small_b", [16] * 64, 3.5)
    path = tmp_path / "small_b" / "summary.json"
    summary = json.loads(path.read_text())
    summary["lr"] = 2e-3
    path.write_text(json.dumps(summary))
    result = analyse(tmp_path)
    arms = arms_by_name(result)
    assert set(arms) == {"constant small (lr 0.001)", "constant small (lr 0.002)"}
    assert arms["constant small (lr 0.002)"]["is_reference"]
    assert any("2 constant-small runs" in w for w in result["warnings"])


def test_tokens_mismatch_is_warned(tmp_path):
    write_run(tmp_path, "small", [16] * 64, 3.5)
    write_run(tmp_path, "large", [64] * 15, 3.6)  # 15/16 of the small run's tokens
    result = analyse(tmp_path)
    assert arms_by_name(result)["constant large"]["tokens_ratio"] == pytest.approx(15 / 16)
    assert any("constant large" in w and "0.938x" in w for w in result["warnings"])


def test_missing_or_diverged_small_run_is_said(tmp_path):
    write_run(tmp_path / "a", "large", [64] * 16, 3.6)
    write_run(tmp_path / "a", "ramp", [16] * 16 + [32] * 24, 3.4, schedule="ramp")
    result = analyse(tmp_path / "a")
    ramp = arms_by_name(result)["ramp"]
    assert ramp["s_small_kind"] == "no_reference" and ramp["steps_saved"] is None
    assert any("no constant-small run" in w for w in result["warnings"])

    write_run(tmp_path / "b", "small", [16] * 64, 3.5, status="diverged")
    write_run(tmp_path / "b", "large", [64] * 16, 3.6)
    result = analyse(tmp_path / "b")
    large = arms_by_name(result)["constant large"]
    assert large["s_small_kind"] == "reference_diverged"
    assert any("constant-small run diverged" in w for w in result["warnings"])


def test_older_constant_runs_fall_back_to_their_batch_size(tmp_path):
    run_dir = write_run(tmp_path, "old", [32] * 20, 3.5, new_keys=False, per_step_batch=False)
    run = load_runs([run_dir], progress=False)["runs"][0]
    sched = schedules.schedule_of(run)
    assert sched == {"batch_schedule": "constant", "batch_size_start": 32,
                     "batch_size_final": 32, "batch_size_max": 32, "batch_size_mean": 32.0,
                     "batch_changes": [],
                     "b_noise": None}
    traj = schedules.batch_trajectory(run, plots._metrics(run_dir))
    assert [p["batch_size"] for p in traj] == [32, 32] and traj[-1]["tokens"] == 20 * 32 * 64


def test_batch_trajectory_from_metrics_and_from_the_summary(tmp_path):
    run_dir = write_run(tmp_path, "ramp", RAMP, RAMP_LOSS, schedule="ramp")
    run = load_runs([run_dir], progress=False)["runs"][0]
    from_metrics = schedules.batch_trajectory(run, plots._metrics(run_dir))
    from_summary = schedules.batch_trajectory(run, None)
    assert from_metrics == from_summary
    assert [p["batch_size"] for p in from_metrics] == [16, 32, 64, 128, 256, 256]
    assert [p["step"] for p in from_metrics] == [0, 128, 192, 224, 240, 272]
    assert from_metrics[1]["tokens"] == 128 * 16 * SEQ_LEN


# ---------------------------------------------------------------------------------------------
# The report and the command line


@pytest.fixture
def analysis_cli(analysis_main):
    """`main` of analysis/schedules.py, imported from its file (in-process: fast)."""
    return analysis_main(SCRIPT.name)


def run_cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def no_nan(text: str) -> None:
    raise AssertionError(f"non-strict JSON constant {text}")


@pytest.mark.slow
def test_cli_end_to_end_writes_the_report(tmp_path):
    study = write_study(tmp_path / "runs" / "schedules" / "cpu")
    write_run(study, "arm=broken,optim=adamw", [16] * 4, 3.9)
    (study / "arm=broken,optim=adamw" / "summary.json").write_text("{not json")
    proc = run_cli(study, "--out", tmp_path / "rep")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "rep"
    for name in ("report.md", "schedules.json", *(f"{p}.png" for p in plots.PLOTS)):
        assert (out / name).stat().st_size > 0, name
    assert list((out / "wandb").glob("offline-run-*")), "W&B analysis run not logged offline"
    doc = json.loads((out / "schedules.json").read_text(), parse_constant=no_nan)
    assert set(doc) == {"version", "question", "inputs", "n_runs", "caveat", "groups",
                        "warnings", "left_out"}
    assert doc["groups"][0]["s_small_reference"] == "unannealed curve: upper estimate"
    assert doc["n_runs"] == 8 and [g["optimizer"] for g in doc["groups"]] == ["adamw", "muon"]
    assert doc["left_out"][0]["reason"] == "corrupt"
    arms = {a["arm"]: a for a in doc["groups"][0]["arms"]}
    assert arms["adaptive"]["steps_saved_bound"] == "lower"
    assert arms["constant large"]["s_small"] == pytest.approx(
        log_linear(128, small_loss(128), 256, small_loss(256), LARGE_LOSS))

    text = (out / "report.md").read_text()
    assert "does growing the batch save optimizer steps" in text.lower()
    for piece in ("### adamw", "### muon", "S_small at that loss", "% saved",
                  "not reached by the constant small batch", ">= 760 (bound)",
                  "upper estimate", "16 -> 256 (60.24)", "![", "batch_vs_tokens.png",
                  "## Runs left out", "arm=broken", "final online B_noise 150"):
        assert piece in text, piece
    assert "report:" in proc.stdout and "constant large" in proc.stdout


@pytest.mark.slow
def test_report_with_a_diverged_arm_and_a_missing_metrics_file(tmp_path):
    write_study(tmp_path / "runs", optimizers=("adamw",))
    (tmp_path / "runs" / "arm=ramp,optim=adamw" / "metrics.jsonl").unlink()
    write_run(tmp_path / "runs", "arm=small,optim=muon", [16] * 8, 9.0, optimizer="muon",
              status="diverged", curve=[])
    write_run(tmp_path / "runs", "arm=ramp,optim=muon", RAMP, RAMP_LOSS, optimizer="muon",
              schedule="ramp")
    done = report.run_analysis([str(tmp_path / "runs")], str(tmp_path / "rep"))
    doc = done["document"]
    assert any("adamw ramp: no readable metrics.jsonl" in w for w in doc["warnings"])
    assert any("muon: the constant-small run diverged" in w for w in doc["warnings"])
    muon_ramp = next(a for a in doc["groups"][1]["arms"] if a["arm"] == "ramp")
    assert muon_ramp["s_small_kind"] == "reference_diverged" and muon_ramp["s_small"] is None
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "constant small (diverged)" in text
    assert "ramp: the constant-small run diverged: steps saved cannot be read" in text


def test_default_paths_pick_the_latest_schedules_folder(tmp_path, monkeypatch, capsys,
                                                       analysis_cli):
    old = write_study(tmp_path / "runs" / "schedules" / "smoke", optimizers=("adamw",))
    new = write_study(tmp_path / "runs" / "schedules" / "cpu", optimizers=("muon",))
    past = time.time() - 3600
    for p in old.glob("*/summary.json"):
        os.utime(p, (past, past))
    write_run(tmp_path / "runs" / "batch" / "cpu", "b16", [16] * 8, 3.5, sweep="batch")
    monkeypatch.chdir(tmp_path)
    analysis_cli([])
    printed = capsys.readouterr().out
    assert printed.splitlines()[0] == (
        f"no paths given: analysing {Path('runs/schedules/cpu')}, the most recent schedule "
        "study (its newest run finished just now)")
    doc = json.loads((new / "report" / "schedules.json").read_text())
    assert [g["optimizer"] for g in doc["groups"]] == ["muon"]


@pytest.mark.parametrize("case", ["missing path", "no runs", "only corrupt", "no default"])
def test_bad_input_is_a_one_line_error(tmp_path, monkeypatch, capsys, analysis_cli, case):
    args = {"missing path": [str(tmp_path / "nope")], "no runs": [str(tmp_path)],
            "only corrupt": [str(tmp_path)], "no default": []}[case]
    if case == "only corrupt":
        write_run(tmp_path, "bad", [16] * 4, 3.9)
        (tmp_path / "bad" / "summary.json").write_text("[]")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        analysis_cli(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("critbatch: error: ")
    with pytest.raises(ResultsError):
        report.run_analysis(args or None, str(tmp_path / "rep"),
                            runs_root=str(tmp_path / "runs"))


@pytest.mark.slow
def test_analysis_never_imports_the_trainer_or_torch(tmp_path):
    write_study(tmp_path, optimizers=("adamw",))
    code = "\n".join([
        "import sys",
        "from critbatch.analysis.schedules.report import run_analysis",
        f"run_analysis([{str(tmp_path)!r}], {str(tmp_path / 'rep')!r})",
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'"
        " or m.startswith('critbatch.training')))",
    ])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_peak_lr_is_the_lr_at_the_largest_batch_trained_not_at_the_cap():
    """A measured arm capped at 128 that grew only to 16 trained at most at base_lr x
    sqrt(16 / 8); without the fields to carry the rule, summary.json's lr stands."""
    from critbatch.analysis.schedules.schedules import peak_lr

    run = {"lr": 0.006, "base_lr": 0.0015, "lr_scaling": "sqrt", "base_batch_size": 8}
    assert peak_lr(run, 16) == pytest.approx(0.0015 * 2**0.5)
    assert peak_lr(run, 128) == pytest.approx(0.006)
    assert peak_lr({"lr": 0.006}, 16) == 0.006
