"""Gradient noise scale: the estimator against known answers, the program, online tracking."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch.func import functional_call, grad, vmap

from critbatch.results import runs
from critbatch.results.errors import ConfigError
from critbatch.science.noise import (
    NoiseEMA,
    ema_interval,
    estimate,
    g2_estimate,
    noise_scale,
    trace_estimate,
)
from critbatch.training.data import sample_batch
from critbatch.training.gns import MicroGradNorms, group_sums, micro_batch_gradients
from critbatch.training.loop import train
from critbatch.training.model import GPT
from critbatch.training.noise_program import TABLE_HEADER, main, measure_run, table_row
from critbatch.training.schedule import constant_lr_reading_steps, wsd_decay_start
from critbatch.training.token_cache import prepare_data

CPU = torch.device("cpu")
NO_AMP = torch.autocast("cpu", enabled=False)


# ---------------------------------------------------------------------------
# Synthetic gradients with a known G and Sigma


def synthetic(n_params: int = 1000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A true gradient G (|G|^2 = 10) and a diagonal per-example covariance (tr = 1000)."""
    gen = torch.Generator().manual_seed(seed)
    g_true = torch.full((n_params,), 0.1, dtype=torch.float64)
    var = 0.5 + torch.rand(n_params, generator=gen, dtype=torch.float64)  # mean 1
    return g_true, var * (1000 / var.sum())


def micro_gradients(g_true, var, k: int, b: int, gen, trials: int = 1) -> torch.Tensor:
    """(trials, K, P) micro-batch gradients: G + the mean of b per-example noises."""
    noise = torch.randn(trials, k, b, len(g_true), generator=gen, dtype=torch.float64)
    return g_true + (noise * var.sqrt()).mean(2)


@pytest.mark.slow
def test_both_estimates_are_unbiased_on_synthetic_gradients():
    """Mean over 4,000 trials of K = 8 micro-batches of b = 4 (B = 32 << B_noise = 100).

    One trial's |G|^2 has a relative std of ~sqrt(4 G'SG/B + 2 tr(S^2)/B^2)/|G|^2 ~ 0.16,
    so the mean of 4,000 is within 0.25% (1 sigma) of the truth; 2% is > 5 sigma.
    """
    g_true, var = synthetic()
    gen = torch.Generator().manual_seed(1)
    k, b = 8, 4
    g2s, traces = [], []
    for _ in range(4):
        g = micro_gradients(g_true, var, k, b, gen, trials=1000)  # (1000, K, P)
        small = g.square().sum(-1).mean(-1)  # mean |g_b|^2
        big = g.mean(1).square().sum(-1)  # |g_B|^2
        g2s.append(g2_estimate(small, big, b, k * b))
        traces.append(trace_estimate(small, big, b, k * b))
    g2, trace = torch.cat(g2s), torch.cat(traces)
    assert g2.mean().item() == pytest.approx(10.0, rel=0.02)
    assert trace.mean().item() == pytest.approx(1000.0, rel=0.02)
    # the naive per-trial ratio is biased; the ratio of the means is not
    assert (trace.mean() / g2.mean()).item() == pytest.approx(100.0, rel=0.03)


def test_b_noise_within_5_percent_with_enough_micro_batches():
    """K = 2048 micro-batches of b = 4: B_noise's relative std is ~1%, so 5% is ~5 sigma."""
    g_true, var = synthetic()
    g = micro_gradients(g_true, var, 2048, 4, torch.Generator().manual_seed(2))[0]
    est = estimate(group_sums(((gi.float(), torch.tensor(0.0)) for gi in g), 16), 4)
    assert est.b_noise == pytest.approx(100.0, rel=0.05)
    assert est.g2 == pytest.approx(10.0, rel=0.05) and est.trace == pytest.approx(1000, rel=0.05)
    assert est.b_noise_low < 100 < est.b_noise_high


