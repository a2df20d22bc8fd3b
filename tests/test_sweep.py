"""Sweep definitions, the plan, launchers, and the resumable `python -m critbatch.sweep`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from critbatch.orchestration import estimate, sweep
from critbatch.orchestration.experiments import EXPERIMENTS, SWEEPS_DIR
from critbatch.orchestration.stages import plan_stage
from critbatch.results import files, runs
from critbatch.results.errors import ConfigError
from critbatch.training.config import CONF_DIR, register_configs, total_steps

REPO = CONF_DIR.parent
STAGES = sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


def test_every_stage_belongs_to_an_experiment_and_says_what_it_answers():
    used = {stage for exp in EXPERIMENTS.values() for stage in exp.stages}
    assert used == set(STAGES)
    for stage in STAGES:
        first = (SWEEPS_DIR / f"{stage}.yaml").read_text().splitlines()[0]
        assert first.startswith("# ") and "?" in first, first


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["smoke", "cpu", "gpu"])
def test_grids_are_consistent_at_every_scale(scale):
    """Five or more batch sizes doubling from the baseline, three or more lrs per cell spanning
    x4 or more, or x2.5 where the lr search extends them (at cpu and gpu scale in steps of at
    most x1.6: a parabola through AdamW's x2.5 steps missed the best-lr loss by up to 0.024
    nats/token), every run with
    three or more cooldown branches and the online B_noise; the baseline batch at one or more
    other seeds."""
    for main, seeds in (("batch", "batch_seeds"), ("widths", "widths_seeds")):
        for optimizer in ("adamw", "muon"):
            jobs = plan_stage(main, scale, optimizer, [])
            cfg = jobs[0].cfg
            sizes = sorted({j.cfg.train.batch_size for j in jobs})
            assert len(sizes) >= 5 and sizes[0] == cfg.grid.base_batch_size
            assert all(b == 2 * a for a, b in zip(sizes, sizes[1:], strict=False))
            lrs = sorted({j.cfg.optim.lr for j in jobs})
            assert len(lrs) >= 3 and lrs[-1] / lrs[0] >= (2.5 if cfg.grid.lr_search else 4)
            if scale != "smoke":
                assert all(b / a <= 1.6 for a, b in zip(lrs, lrs[1:], strict=False))
            widths = {j.cfg.model.width for j in jobs}
            assert len(jobs) == len(sizes) * len(lrs) * len(widths)
            for job in jobs:
                t = job.cfg.train
                assert t.schedule == "wsd" and len(t.branch_budgets) >= 3
                assert t.branch_budgets == (cfg.grid.branch_budgets if main == "batch"
                                            else cfg.grid.widths_branch_budgets)
                assert t.batch_size // t.micro_batches >= 1 and t.micro_batches >= 2
                assert job.cfg.model.width % job.cfg.model.heads == 0
                # the largest batch's smallest branch still has steps after its warmup
                fewest = min(total_steps(b.cfg) for b in job.branches)
                assert fewest >= 2 * t.warmup_steps, (job.run_dir, fewest)
                if cfg.grid.warmup_tokens:  # at least those tokens of warmup at every batch
                    step_tokens = t.batch_size * job.cfg.model.seq_len
                    assert t.warmup_steps * step_tokens >= cfg.grid.warmup_tokens
            repeats = plan_stage(seeds, scale, optimizer, [])
            seeds_key = "baseline_seeds" if main == "batch" else "widths_baseline_seeds"
            assert {j.cfg.train.seed for j in repeats} == {
                int(x) for x in str(getattr(cfg.grid, seeds_key)).split(",")}
            assert 0 not in {j.cfg.train.seed for j in repeats}
            seeded = {j.cfg.train.batch_size for j in repeats}
            seeded_lrs = {j.cfg.optim.lr for j in repeats}
            if main == "widths":  # the baseline batch, every lr
                assert (seeded, seeded_lrs) == ({sizes[0]}, set(lrs))
            else:  # the baseline among them; lrs of the grid (every one by default)
                assert sizes[0] in seeded and seeded <= set(sizes) and seeded_lrs <= set(lrs)
                assert len(repeats) == len(seeded) * len(seeded_lrs) * len(
                    str(cfg.grid.baseline_seeds).split(","))
                if scale == "smoke":
                    assert (seeded, seeded_lrs) == ({sizes[0]}, set(lrs))
            assert {j.run_dir.parent for j in repeats} == {jobs[0].run_dir.parent}


@pytest.mark.slow
def test_plan_names_run_dirs_by_their_overrides():
    jobs = plan_stage("batch", "smoke", "muon", ["train.seed=3"])
    assert len(jobs) == 15
    names = {j.run_dir.name for j in jobs}
    assert len(names) == 15
    assert "optim.lr=0.005,optim=muon,train.batch_size=16,train.seed=3" in names
    assert {j.run_dir.parent for j in jobs} == {Path("runs/batch/smoke")}
    job = next(j for j in jobs if j.cfg.train.batch_size == 64)
    assert job.cfg.optim.lr_scaling == "linear" and job.cfg.train.seed == 3
    assert job.cfg.sweep == "batch" and job.cfg.logger.group == "batch-smoke"
    assert [b.run_dir.relative_to(job.run_dir) for b in job.branches] == [
        Path("branches/tokens=16384"), Path("branches/tokens=32768"),
        Path("branches/tokens=65536")]
    adamw = plan_stage("batch", "smoke", "adamw", [])
    assert {j.cfg.optim.lr_scaling for j in adamw} == {"sqrt"}


@pytest.mark.slow
def test_the_plan_composed_once_per_stage_equals_hydra_composing_every_job(monkeypatch,
                                                                          measured_fits):
    """Planning composes each stage's config groups once and applies each job's values to a
    copy (stages.ValueComposer); every job's config, task overrides and run folder equal
    Hydra's full composition of that job, over value overrides, group overrides (scale,
    optim, a launcher, the schedules' arms) and hydra.* values."""
    from dataclasses import asdict

    from critbatch.orchestration import stages

    cases = [("batch", "smoke", "muon", ["train.tokens=65536", "grid.batch_sizes='4,16'"]),
             ("batch_seeds", "cpu", "adamw", ["hydra/launcher=slurm_cpu",
                                              "hydra.launcher.partition=cpu"]),
             ("widths", "smoke", "muon", ["hydra.sweep.dir=elsewhere", "grid.widths='16,32'"]),
             ("schedules", "smoke", "adamw", [measured_fits]),
             ("stability_accum", "smoke", "adamw", ["optim.lr=0.003"])]
    real = stages.sweep_composer
    for stage, scale, optimizer, extra in cases:
        fast = plan_stage(stage, scale, optimizer, extra)
        monkeypatch.setattr(stages, "sweep_composer", lambda cached=True: real(False))
        full = plan_stage(stage, scale, optimizer, extra)
        monkeypatch.setattr(stages, "sweep_composer", real)
        assert len(fast) == len(full) > 0, stage
        for a, b in zip(fast, full, strict=True):
            assert (a.run_dir, a.overrides) == (b.run_dir, b.overrides), stage
            assert asdict(a.cfg) == asdict(b.cfg), (stage, a.run_dir)


