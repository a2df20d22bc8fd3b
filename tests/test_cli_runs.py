"""`python -m critbatch.train` as a user meets it: multirun errors in one line, a multirun whose
runs failed exits non-zero, an output path the OS refuses, and one writer per run folder."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from critbatch.results import runs
from critbatch.training.checkpoint import RunInUse, sole_writer
from critbatch.training.cli import sweep_jobs


@pytest.mark.parametrize(("args", "message"), [
    (["-m", "train.batch_sise=8,16"], "did you mean 'train.batch_size'?"),
    (["--multirun", "+foo=1", "train.batch_size=8,16"], "unknown config key 'foo'"),
    (["-m", "train.batch_size=8,sixteen"], "bad value for 'train.batch_size'"),
    (["train.seed=0", "train.batch_size=8,16"], "add -m (--multirun)"),
])
@pytest.mark.slow
def test_multirun_mistakes_are_one_line_before_any_job(tiny_overrides, tmp_path, train_cli,
                                                       args, message):
    sweep = tmp_path / "sweep"
    code, err = train_cli([args[0], *tiny_overrides, *args[1:], f"hydra.sweep.dir={sweep}"])
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not sweep.exists()


@pytest.mark.slow
def test_a_multirun_whose_runs_failed_exits_non_zero_after_the_others(
        tiny_overrides, tmp_path, train_cli):
    """The batch-8 folder holds a finished run of another seed: that job fails, 16 trains."""
    sweep = tmp_path / "sweep"
    args = ["-m", *tiny_overrides, "train.tokens=2048", f"hydra.sweep.dir={sweep}"]
    assert train_cli([*args, "train.batch_size=8"])[0] == 0
    (done,) = sweep.glob("*/config.json")
    saved = json.loads(done.read_text())
    saved["config"]["train"]["seed"] = 5
    done.write_text(json.dumps(saved))
    code, err = train_cli([*args, "train.batch_size=8,16"])
    lines = err.splitlines()  # the failed job's own line as it fails, then the verdict
    assert code == 1 and len(lines) == 2, err
    assert all(line.startswith("critbatch: error: ") for line in lines)
    assert "holds a finished run of a different config (train.seed)" in lines[0]
    assert "1 run(s) of the sweep failed" in lines[1] and "train.batch_size=8" in lines[1]
    assert sorted("train.batch_size=16" in p.parent.name
                  for p in sweep.glob("*/summary.json")) == [False, True]


def test_an_output_folder_the_os_refuses_is_one_line(tiny_overrides, train_cli):
    code, err = train_cli([*tiny_overrides, "hydra.run.dir=/proc/critbatch-not-writable"])
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "cannot write the output folder /proc/critbatch-not-writable" in err


def test_sweep_jobs_expand_like_hydras_basic_sweeper():
    jobs = sweep_jobs(["a=1,2", "b=x", "c=range(0,2)", "a=3,4"])
    assert jobs == [["a=3", "b=x", "c=0"], ["a=3", "b=x", "c=1"], ["a=4", "b=x", "c=0"],
                    ["a=4", "b=x", "c=1"]]


def test_a_folder_in_use_is_refused_naming_the_holder(tmp_path):
    holder = sole_writer(tmp_path / "run")
    holder.__enter__()
    with pytest.raises(RunInUse, match=r"in use by process \d+"), sole_writer(tmp_path / "run"):
        pass
    holder.__exit__(None, None, None)
    with sole_writer(tmp_path / "run"):  # released: free again
        pass


def _cli(run_dir: Path, overrides: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "critbatch.train", *overrides,
                             f"hydra.run.dir={run_dir}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_processes_on_one_run_folder_write_it_once_and_a_killed_holder_frees_it(
        tiny_overrides, tmp_path):
    run_dir = tmp_path / "run"
    # 160 steps; the first run is stopped (SIGSTOP) once it has logged a step, so it still
    # holds the folder however long the second takes to import torch
    overrides = [*tiny_overrides, "train.batch_size=8", "train.tokens=40960",
                 "train.log_every=1", "train.checkpoint_every_steps=20"]
    first = _cli(run_dir, overrides)
    while not (run_dir / "metrics.jsonl").exists() or not runs.read_metrics(run_dir):
        assert first.poll() is None, first.communicate()[1][-2000:]
        time.sleep(0.05)
    first.send_signal(signal.SIGSTOP)
    try:
        assert not (run_dir / "summary.json").exists()
        second = _cli(run_dir, overrides)
        _, err = second.communicate(timeout=300)
        assert second.returncode == 2 and len(err.strip().splitlines()) == 1, err
        assert f"is in use by process {first.pid}" in err
    finally:  # a stopped holder left behind by a failed assertion would never end
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    third = _cli(run_dir, overrides)  # the killed holder's lock does not block the rerun
    assert third.wait(timeout=600) == 0, third.communicate()[1][-2000:]
    summary = runs.read_summary(run_dir)
    assert len(runs.read_metrics(run_dir)) == summary["steps"] == 160  # no step twice


def test_without_a_terminal_a_run_logs_progress_lines_and_train_log_has_times(
        tiny_overrides, tmp_path, monkeypatch, train_cli):
    from critbatch.training.loop import Heartbeat

    monkeypatch.setattr(Heartbeat, "HEARTBEAT_S", 0.0)  # a line at every flush
    run_dir = tmp_path / "run"
    assert train_cli([*tiny_overrides, "train.tokens=4096", "train.batch_size=8",
                      f"hydra.run.dir={run_dir}"])[0] == 0
    lines = (run_dir / "train.log").read_text().splitlines()
    assert all(re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\] ", line) for line in lines)
    beats = [line for line in lines if "min left" in line]
    assert beats and "tokens/s" in beats[0] and "%)" in beats[0]


def test_the_console_script_completes_keys_and_makes_no_folder(tmp_path):
    script = Path(sys.executable).with_name("critbatch-train")
    assert script.exists(), "pip install -e . installs the console script"
    proc = subprocess.run([str(script), "-sc", "query=bash"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "COMP_LINE": "critbatch-train train.batch_s"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "train.batch_size=" in proc.stdout.split()
    assert not (tmp_path / "runs").exists()