@pytest.mark.slow
def test_jackknife_error_bar_matches_the_spread_of_repeats():
    """60 repeats of K = 128: the mean jackknife SE of log B_noise matches their actual spread.

    The spread of 60 repeats is itself known to ~10%, and 16 groups give each SE to ~18%;
    a factor 1.5 either way therefore only fails if the error bar is wrong.
    """
    g_true, var = synthetic()
    gen = torch.Generator().manual_seed(3)
    logs, ses = [], []
    for g in micro_gradients(g_true, var, 128, 4, gen, trials=60):
        est = estimate(group_sums(((gi.float(), torch.tensor(0.0)) for gi in g), 16), 4)
        logs.append(math.log(est.b_noise))
        ses.append(math.log(est.b_noise_high / est.b_noise))
    ratio = float(np.mean(ses) / np.std(logs, ddof=1))
    assert 1 / 1.5 < ratio < 1.5, ratio


def test_negative_g2_is_not_resolved_never_negative():
    assert noise_scale(5.0, -0.1) is None and noise_scale(5.0, 0.0) is None
    assert noise_scale(-1.0, 0.1) is None
    assert noise_scale(5.0, 0.5) == 10.0
    # two micro-batches pointing in opposite directions: cross term < 0, so |G|^2 < 0
    grads = [(torch.tensor([1.0, 0.0]), torch.tensor(3.0)),
             (torch.tensor([-1.0, 0.0]), torch.tensor(3.0))]
    est = estimate(group_sums(grads, 2), 4)
    assert est.g2 < 0 and est.b_noise is None and est.b_noise_low is None
    record = {"resolved": False, "width": 32, "step": 10, "val_loss_per_byte": 2.0,
              "trace": est.trace, "g2": est.g2, "micro_batches": 2, "micro_batch_size": 4}
    assert "not resolved" in table_row(record) and "increase K" in table_row(record)
    ema = NoiseEMA(0.9, b=4, big=16)
    ema.update(g2_small=1.0, g2_big=2.0, loss=3.0)  # |g_B| > mean |g_b|: tr < 0, |G|^2 > 0
    assert ema.trace < 0 and ema.b_noise is None


def test_ema_is_bias_corrected_and_averages_before_dividing():
    ema = NoiseEMA(0.99, b=4, big=16)
    assert ema.b_noise is None and ema.g2 is None  # nothing measured yet
    ema.update(g2_small=3.0, g2_big=1.5, loss=5.0)
    g2, trace = g2_estimate(3.0, 1.5, 4, 16), trace_estimate(3.0, 1.5, 4, 16)
    # after one step the corrected EMA is that step's value, not 1% of it
    assert ema.g2 == pytest.approx(g2) and ema.trace == pytest.approx(trace)
    assert ema.loss == pytest.approx(5.0)
    ema.update(g2_small=2.0, g2_big=float("nan"), loss=5.0)  # non-finite step: skipped
    ema.update(g2_small=500.0, g2_big=200.0, loss=9.0)  # |g_B|^2 > 100 x its average: a spike
    assert ema.steps == 1 and ema.skipped == 2 and ema.g2 == pytest.approx(g2)
    row = ema.update(g2_small=3.0, g2_big=0.5, loss=4.0)
    g2_2, trace_2 = g2_estimate(3.0, 0.5, 4, 16), trace_estimate(3.0, 0.5, 4, 16)
    w1, w2 = 0.99 * 0.01, 0.01  # weights of steps 1 and 2 before normalisation
    g2_avg = (w1 * g2 + w2 * g2_2) / (w1 + w2)
    trace_avg = (w1 * trace + w2 * trace_2) / (w1 + w2)
    assert row["gns_g2"] == pytest.approx(g2_avg) and row["gns_trace"] == pytest.approx(trace_avg)
    assert row["b_noise"] == pytest.approx(trace_avg / g2_avg)  # ratio of the averages
    assert row["gns_g2_step"] == pytest.approx(g2_2)


# ---------------------------------------------------------------------------
# Exact per-example gradients of a real (tiny) GPT