@pytest.mark.slow
def test_a_new_draw_of_the_sweep_is_grid_seed_and_a_swept_key_is_refused():
    """`train.seed=10` would win over the seeds stage's own seeds (it trained 4 runs at seed
    10 for 8 at seeds 1 and 2): a one-line error that names the grid keys. grid.seed moves
    the grid's runs, grid.baseline_seeds the extra ones, and the folders say so."""
    with pytest.raises(ConfigError, match=r"train.seed=10: the batch_seeds stage sweeps "
                                          r"train.seed over 1,2; set grid.seed"):
        plan_stage("batch_seeds", "cpu", "muon", ["train.seed=10"])
    draw = ["grid.seed=10", "grid.baseline_seeds='11,12'"]
    grid, seeds = plan_stage("batch", "cpu", "muon", draw), plan_stage("batch_seeds", "cpu",
                                                                       "muon", draw)
    assert {j.cfg.train.seed for j in grid} == {10}
    assert sorted(j.cfg.train.seed for j in seeds) == [11] * 4 + [12] * 4
    assert all("grid.seed=10" in j.run_dir.name for j in grid + seeds)
    assert {j.cfg.train.seed for j in plan_stage("batch", "cpu", "muon", [])} == {0}


def test_the_estimate_hands_out_the_longest_runs_first():
    from critbatch.orchestration.workers import makespan

    assert makespan([1, 1, 1, 1, 4], 2) == 4  # 4 | 1+1+1+1; in the given order it would be 6
    assert makespan([3, 3, 2, 2, 2], 2) == 7  # greedy, not the optimum (3+3 | 2+2+2)
    assert makespan([1.5], 4) == 1.5


def test_slurm_launcher_composes():
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.partition == "gpu" and launcher.gpus_per_node == 1
    assert launcher.timeout_min > 0


def _tiny_overrides(corpus_dir: Path, cache_dir: Path) -> list[str]:
    return ["scale=smoke", "data=text_files", f"data.paths=[{corpus_dir}/*.txt]",
            f"data.cache_dir={cache_dir}", "data.vocab_size=512", "logger.mode=disabled",
            "model.width=32", "train.tokens=8192"]


@pytest.mark.slow
def test_a_tiny_sweep_through_submitit_local(corpus_dir, cache_dir, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "critbatch.train", "-m", "hydra/launcher=submitit_local",
         f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.launcher.timeout_min=10",
         *_tiny_overrides(corpus_dir, cache_dir), "train.batch_size=8,16"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/summary.json"))
    assert len(done) == 2 and all("train.batch_size=" in name for name in done)


def _sweep(cwd: Path, cache_dir: Path, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "critbatch.sweep", "batch", "--scale", "smoke", "--opt",
           "adamw", "--jobs", "1", f"data.cache_dir={cache_dir}", "logger.mode=disabled",
           # 6 grid runs, 18 branches; short runs: what is checked is which runs train, not
           # how well. A grid far below the optimum (1e-4, 2e-4): every cell's best lr is the
           # highest tried, so the lr search's one round adds 4e-4 to both batches
           "train.tokens=16384", "train.warmup_steps=2", "grid.batch_sizes='4,8'",
           "grid.lrs.adamw='1e-4,2e-4'", "grid.seeded_batch_sizes=4",
           "grid.lr_search_rounds=1", "grid.lr_search_budget=2.0"]
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **kw)


