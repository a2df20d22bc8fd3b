"""`python -m critbatch.bench` at tiny size: every section runs and bench.json holds positive,
finite figures under the keys the README and the speed targets read. (Speed itself is
measured by the benchmark, not by timed tests.)"""

from __future__ import annotations

import json
import math

import pytest
import torch

from critbatch.bench import capacity, suite, timing, training_speed
from critbatch.training.config import ModelConfig, OptimConfig
from critbatch.training.model import GPT
from critbatch.training.optim import adamw_options, build_optimizers


def positive(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.fixture
def short_peak_box(monkeypatch):
    """The peak section's matmul ladder boxed to 1 s a dtype on a CPU (the bench's 4 s buys
    larger sizes, not another path): the ladder still probes, measures and skips."""
    monkeypatch.setitem(capacity.PEAK_BOX_S, "cpu", 1.0)


@pytest.mark.slow
def test_bench_writes_every_figure(tiny_overrides, tmp_path, capsys, short_peak_box):
    out = tmp_path / "bench.json"
    slow = ("gns", "share")  # 80 fixed steps; fresh processes: in the slow test below
    sections = [s for s in suite.SECTIONS if s not in slow]
    suite.main(["--json", str(out), "--repeats", "1", "--steps", "4", "--no-compile",
                "--analysis-runs", "60", "--analysis-rows", "400", "--analysis-resamples", "20",
                *(f"--only={s}" for s in sections), *tiny_overrides,
                "train.batch_size=8", "train.micro_batch_size=4"])
    results = json.loads(out.read_text())
    assert set(results) == {"meta", *sections, "targets"}
    assert results["meta"]["device"] and results["meta"]["date"]
    assert positive(results["peak"]["float32_gflops"])
    assert positive(results["peak"]["bfloat16_gflops"])

    rows = results["train"]["presets"]
    assert list(rows) == list(timing.presets("cpu"))
    for row in rows.values():
        for key in ("tokens_per_s", "minimal_tokens_per_s", "step_ms", "data_ms", "fwd_bwd_ms",
                    "optimizer_ms", "logging_ms", "total_ms", "peak_gflops", "mfu", "params"):
            assert positive(row[key]), key
        assert math.isfinite(row["noise_ms"]) and math.isfinite(row["overhead_percent"])
        assert row["noise_counted"]  # 2 micro-batches of 4: the trainer tracks B_noise

    for shape in results["variants"].values():
        assert {"dtype", "adamw", "optimizer"} <= set(shape)
        for pair in shape.values():
            if "skipped" in pair:  # time-boxed (bf16 on a CPU without bf16 instructions)
                continue
            assert positive(pair["ratio"])
            a, b = (k for k in pair if k not in ("ratio", "compared"))
            assert positive(pair[a]["step_ms"]) and positive(pair[b][pair["compared"]])
    for row in results["data"].values():
        assert positive(row["batches_per_s"]) and positive(row["ratio"])
    assert results["analysis"]["n_runs"] >= 60 and positive(results["analysis"]["total_s"])
    table = results["analysis"]["table"]
    assert table["rows"] == 400 and table["resamples"] == 20
    assert positive(table["fit_bcrit"]["rows_per_s"]) and positive(table["recommend"]["seconds"])

    targets = {t["target"]: t for t in results["targets"]}
    assert len(targets) == 9
    measured = [t for t in targets.values() if t["measured"] is not None]
    assert len(measured) == 6
    for t in measured:  # a cost measured far below zero (4 steps on a busy machine) is noise:
        undetermined = t["met"] is None and t["measured"] < 0  # undetermined, not met
        assert isinstance(t["met"], bool) or undetermined, t
    printed = capsys.readouterr().out
    assert "| preset |" in printed and "| target |" in printed


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_peak_is_time_boxed_where_bf16_is_slow(short_peak_box):
    """With oneDNN off, torch multiplies bf16 on its reference gemm (~1.5 GFLOP/s), as on a CPU
    without bf16 matrix instructions: the ladder measures its probe and skips the large sizes
    (each n = 4096 product would take ~90 s) instead of hanging there."""
    with torch.backends.mkldnn.flags(enabled=False):
        result = capacity.bench_peak(timing.Options(repeats=1))
    assert list(result["bfloat16_by_size"])[0] == "256"
    assert 4096 in result["bfloat16_skipped_sizes"]
    assert set(result["bfloat16_by_size"]).isdisjoint(map(str, result["bfloat16_skipped_sizes"]))
    assert positive(result["bfloat16_gflops"]) and positive(result["float32_gflops"])


def test_variant_pair_too_slow_for_its_box_is_skipped_with_the_reason(tiny_overrides, capsys):
    """A dtype measured at a crawl skips the variant pair that uses it; the others still run."""
    opts = timing.Options(overrides=tiny_overrides, steps=4, compile=False,
                          probe={"float32_gflops": 50.0, "bfloat16_gflops": 1e-4})
    out = training_speed.bench_variants(opts)
    for shape in out.values():
        assert "bfloat16 would take" in shape["dtype"]["skipped"]
        assert positive(shape["adamw"]["ratio"]) and positive(shape["optimizer"]["ratio"])
    assert "dtype: skipped: bfloat16 would take" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_gns_and_share_sections(tiny_overrides, tmp_path):
    out = tmp_path / "bench.json"
    suite.main(["--json", str(out), "--repeats", "1", "--steps", "4", "--only", "gns",
                "--only", "share", *tiny_overrides, "train.batch_size=8",
                "train.micro_batch_size=4"])
    results = json.loads(out.read_text())
    gns = results["gns"]
    assert positive(gns["tokens_per_s_on"]) and positive(gns["tokens_per_s_off"])
    assert positive(gns["accum_ms_on"]) and math.isfinite(gns["overhead_percent"])
    layouts = results["share"]["layouts"]
    assert [x["jobs"] for x in layouts][0] == 1 and len(layouts) == 3
    for layout in layouts:
        assert len(layout["tokens_per_s"]) == layout["jobs"]
        assert all(positive(x) for x in layout["tokens_per_s"]) and positive(layout["speedup"])


def test_adamw_is_fused_by_default_and_foreach_on_request():
    assert adamw_options(OptimConfig(), "cpu")["fused"] is True
    assert adamw_options(OptimConfig(fused=False), "cpu") == {
        "betas": (0.9, 0.95), "eps": 1e-8, "foreach": True}
    model = GPT(ModelConfig(width=32, depth=1, heads=2, seq_len=8), vocab_size=64)
    (adamw,) = build_optimizers(model, OptimConfig(), 32, "cpu")
    assert adamw.defaults["fused"] is True


def test_fused_and_foreach_adamw_train_alike():
    """The default (fused) kernel takes the same steps as the foreach one, to rounding."""
    losses = {}
    for fused in (True, False):
        torch.manual_seed(0)
        model = GPT(ModelConfig(width=32, depth=2, heads=2, seq_len=16), vocab_size=64)
        (opt,) = build_optimizers(model, OptimConfig(fused=fused), 8, "cpu")
        idx = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(1))
        for _ in range(5):
            loss = model(idx[:, :-1], idx[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses[fused] = loss.item()
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)


def test_bad_arguments_are_one_line_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        suite.main(["--steps", "2"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("critbatch: error: --steps")
    with pytest.raises(SystemExit) as exit_info:
        suite.main(["--analysis-resamples", "5"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("critbatch: error: --analysis-resamples")