@pytest.fixture(scope="module")
def exact_case(corpus_dir, cache_dir):
    """A tiny GPT at its seeded init, N = 256 fixed training windows, every per-example gradient.

    Returns (cfg, model, dataset (N, T+1), per-example gradients (N, P) float64).
    """
    from critbatch.training.cli import check_overrides

    cfg = check_overrides([
        "scale=smoke", "data=text_files", f"data.paths=[{corpus_dir}/*.txt]",
        f"data.cache_dir={cache_dir}", "data.vocab_size=512", "model.width=32",
        "model.heads=2", "model.depth=2", "model.seq_len=32", "logger.mode=disabled",
    ])
    torch.manual_seed(0)
    model = GPT(cfg.model, cfg.data.vocab_size)
    data = prepare_data(cfg.data)
    dataset = sample_batch(data.train, cfg.model.seq_len, 256, seed=123, step=0)  # (N, T+1)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def example_loss(p, seq):  # mean token loss of one sequence: what a micro-batch averages
        return functional_call(model, p, (seq[None, :-1], seq[None, 1:]))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vmap's SDPA fallback warns about speed only
        per_example = vmap(grad(example_loss), in_dims=(None, 0))(params, dataset)
    flat = torch.cat([per_example[name].reshape(len(dataset), -1)
                      for name, _ in model.named_parameters()], dim=1)
    return cfg, model, dataset, flat.double()


def test_estimate_matches_exact_per_example_gradients(exact_case):
    """The program's estimator, sampling micro-batches from a finite dataset, vs the exact answer.

    Over the N = 256 sequences (drawn with replacement, so i.i.d.), the exact values are
    |G|^2 = |mean_n g_n|^2 and tr(Sigma) = mean_n |g_n - G|^2. The |G|^2 estimate is a
    U-statistic of K micro-batch gradients with variance exactly
    4 G'Sigma G / (K b) + 2 tr(Sigma^2) / (b^2 K (K - 1)); tr(Sigma)'s is of the same order.
    Both are computed below from the exact gradients: with K = 64 micro-batches of b = 32
    (2,048 sequences, ~1 s) the relative std is ~1.3% for |G|^2 (B_noise ~ 65 sequences at
    this init), so 10% is > 5 sigma -- the test asserts that margin (>= 4 sigma) before it
    asserts the agreement, so a change that makes it flaky fails loudly instead.
    """
    _, model, dataset, flat = exact_case
    n, k, b = len(dataset), 64, 32
    g_true = flat.mean(0)
    x = flat - g_true  # (N, P) centred per-example gradients
    g2_exact = float(g_true @ g_true)
    trace_exact = float(x.square().sum(1).mean())
    tr_sigma2 = float((x @ x.T).square().sum()) / n**2  # tr(Sigma^2) via the Gram matrix
    g_sigma_g = float((x @ g_true).square().mean())
    std_g2 = math.sqrt(4 * g_sigma_g / (k * b) + 2 * tr_sigma2 / (b**2 * k * (k - 1)))
    assert std_g2 / g2_exact < 0.10 / 4, "K is too small for a 10% check at 4 sigma"

    idx = torch.randint(0, n, (k * b,), generator=torch.Generator().manual_seed(0))
    gradients = micro_batch_gradients(model, dataset[idx].split(b), CPU, NO_AMP)
    est = estimate(group_sums(gradients, 16), b)
    assert est.g2 == pytest.approx(g2_exact, rel=0.10)
    assert est.trace == pytest.approx(trace_exact, rel=0.10)
    assert est.b_noise == pytest.approx(trace_exact / g2_exact, rel=0.10)
    assert est.b_noise_low < trace_exact / g2_exact * 1.25 and est.b_noise_high > trace_exact / (
        g2_exact * 1.25)