@pytest.mark.slow
def test_smoke_sweep_survives_a_kill_searches_the_lr_and_a_rerun_trains_nothing(tmp_path,
                                                                                 cache_dir):
    """Kill the sweep while its grid trains, restart it: the grid's 6 runs complete, the lr
    search adds 4e-4 to both batches and says why, 8 valid runs with their 24 branches, no
    duplicates; the record, the report and a third run (which trains nothing, the round found
    done) agree."""
    first = _sweep(tmp_path, cache_dir)
    deadline = time.time() + 300
    while time.time() < deadline and len(list(tmp_path.glob("runs/*/smoke/*/summary.json"))) < 3:
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert len(list(tmp_path.glob("runs/*/smoke/*/summary.json"))) < 6

    second = _sweep(tmp_path, cache_dir)
    out, _ = second.communicate(timeout=900)
    assert second.returncode == 0, out[-3000:]
    run_dirs = [p for p in tmp_path.glob("runs/*/smoke/*") if p.is_dir() and p.name != "report"]
    assert len(run_dirs) == 8, sorted(p.name for p in run_dirs)
    for run_dir in run_dirs:
        summary = runs.read_summary(run_dir)
        assert len(runs.read_metrics(run_dir)) == summary["steps"]  # no step written twice
        for branch in run_dir.glob("branches/*"):
            assert runs.read_summary(branch)["branch_of"] == run_dir.name
    assert len(list(tmp_path.glob("runs/batch/smoke/*/branches/*/summary.json"))) == 24
    assert "already complete" in out

    # the lr search: its round, the runs it added (named as the grid names them), its record
    assert "== lr search round 1: 2 lr(s) added" in out
    assert "batch 4: lr 0.0004, because best lr 0.0002 is the highest lr tried" in out
    folder = tmp_path / "runs/batch/smoke"
    for batch in (4, 8):
        added = next(folder.glob(f"*optim.lr=0.0004,*train.batch_size={batch},*"))
        assert runs.read_config(added)["optim"]["lr"] == 4e-4  # the base lr, as in the name
        assert "lr_search" not in added.name  # more search on a rerun reuses these runs
    (record,) = json.loads((folder / "lr_search.json").read_text()).values()
    assert [a["lr"] for a in record["rounds"][0]["added"]] == [4e-4, 4e-4]
    assert record["search_runs"] == 2
    fits = json.loads((folder / "report/fits.json").read_text())
    assert set(fits["lr_edge_cells"]) == {"adamw"} and len(fits["lr_search"]) == 1
    assert "lr search (`grid.lr_search`)" in (folder / "report/report.md").read_text()

    # B_noise at the best run, and at the same run's peak-lr checkpoint beside the online
    # tracker's reading there
    noise = list(folder.glob("*/noise.json"))
    assert len(noise) == 1 and runs.read_noise(noise[0].parent)["micro_batches"] >= 2
    assert "train.batch_size=4" in noise[0].parent.name
    assert "optim.lr=0.0004," in noise[0].parent.name
    peak = json.loads((noise[0].parent / "noise_peak_lr.json").read_text())
    assert peak["checkpoint"] == "peak_lr" and peak["online_b_noise"] is not None
    assert "at the peak lr, step" in out
    # B_crit over B_noise per optimizer, from the tracker's peak-lr readings of every run
    assert fits["noise_ratio"] and all({"ratio", "low", "high", "losses"} <= set(v)
                                       for v in fits["noise_ratio"].values())
    assert all(len(runs.read_summary(d)["noise_readings"]) == 4 for d in run_dirs
               if runs.read_summary(d)["gns_ema"] is not None)

    # every process the rerun starts lists its imports: a rerun with nothing to train (the
    # lr search's round found trained) imports no torch, neither in the sweep nor in a worker
    # timing the round's runs (the fault guarded: ~3 s of a core per rerun for nothing)
    start = time.perf_counter()
    third = _sweep(tmp_path, cache_dir, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    out, _ = third.communicate(timeout=300)
    assert third.returncode == 0, out[-3000:]
    assert time.perf_counter() - start < 30
    assert "| critbatch.orchestration.sweep\n" in out  # the imports are listed
    assert not re.search(r"^import time:.*\|\s*torch$", out, re.MULTILINE)
    assert "6 already complete, 0 to train" in out
    assert "2 lr(s) added (2 trained already)" in out
    assert "step:" not in out  # nothing was trained
    assert "report.md is up to date" in out  # nor analysed again


def test_the_workers_fork_from_a_server_that_imported_the_training_loop():
    """A stage's workers start as forks of a server that imported torch, the training loop
    and torch._dynamo (which the first optimizer built imports) once. The fault guarded: each
    worker spawned, importing torch again (~2 s a core), or importing torch._dynamo for its
    first optimizer (1.4-1.9 s a core)."""
    import multiprocessing

    from critbatch.orchestration import workers

    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork server on this platform: the workers are spawned")
    from concurrent.futures import ProcessPoolExecutor

    context = workers.worker_context()
    assert context.get_start_method() == "forkserver"
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        parent = pool.submit(os.getppid).result(timeout=120)
        # before any job of its own, the worker holds the loop the server imported
        loaded = pool.submit(eval, "{'critbatch.training.loop', 'torch._dynamo'} <= "
                                   "set(__import__('sys').modules)")
        assert loaded.result(timeout=120)
    assert parent != os.getpid()  # a fork of the server, not a child of this process


def test_the_sweep_s_own_process_imports_no_torch():
    """The sweep's process plans, waits and reports; its workers (and the estimate's timing)
    train in forks of the server, which imports torch. The fault guarded: a top-level torch
    import on the way from critbatch.sweep (the checkpoint module through the branch
    planner, the training loop through the workers) costing every sweep ~1.3 s of a core."""
    code = ("import sys, critbatch.sweep, critbatch.orchestration.launch; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_jobs_auto_is_one_per_core_on_cpu_and_one_on_gpu():
    from critbatch.orchestration.sweep import parse_jobs
    from critbatch.results.errors import ConfigError

    assert parse_jobs("auto", "gpu") is None  # decided by gpu_jobs once the plan is known
    assert parse_jobs("auto", "cpu") == max(1, os.cpu_count() or 1)
    assert parse_jobs("3", "cpu") == 3
    with pytest.raises(ConfigError, match="JOBS=0"):
        parse_jobs("0", "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["smoke", "cpu", "gpu"])
def test_stability_plan_at_every_scale(scale):
    tuning = plan_stage("stability_lr", scale, "adamw", [])
    assert {j.cfg.train.batch_size for j in tuning} == {64}
    assert len({j.cfg.optim.lr for j in tuning}) == 3
    study = plan_stage("stability", scale, "muon", ["optim.lr=0.02"])
    assert sorted(j.cfg.train.batch_size for j in study) == [1, 4, 16, 64, 256]
    for job in study:  # a fixed number of steps; the lr is carried from 64 by sqrt
        cfg = job.cfg
        assert cfg.train.steps == cfg.grid.stability.steps and cfg.optim.lr == 0.02
        assert (cfg.optim.lr_scaling, cfg.optim.base_batch_size) == ("sqrt", 64)
    assert "optim.lr=0.02" in study[0].run_dir.name
    (accum,) = plan_stage("stability_accum", scale, "adamw", ["optim.lr=0.004"])
    assert (accum.cfg.train.batch_size, accum.cfg.train.micro_batch_size) == (64, 4)
    linear = plan_stage("stability", scale, "adamw", ["optim.lr_scaling=linear"])
    assert {j.cfg.optim.lr_scaling for j in linear} == {"linear"}


@pytest.fixture
def measured_fits(tmp_path) -> str:
    """The override pointing the schedules sweep's measured arm at a planted local-CBS report
    (both optimizers, any lr rule)."""
    rows = [{"optimizer": o, "tokens": t, "b_crit": b} for o in ("adamw", "muon")
            for t, b in ((10_000, 8), (1_000_000, 64))]
    path = tmp_path / "local_cbs_fits.json"
    path.write_text(json.dumps({"local_cbs": rows}))
    return f"grid.schedules.measured_fits={path}"


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["smoke", "cpu", "gpu"])
def test_schedule_arms_train_equal_tokens(scale, measured_fits):
    for optimizer in ("adamw", "muon"):
        jobs = {j.run_dir.name.split(",")[0]: j for j in plan_stage("schedules", scale,
                                                                  optimizer, [measured_fits])}
        assert set(jobs) == {"arm=constant_small", "arm=constant_large", "arm=ramp",
                             "arm=adaptive", "arm=measured"}
        grid = jobs["arm=ramp"].cfg.grid.schedules
        assert len({j.tokens for j in jobs.values()}) == 1  # equal tokens, exactly
        assert jobs["arm=constant_small"].cfg.train.batch_size == grid.small
        assert jobs["arm=constant_large"].cfg.train.batch_size == grid.large
        for arm in ("ramp", "adaptive", "measured"):
            t = jobs[f"arm={arm}"].cfg.train
            assert (t.batch_schedule, t.batch_size_start, t.batch_size) == (arm, grid.small,
                                                                            grid.large)
        assert {j.cfg.optim.base_batch_size for j in jobs.values()} == {grid.small}
        # every arm ends annealed; only the small batch forks branches, each with steps left
        # after its warmup
        assert {j.cfg.train.schedule for j in jobs.values()} == {"wsd"}
        small = jobs["arm=constant_small"]
        assert small.cfg.train.branch_budgets == grid.branch_budgets
        assert [b.tokens for b in small.branches] == [
            int(f * grid.tokens) for f in grid.branch_budgets]
        assert min(total_steps(b.cfg) for b in small.branches) >= 2 * small.cfg.train.warmup_steps
        assert all(not j.branches for n, j in jobs.items() if n != "arm=constant_small")


def test_a_missing_local_cbs_report_is_measured_first_or_one_line(tmp_path, monkeypatch,
                                                                   measured_fits):
    from critbatch.orchestration.stages import missing_measurement
    from critbatch.results.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    assert missing_measurement("smoke", []) == Path("runs/local_cbs/smoke/report/fits.json")
    assert missing_measurement("smoke", [measured_fits]) is None
    with pytest.raises(ConfigError) as err:
        plan_stage("schedules", "smoke", "adamw", [])
    message = str(err.value)
    assert "runs/local_cbs/smoke/report/fits.json does not exist" in message
    assert "make sweep-local-cbs SCALE=smoke" in message and "\n" not in message


def _study(name: str, cwd: Path, cache_dir: Path, *extra: str,
           optimizers: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "critbatch.sweep", name, "--scale", "smoke", "--opt",
           optimizers, f"data.cache_dir={cache_dir}", "logger.mode=disabled",
           "train.eval_tokens=1024", *extra]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_stability_study_at_smoke_size_writes_its_report(tmp_path, cache_dir):
    # the preset's batches but 256 (at 20 steps it alone trained most of the sequences)
    proc = _study("stability", tmp_path, cache_dir, "grid.stability.steps=20",
                  "grid.stability.batch_sizes='1,4,16,64'", optimizers="adamw,muon")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = tmp_path / "runs/stability/smoke/report"
    for name in ("report.md", "stability.json", "train_loss.png", "grad_norm.png",
                 "accumulation.png", "lr_tuning.png"):
        assert (report / name).stat().st_size > 0, name
    doc = json.loads((report / "stability.json").read_text())
    assert sorted(g["optimizer"] for g in doc["groups"]) == ["adamw", "muon"]
    for group in doc["groups"]:
        assert [r["batch_size"] for r in group["per_batch"]] == [1, 4, 16, 64]
        assert all(r["steps"] == 20 and r["verdict"] for r in group["per_batch"])
        (accum,) = group["accumulation"]
        assert accum["verdict"].startswith("matches")
        assert accum["first_steps_max_rel_diff"] < 1e-4  # stability_rules.ACCUM_TOLERANCE
        assert group["base_lr"] == group["lr_tuning"]["best_lr"]  # the tuned lr was carried


@pytest.mark.slow
def test_schedule_study_at_smoke_size_writes_its_report(tmp_path, cache_dir):
    """The local-CBS report the measured arm follows is made first; every arm's final loss is
    compared with the annealed small batch (its cooldown branches)."""
    # a quarter of the smoke budgets: the local-CBS base run (its two forks at both seeds kept, the
    # ladders cut to three rungs, each window 4 steps of the largest branch; one lr rule) and
    # the arms; one optimizer (two go through the stability study above and the batch sweeps)
    tokens = 16384
    proc = _study("schedules", tmp_path, cache_dir, "grid.local_cbs.tokens=32768",
                  "grid.local_cbs.window_tokens=8192", "grid.local_cbs.multipliers=[1,2,4]",
                  "grid.local_cbs.lr_scalings.muon=sqrt",
                  f"grid.schedules.tokens={tokens}", optimizers="muon")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "so the local_cbs experiment runs first" in proc.stdout
    assert (tmp_path / "runs/local_cbs/smoke/report/fits.json").exists()
    report = tmp_path / "runs/schedules/smoke/report"
    for name in ("report.md", "schedules.json", "batch_vs_tokens.png", "loss_vs_steps.png",
                 "loss_vs_tokens.png"):
        assert (report / name).stat().st_size > 0, name
    doc = json.loads((report / "schedules.json").read_text())
    assert [g["optimizer"] for g in doc["groups"]] == ["muon"]
    for group in doc["groups"]:
        arms = {a["arm"]: a for a in group["arms"]}
        assert set(arms) == {"constant small", "constant large", "ramp", "adaptive",
                             "measured"}
        assert {a["tokens"] for a in arms.values()} == {tokens}  # equal tokens, exactly
        small = arms["constant small"]["steps"]
        assert small == tokens // (4 * 32)
        assert group["s_small_reference"] == "annealed"
        for name in ("ramp", "adaptive", "constant large", "measured"):
            assert arms[name]["steps"] <= small and arms[name]["s_small_kind"]


def test_a_finished_run_of_an_older_grid_is_refused_before_any_work(tmp_path, monkeypatch,
                                                                      measured_fits):
    from dataclasses import asdict

    from critbatch.analysis.bcrit.synthetic import synthetic_summary
    from critbatch.orchestration.stages import check_finished, unplanned_runs
    from critbatch.results.errors import ConfigError
    from critbatch.science.synthetic import SyntheticTruth

    monkeypatch.chdir(tmp_path)
    jobs = plan_stage("schedules", "smoke", "adamw", [measured_fits])
    ramp = next(j for j in jobs if j.cfg.train.batch_schedule == "ramp")
    ramp.run_dir.mkdir(parents=True)
    summary = synthetic_summary(SyntheticTruth(), batch_size=64, tokens=32768, lr=4e-3)
    files.write_json_atomic(ramp.run_dir / "summary.json", summary)
    old = asdict(ramp.cfg)
    old["train"]["tokens"] = 32768  # trained before grid.schedules.tokens changed
    files.write_json_atomic(ramp.run_dir / "config.json", {"config": old, "overrides": []})
    with pytest.raises(ConfigError) as err:
        check_finished(jobs)
    message = str(err.value)
    assert str(ramp.run_dir) in message and "(train.tokens)" in message and "\n" not in message
    old["train"]["tokens"] = ramp.cfg.train.tokens  # the same config: a finished run, reused
    files.write_json_atomic(ramp.run_dir / "config.json", {"config": old, "overrides": []})
    check_finished(jobs)
    assert unplanned_runs(jobs) == {}
    other = ramp.run_dir.parent / "arm=retired,optim=adamw"
    other.mkdir()
    files.write_json_atomic(other / "summary.json", summary)
    assert unplanned_runs(jobs) == {ramp.run_dir.parent: [other]}


def test_efficiency_is_the_wall_time_the_runs_would_take_side_by_side_over_the_real_one():
    from critbatch.orchestration.workers import Outcome, efficiency

    run = {"tokens": 1000, "trained_tokens": 1000, "tokens_per_s": 100.0, "val_loss": 3.0,
           "status": "completed"}
    branch = {**run, "tokens": 500, "trained_tokens": 100}  # cooled down from its fork
    outcomes = [Outcome("a", True, 11.0, [run, branch]), Outcome("b", True, 10.0, [run])]
    use = efficiency(outcomes, workers=2, wall_s=14.0)
    assert use["tokens"] == 2100
    assert use["efficiency"] == pytest.approx((10 + 1 + 10) / 2 / 14.0)
    assert use["steady_tokens_per_s"] == pytest.approx(200.0)
    assert efficiency([Outcome("c", False, 1.0, error="boom")], 2, 5.0) is None


@pytest.mark.slow
def test_a_hydra_launcher_takes_the_stages_as_multiruns(tmp_path, cache_dir):
    """ARGS="hydra/launcher=..." (SLURM, submitit, joblib): each stage goes to that launcher as
    a Hydra multirun, which trains the runs and their branches into the same folders; each lr
    the search adds goes as a multirun of its one job, named as the grid would name it."""
    cmd = [sys.executable, "-m", "critbatch.sweep", "batch", "--scale", "smoke", "--opt",
           "adamw", "--jobs", "1", f"data.cache_dir={cache_dir}", "logger.mode=disabled",
           "train.tokens=8192", "train.warmup_steps=2", "grid.batch_sizes=4",
           "grid.lrs.adamw='1e-4,2e-4'", "grid.seeded_lrs.adamw=2e-4",
           "grid.lr_search_rounds=1", "grid.lr_search_budget=2.0", "hydra/launcher=joblib",
           # one joblib worker a multirun: each is a fresh process that imports torch
           "hydra.launcher.n_jobs=1", "train.gns.peak_checkpoint=false"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "--config-name batch" in proc.stdout and "[1/" not in proc.stdout
    # the planner does not time the submitting host for runs the launcher trains elsewhere
    assert "no time estimate: a Hydra launcher" in proc.stdout and "estimated" not in proc.stdout
    mains = sorted(p.parent.name for p in tmp_path.glob("runs/batch/smoke/*/summary.json"))
    # batch 4 at two lrs, again at seed 1, and the lr the search added
    assert len(mains) == 4, mains
    assert sum("optim.lr=0.0004," in name for name in mains) == 1
    assert len(list(tmp_path.glob("runs/batch/smoke/*/branches/*/summary.json"))) == 12


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_scale_without_cuda_is_one_line_before_anything_trains(capsys):
    with pytest.raises(SystemExit) as stop:
        sweep.main(["batch", "--scale", "gpu"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.device=cpu" in err[0]
    sweep.check_cuda("gpu", ["train.device=cpu"])  # asked for: no error
    sweep.check_cuda("gpu", ["hydra/launcher=submitit_slurm"])  # trains elsewhere


def test_the_plan_times_the_runs_own_precision_and_compile(tiny_cfg):
    """The estimate's step is the run's: here bf16 autocast and torch.compile (a cheap
    backend), so dynamo compiles a graph while it is timed."""
    from torch._dynamo.utils import counters

    counters.clear()
    cfg = tiny_cfg("train.compile=true", "train.compile_backend=eager", "train.dtype=bfloat16",
                   "train.batch_size=8")
    assert estimate.measure_tokens_per_s(cfg, seconds=0.05) > 0
    assert counters["stats"]["unique_graphs"] >= 1


@pytest.mark.slow
def test_the_estimate_times_the_models_outside_the_sweep_s_own_process(tiny_overrides,
                                                                       tmp_path):
    """A plan's models are timed in a process forked from the workers' server: the sweep's
    own process never imports torch's compiler for it (nor, on a GPU, holds the timed models'
    memory). Fails when the timing runs in the calling process."""
    code = (
        "import sys\n"
        "from critbatch.orchestration import estimate\n"
        "from critbatch.training.cli import check_overrides\n"
        f"cfg = check_overrides({tiny_overrides!r} + ['train.batch_size=8'])\n"
        "rates, device = estimate.measured_rates([cfg], threads=1)\n"
        "print(rates[0] > 0, device, 'torch._dynamo' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "the", "CPU", "False"], done.stdout


@pytest.mark.parametrize("step_s, steps", [(0.001, 100), (0.02, 20), (0.1, 5)])
def test_the_estimate_times_fast_steps_for_a_fifth_of_its_box(tiny_cfg, monkeypatch, step_s,
                                                              steps):
    """A 0.5 s box: steps of 1 ms are timed for 0.1 s (20 steps would take 0.02 s), steps of
    20 ms for 20 steps, steps of 0.1 s for the whole box (5 steps); the rate is the steps'.
    Fails on a box timed whole for any step, or cut short before 20 steps."""
    from critbatch.bench import timing

    calls = []

    def fake_timer(*args, **kwargs):
        def step():
            calls.append(step_s)
            return (step_s / 2, step_s / 2)
        return step

    monkeypatch.setattr(timing, "step_timer", fake_timer)
    cfg = tiny_cfg("train.batch_size=8")
    rate = estimate.measure_tokens_per_s(cfg, seconds=0.5)
    assert len(calls) == 1 + steps  # the warm-up step, then the timed ones
    assert rate == pytest.approx(8 * cfg.model.seq_len / step_s)


def test_the_plan_states_checkpoint_disk_and_stops_when_it_is_short(tmp_path, monkeypatch):
    """With train.keep_checkpoint=all every run and branch keeps a checkpoint: the plan counts
    them (each policy's peak: tests/test_keep_checkpoint.py); a need above the free space of
    the folder is a one-line error before anything trains."""
    from critbatch.science.model_size import param_count

    monkeypatch.chdir(tmp_path)  # an empty runs/: every run and branch still to train
    jobs = plan_stage("batch", "smoke", "adamw", ["train.keep_checkpoint=all"])
    m, vocab = jobs[0].cfg.model, jobs[0].cfg.data.vocab_size
    checkpoints = sum(1 + len(j.branches) for j in jobs)
    need, kept = estimate.checkpoint_bytes(jobs)
    assert need == kept == checkpoints * param_count(m.width, m.depth, m.seq_len, vocab)[0] * 12
    assert estimate.check_disk(need, tmp_path / "runs" / "not-yet") > need
    with pytest.raises(ConfigError, match="GB free; free some space"):
        estimate.check_disk(10**18, tmp_path)


@pytest.mark.slow
def test_a_dry_run_prints_the_plan_and_creates_nothing(tmp_path, monkeypatch, capsys):
    """`--dry-run` (make sweep-* DRY=1): the plan with its tokens, time and disk, the stages
    that wait for a tuned lr said to be estimated at the middle lr, exit 0, and nothing
    written: no runs folder, no run, no report."""
    monkeypatch.chdir(tmp_path)
    # slow tokens/s: every part of the estimate shows in whole tenths of a minute
    monkeypatch.setattr(estimate, "measured_rates",
                        lambda cfgs, threads=None: ([2e3] * len(cfgs), "the CPU"))
    for experiment in ("batch", "branches"):
        with pytest.raises(SystemExit) as stop:
            sweep.main([experiment, "--scale", "smoke", "--jobs", "1", "--opt", "adamw",
                        "--dry-run", "grid.batch_sizes='4,8'"])
        assert stop.value.code == 0
        out = capsys.readouterr().out
        assert "  disk: ~" in out, out
        line = next(x for x in out.splitlines() if "; estimated " in x)
        total, parts = re.search(r"estimated ([\d.]+) min: ([^;]+);", line).groups()
        minutes = [float(part.split()[0]) for part in parts.split(" + ")]
        assert float(total) == pytest.approx(sum(minutes), abs=0.15), line  # every part counted
        assert ("lr search" in parts) == (experiment == "batch"), line  # the batch stage searches
        assert re.search(r"likely [\d.]+-[\d.]+ min", line), line
        assert out.rstrip().endswith("dry run: nothing trained, no noise measured, no report "
                                     "written")
        waits = "branch_check wait for the best lr of batch: estimated here at its grid's middle lr"
        assert (waits in out) == (experiment == "branches")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_plan_counts_the_data_preparation_when_the_cache_is_missing(tmp_path, monkeypatch,
                                                                       capsys):
    """A corpus whose token cache is not built yet: the plan names it with its size and an
    estimate, and the total includes it; once built, neither appears."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(estimate, "measured_rates",
                        lambda cfgs, threads=None: ([1e5] * len(cfgs), "the CPU"))
    with pytest.raises(SystemExit):
        sweep.main(["batch", "--scale", "smoke", "--jobs", "1", "--opt", "adamw", "--dry-run",
                    "grid.batch_sizes='4,8'", f"data.cache_dir={tmp_path / 'cache'}"])
    out = capsys.readouterr().out
    assert "data=stdlib V" in out and "its token cache is built first" in out, out
    assert "MB of text" in out and " preparing data + " in out

    from critbatch.training.config import DataConfig
    from critbatch.training.token_cache import prepare_data

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"{i}.txt").write_text(f"document {i}: " + "the quick brown fox " * 50)
    data = DataConfig(name="text_files", paths=[str(corpus / "*.txt")], vocab_size=300,
                      cache_dir=str(tmp_path / "cache"))
    cfg = SimpleNamespace(data=data)
    assert estimate.data_to_prepare([cfg, cfg]) > 0  # once per corpus
    out = capsys.readouterr().out
    assert out.count("its token cache is built first") == 1
    prepare_data(data)
    capsys.readouterr()
    assert estimate.data_to_prepare([cfg]) == 0.0 and capsys.readouterr().out == ""


def make_command(target: str, *variables: str) -> list[str]:
    """The command `make <target> <variables>` runs (`make -n`, install taken as done), with
    the venv's python as this test's."""
    dry = subprocess.run(["make", "--no-print-directory", "-n", "-o", "install", target,
                          *variables], cwd=REPO, capture_output=True, text=True, check=True)
    words = dry.stdout.replace("\\\n", " ").split()
    return [sys.executable if w == ".venv/bin/python" else w for w in words]


@pytest.mark.slow
def test_make_sweep_widths_trains_every_width_and_writes_the_kaplan_report(tmp_path, cache_dir):
    """`make sweep-widths SCALE=smoke OPT=adamw`, end to end on two widths and two batches:
    every width's runs (and the widths_seeds stage), B_noise, and a report whose joint model
    spans both widths."""
    cmd = make_command("sweep-widths", "SCALE=smoke", "OPT=adamw", "JOBS=2")
    assert cmd[1:6] == ["-m", "critbatch.sweep", "widths", "--scale", "smoke"], cmd
    proc = subprocess.run([*cmd, f"data.cache_dir={cache_dir}", "logger.mode=disabled",
                           "grid.widths='16,32'", "grid.batch_sizes='4,8'",
                           "grid.lrs.adamw='4e-3,1e-2'", "grid.widths_tokens=16384",
                           "train.gns.peak_checkpoint=false", "train.eval_tokens=1024",
                           "grid.lr_search=false"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    folder = tmp_path / "runs/widths/smoke"
    widths = {runs.read_config(p.parent)["model"]["width"]
              for p in folder.glob("*/summary.json")}
    assert widths == {16, 32}
    fits = json.loads((folder / "report/fits.json").read_text())
    assert fits["joint"]["adamw"]["widths"] == ["width 16 depth 2", "width 32 depth 2"]
    assert "kaplan" in fits and fits["noise_ratio"]["adamw"]["widths"] is not None
    assert (folder / "report/report.md").stat().st_size > 0
    assert "noise (optim=adamw)" in proc.stdout


@pytest.mark.slow
def test_make_sweep_branches_compares_branches_with_separate_runs(tmp_path, cache_dir):
    """`make sweep-branches SCALE=smoke OPT=adamw`, end to end: the batch stage trains the
    baseline batch (at one lr, not adamw's default 3e-3: the best lr found), then separate wsd
    and cosine runs at that batch and lr, and the branch check's report
    (critbatch-branch-check) compares each budget's branch with them."""
    cmd = make_command("sweep-branches", "SCALE=smoke", "OPT=adamw", "JOBS=2")
    assert cmd[1:6] == ["-m", "critbatch.sweep", "branches", "--scale", "smoke"], cmd
    proc = subprocess.run([*cmd, f"data.cache_dir={cache_dir}", "logger.mode=disabled",
                           "grid.batch_sizes=4", "grid.lrs.adamw=4e-3",
                           "grid.branch_check_tokens='16384,32768'", "grid.lr_search=false",
                           "train.eval_tokens=1024"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    checks = list((tmp_path / "runs/branch_check/smoke").glob("*/summary.json"))
    configs = [runs.read_config(p.parent) for p in checks]
    assert {c["train"]["schedule"] for c in configs} == {"wsd", "cosine"} and len(checks) == 4
    assert {(c["train"]["batch_size"], c["optim"]["lr"]) for c in configs} == {(4, 4e-3)}
    report = next((tmp_path / "runs").glob("branch_check/smoke/report/*.md"))
    assert report.stat().st_size > 0