def test_online_micro_norms_are_the_exact_micro_batch_norms(exact_case):
    """MicroGradNorms (hooks on the accumulating backward) vs each micro-batch's exact gradient,
    and the accumulated gradient left exactly as plain accumulation makes it."""
    _, model, dataset, flat = exact_case
    accum, b = 4, 8
    norms = MicroGradNorms(model.parameters(), accum)
    try:
        for step in range(2):
            model.zero_grad(set_to_none=True)
            got = []
            for i in range(accum):
                batch = dataset[(step * accum + i) * b : (step * accum + i + 1) * b]
                (model(batch[:, :-1], batch[:, 1:]) / accum).backward()
                got.append(norms.pop().item())
            exact = [flat[(step * accum + i) * b : (step * accum + i + 1) * b].mean(0)
                     .square().sum().item() for i in range(accum)]
            assert got == pytest.approx(exact, rel=1e-4)
            accumulated = torch.cat([p.grad.flatten() for p in model.parameters()]).double()
            mean = flat[step * accum * b : (step + 1) * accum * b].mean(0)
            torch.testing.assert_close(accumulated, mean, rtol=1e-4, atol=1e-7)
    finally:
        norms.remove()
        model.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------
# The program and online tracking on a trained run with gradient accumulation

def test_online_tracking_writes_metrics_and_summary(accum_run):
    run_dir, summary, _ = accum_run
    assert summary["steps"] == 160 and summary["gns_ema"] == 0.95
    assert summary["gns_steps"] + summary["gns_skipped"] == 160
    assert summary["b_noise"] > 0
    assert summary["b_noise_tokens"] == pytest.approx(summary["b_noise"] * 32)
    assert summary["b_noise_loss"] == pytest.approx(
        summary["b_noise_loss_per_byte"] * summary["bytes_per_token"])
    rows = runs.read_metrics(run_dir)
    assert {"gns_g2", "gns_trace", "b_noise", "gns_g2_step", "gns_trace_step"} <= set(rows[-1])
    assert rows[-1]["b_noise"] == pytest.approx(summary["b_noise"])
    assert rows[-1]["gns_trace"] / rows[-1]["gns_g2"] == pytest.approx(summary["b_noise"])
    # the EMA's loss sits between the last steps' train losses and the first step's
    assert min(r["train_loss"] for r in rows) < summary["b_noise_loss"] < rows[0]["train_loss"]


@pytest.mark.slow
def test_the_tracker_is_read_at_the_peak_lr_with_a_validation_loss(tiny_cfg, tmp_path):
    """A wsd run reads its online B_noise four times in its constant-lr phase, the last at
    the cooldown's start; each reading is the tracker's state after that step (its metrics
    row) with a validation loss; a cosine run has no constant phase and no readings."""
    cfg = tiny_cfg("train.batch_size=16", "train.micro_batch_size=4", "train.tokens=51200",
                   "train.schedule=wsd", "train.warmup_steps=10", "train.eval_points=3")
    summary = train(cfg, tmp_path / "wsd")
    steps = constant_lr_reading_steps(summary["steps"], cfg.train)
    assert steps == [10 + round(f * (80 - 10)) for f in (0.25, 0.5, 0.75, 1.0)]
    assert steps[-1] == wsd_decay_start(100, cfg.train) == 80
    readings = summary["noise_readings"]
    assert [r["step"] for r in readings] == steps
    rows = {r["step"]: r for r in runs.read_metrics(tmp_path / "wsd")}
    for r in readings:
        assert r["lr"] == pytest.approx(summary["lr"])  # the peak lr: no decay seen
        assert r["b_noise"] == pytest.approx(rows[r["step"]]["b_noise"])
        assert r["gns_trace"] / r["gns_g2"] == pytest.approx(r["b_noise"])
        assert r["tokens"] == r["step"] * 16 * 32
    losses = [r["val_loss"] for r in readings]
    assert losses[-1] < losses[0] < summary["curve"][0]["val_loss"]
    cosine = train(tiny_cfg("train.batch_size=16", "train.micro_batch_size=4",
                            "train.tokens=25600", "train.schedule=cosine"), tmp_path / "cos")
    assert cosine["noise_readings"] == []


def test_the_tracker_s_interval_holds_its_level_on_independent_steps():
    """ema_interval's 68% interval of B_noise from an EMA of noisy per-step estimates (true
    |G|^2 2, tr(Sigma) 100: B_noise 50) holds the truth in about 68% of 400 repeats."""
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(400):
        g = 2.0 + 1.0 * rng.standard_normal(300)
        t = 100.0 + 10.0 * rng.standard_normal(300) + 40.0 * (g - 2.0)  # correlated
        b, low, high = ema_interval(g, t, 0.98)
        hits += low <= 50.0 <= high
    assert 0.60 * 400 <= hits <= 0.76 * 400, hits
    assert ema_interval([-1.0, -2.0, 0.5], [1.0, 2.0, 3.0], 0.9) is None


@pytest.mark.slow
def test_the_noise_program_and_the_tracker_meet_at_a_peak_lr_checkpoint(tiny_cfg, tmp_path,
                                                                         capsys):
    """train.gns.peak_checkpoint keeps the state of the last peak-lr reading; the noise
    program there writes noise_peak_lr.json with the tracker's reading at that step and its
    interval (the EMA rebuilt from metrics.jsonl gives the reading itself)."""
    cfg = tiny_cfg("train.batch_size=16", "train.micro_batch_size=4", "train.tokens=51200",
                   "train.schedule=wsd", "train.warmup_steps=10", "train.gns.peak_checkpoint=true")
    summary = train(cfg, tmp_path / "run")
    last = summary["noise_readings"][-1]
    assert (tmp_path / "run" / "checkpoint_peak_lr.pt").exists()
    main([str(tmp_path / "run"), "--checkpoint", "peak_lr", "-K", "64", "-b", "4"])
    record = json.loads((tmp_path / "run" / "noise_peak_lr.json").read_text())
    assert record["step"] == last["step"] == 80 and record["checkpoint"] == "peak_lr"
    assert record["val_loss"] == pytest.approx(last["val_loss"], rel=1e-6)
    assert record["online_b_noise"] == pytest.approx(last["b_noise"])
    low, high = record["online_b_noise_low"], record["online_b_noise_high"]
    assert low < last["b_noise"] < high and isinstance(record["tracker_agrees"], bool)
    assert "online tracker at step 80 (the peak lr)" in capsys.readouterr().out
    assert not (tmp_path / "run" / "noise.json").exists()  # the final one is left alone
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--checkpoint", "peak_lr"])
    # both checkpoints in one process (as the sweep measures them): the same peak-lr record
    # and the final one beside it
    (tmp_path / "run" / "noise_peak_lr.json").unlink()
    main([str(tmp_path / "run"), "--checkpoint", "final", "--checkpoint", "peak_lr", "-K", "64",
          "-b", "4"])
    again = json.loads((tmp_path / "run" / "noise_peak_lr.json").read_text())
    assert again["b_noise"] == record["b_noise"] and again["step"] == 80
    assert runs.read_noise(tmp_path / "run")["step"] == summary["steps"]
    # the final checkpoint is measured and written before the peak-lr one fails (the sweep
    # keeps a B_noise whose peak-lr reading failed after it)
    (tmp_path / "run" / "noise.json").unlink()
    (tmp_path / "run" / "checkpoint_peak_lr.pt").unlink()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "run"), "--checkpoint", "final", "--checkpoint", "peak_lr", "-K",
              "64", "-b", "4"])
    assert runs.read_noise(tmp_path / "run")["step"] == summary["steps"]


def test_gns_off_without_accumulation_or_when_disabled(tiny_cfg, tmp_path):
    plain = train(tiny_cfg("train.batch_size=8", "train.tokens=2560"), tmp_path / "plain")
    off = train(tiny_cfg("train.batch_size=8", "train.micro_batch_size=4", "train.tokens=2560",
                         "train.gns.enabled=false"), tmp_path / "off")
    for summary, name in ((plain, "plain"), (off, "off")):
        assert summary["b_noise"] is None and summary["gns_ema"] is None
        assert "b_noise" not in runs.read_metrics(tmp_path / name)[0]
    with pytest.raises(ConfigError, match=r"train.gns.ema=1.5"):
        tiny_cfg("train.gns.ema=1.5")


def test_noise_program_writes_noise_json_and_agrees_with_online(accum_run, capsys):
    """Offline (K = 128, b = 4) vs the online EMA at the same checkpoint: within a factor 3.

    The tolerance is wide on purpose: the online value is an EMA over the last ~20 steps
    of 4 micro-batches (~30% noise; B_noise grows while the loss falls, so it lags), and the
    offline one has a ~15% (1 sigma) error bar at K = 128; a factor 3 is "the same order
    of magnitude" and still fails if either side is off by a scale (e.g. b vs B, or accum^2).
    """
    run_dir, summary, _ = accum_run
    record = measure_run(run_dir, micro_batches=128, micro_batch_size=4)
    on_disk = runs.read_noise(run_dir)
    assert on_disk == json.loads(json.dumps(record))
    assert set(runs.NOISE_KEYS) <= set(on_disk)
    assert on_disk["resolved"] is True
    assert (on_disk["micro_batches"], on_disk["micro_batch_size"]) == (128, 4)
    assert on_disk["step"] == 160 and on_disk["tokens"] == summary["tokens"]
    assert on_disk["seq_len"] == 32
    assert on_disk["b_noise"] == pytest.approx(on_disk["trace"] / on_disk["g2"])
    assert on_disk["b_noise_tokens"] == pytest.approx(on_disk["b_noise"] * 32)
    assert on_disk["b_noise_low"] < on_disk["b_noise"] < on_disk["b_noise_high"]
    assert on_disk["val_loss"] == pytest.approx(summary["val_loss"], rel=1e-5)
    assert on_disk["val_loss_per_byte"] == pytest.approx(summary["val_loss_per_byte"], rel=1e-5)
    assert on_disk["online_b_noise"] == summary["b_noise"]
    ratio = summary["b_noise"] / on_disk["b_noise"]
    assert 1 / 3 < ratio < 3, (summary["b_noise"], on_disk["b_noise"])
    out = capsys.readouterr().out
    assert TABLE_HEADER in out and "| width 32, 160 steps |" in out and "| 128 x 4 |" in out


def test_the_program_measures_b_full_through_the_model_s_hessian(accum_run, capsys):
    """--full N: B_full from Hessian-vector products through the GPT (attention's double
    backward included) beside the same B_simple; the printed line names both."""
    run_dir, _, _ = accum_run
    main([str(run_dir), "-K", "32", "-b", "4", "--full", "16"])
    record = runs.read_noise(run_dir)
    assert record["hessian_sequences"] == 16
    assert {"b_full", "b_full_low", "b_full_high", "g_h_g", "trace_h_sigma"} <= set(record)
    if record["b_full"] is not None:
        assert record["b_full"] == pytest.approx(record["trace_h_sigma"] / record["g_h_g"])
    assert "B_full = tr(H Sigma) / G'HG" in capsys.readouterr().out
    # without --full: no B_full fields
    main([str(run_dir), "-K", "32", "-b", "4"])
    assert "b_full" not in runs.read_noise(run_dir)


def test_bad_inputs_are_one_line_errors(accum_run, tmp_path, capsys):
    run_dir, _, _ = accum_run
    cases = [
        ([str(run_dir), "--micro-batches", "1"], "K >= 2"),
        ([str(run_dir), "--micro-batch-size", "1000000"], "lower it"),
        ([str(run_dir), "--micro-batches", "many"], "invalid int value"),
        ([str(tmp_path)], "has no checkpoint.pt"),
        ([str(tmp_path / "missing")], "is not a directory"),
    ]
    for argv, fragment in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("critbatch: error: ") and err.count("\n") == 1, err
        assert fragment in err, err
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "cannot be loaded" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_without_checkpoint_exits_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "critbatch.noise", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "has no checkpoint.pt" in proc.stderr


def test_the_sweep_s_noise_program_runs_forked_with_its_output_and_exit_code(tmp_path):
    """A sweep runs the noise program in a worker forked from the training workers' server
    (`workers.main_logged`): what it prints lands in the log, its exit code is the program's
    (the faults guarded: output lost to the sweep's terminal, a failure read as a success)."""
    from critbatch.orchestration import workers

    log = tmp_path / "noise.log"
    proc = workers.worker_context().Process(target=workers.main_logged, args=(
        "critbatch.noise", [str(tmp_path / "missing")], str(log), 1))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 2
    assert "missing is not a directory; pass a run directory" in log.read_text()
