"""The local critical batch report (`analysis/local_cbs.py`) on synthetic branch folders with a
planted local B_crit per checkpoint: recovery within a doubling, Kaplan's exponent of the
local points, the fits.json contract, the report files and the one-line errors; and on
branches planted in effective tokens, the tokens-equivalent local B_crit and the pooling of
the seed scatter only over checkpoints whose variances agree."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from critbatch.analysis.bcrit.synthetic import synthetic_summary
from critbatch.analysis.local_cbs.local_cbs import FITS_KEYS, ROW_KEYS
from critbatch.analysis.local_cbs.report import run_analysis
from critbatch.results.errors import ResultsError
from critbatch.results.files import write_json_atomic
from critbatch.science.synthetic import SyntheticTruth

SCRIPT = Path(__file__).resolve().parents[1] / "analysis" / "local_cbs.py"
SEQ_LEN = 64  # tokens per sequence
BASE = 32  # sequences: the base run's batch
KS = (1, 2, 4, 8, 16, 32, 64)
CHECKPOINTS = tuple(2**i for i in range(16, 25)) + (3 * 2**20,)  # tokens, one between evals
WINDOW = 2**18  # tokens each branch trains
BASE_TOKENS = 2**25
SEQUENCES = 512  # validation windows
EXPONENT = 3.0  # planted 1/alpha_B of the local B_crit
B_STAR_TOKENS = 70 * SEQ_LEN * 8.96**EXPONENT  # about 2.2 x BASE at the first checkpoint
SEQUENCE_SD, BRANCH_SD, STEP_SD = 0.02, 0.0005, 0.003  # nats/token
EXCESS_SLOPE = 0.2  # nats/token of excess per unit of k B / b_crit - 1 above b_crit


def planted_loss(tokens: float) -> float:
    """Validation loss of the base run (nats/token): falls, then plateaus."""
    return 3.0 + 2.0 * (tokens / 1e6) ** -0.4


def planted_bcrit(tokens: float) -> float:
    """The planted local B_crit (sequences): Kaplan's law at the checkpoint's loss."""
    return B_STAR_TOKENS / planted_loss(tokens) ** EXPONENT / SEQ_LEN


def summary(batch_size: int, tokens: int, optimizer: str, curve: list[dict], **extra) -> dict:
    s = synthetic_summary(SyntheticTruth(seq_len=SEQ_LEN), batch_size=batch_size,
                          tokens=tokens, lr=1e-3, optimizer=optimizer)
    return {**s, "tokens": tokens, "curve": curve, "val_loss": curve[-1]["val_loss"],
            "val_loss_per_byte": curve[-1]["val_loss"] / 3, "sweep": "local_cbs", **extra}


def eval_point(tokens: int, batch_size: int, loss: float, b_noise: float | None = None) -> dict:
    point = {"step": tokens // (batch_size * SEQ_LEN), "tokens": tokens, "val_loss": loss,
             "val_loss_per_byte": loss / 3}
    return point if b_noise is None else {**point, "b_noise": b_noise}


def write_run(run_dir: Path, summary_: dict, seed: int, metrics: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "summary.json", summary_)
    write_json_atomic(run_dir / "config.json", {"config": {"train": {"seed": seed}}})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))


def write_branch(folder: Path, *, rng, mu: np.ndarray, at: int, k: int, excess: float,
                 optimizer: str, seed: int = 0, branch_sd: float = BRANCH_SD,
                 inner: tuple[tuple[int, float], ...] = ()) -> None:
    """One branch: per-sequence losses mu_j + excess + u_b + e_bj, its training losses per
    step (a row before the fork with a loss the EMA rule must never see), and eval points at
    the fork, at `inner` (tokens, loss) and at the end."""
    batch = k * BASE
    offset = rng.normal(0, branch_sd)
    losses = mu + excess + offset + rng.normal(0, SEQUENCE_SD, len(mu))
    steps = WINDOW // (batch * SEQ_LEN)
    metrics = [{"step": 0, "tokens": at, "train_loss": 99.0}]
    metrics += [{"step": i + 1, "tokens": at + (i + 1) * batch * SEQ_LEN,
                 "train_loss": float(mu.mean() + excess + offset + rng.normal(0, STEP_SD))}
                for i in range(steps)]
    end = at + WINDOW
    curve = [eval_point(at, batch, float(mu.mean())),
             *(eval_point(t, batch, loss) for t, loss in inner),
             eval_point(end, batch, float(losses.mean()))]
    write_run(folder, summary(batch, end, optimizer, curve, local_cbs_at_tokens=at,
                              local_cbs_multiplier=k, local_cbs_window_tokens=WINDOW,
                              local_cbs_of="base", base_batch_size=BASE, wall_time_s=2.0),
              seed, metrics)
    write_json_atomic(folder / "val_sequences.json",
                      {"val_loss_per_sequence": losses.tolist(), "seq_len": SEQ_LEN,
                       "tokens": WINDOW})


def synthetic_local_cbs(root: Path, *, optimizer: str = "adamw", ks=KS,
                        checkpoints=CHECKPOINTS, bcrit=planted_bcrit, seed: int = 0,
                        branch_sd: float = BRANCH_SD, lr_scaling: str = "sqrt",
                        ladder_seeds: tuple[int, ...] = (), order_sd: float = 0.0,
                        name: str | None = None) -> Path:
    """A base run under root/<name or optimizer> with branches at every checkpoint and
    multiplier, and a k = 1 replicate (seed 1) at each, or with `ladder_seeds` every k again
    at each of those seeds; the branch's true excess is EXCESS_SLOPE (k B / b_crit - 1)
    above the planted b_crit, 0 below it, and each seed's data order shifts every k trained
    on it by one draw of sd `order_sd`."""
    rng = np.random.default_rng(seed)
    base_dir = root / (name or optimizer)
    evals = [2**i for i in range(15, 26)]
    curve = [eval_point(t, BASE, planted_loss(t), 2e5 / planted_loss(t) ** 2 / SEQ_LEN)
             for t in evals]
    write_run(base_dir, summary(BASE, BASE_TOKENS, optimizer, curve, wall_time_s=100.0,
                                lr_scaling=lr_scaling), 0,
              [{"step": 1, "tokens": BASE * SEQ_LEN, "train_loss": 9.0}])
    for at in checkpoints:
        mu = rng.normal(planted_loss(at), 0.5, SEQUENCES)
        folder = base_dir / "local_cbs" / f"tokens={at}"
        for s in (0, *ladder_seeds):
            order = rng.normal(0, order_sd) if order_sd else 0.0
            for k in ks:
                excess = EXCESS_SLOPE * max(0.0, k * BASE / bcrit(at) - 1)
                write_branch(folder / (f"k={k}" + (f",seed={s}" if s else "")), rng=rng,
                             mu=mu, at=at, k=k, excess=excess + order, optimizer=optimizer,
                             seed=s, branch_sd=branch_sd)
        if not ladder_seeds:
            write_branch(folder / "k=1,seed=1", rng=rng, mu=mu, at=at, k=1, excess=0.0,
                         optimizer=optimizer, seed=1, branch_sd=branch_sd)
    return base_dir


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("local_cbs")
    synthetic_local_cbs(root)
    # Muon: a planted B_crit beyond its largest branch, so every k is accepted.
    synthetic_local_cbs(root, optimizer="muon", ks=(1, 2, 4), checkpoints=CHECKPOINTS[:2],
                        bcrit=lambda t: 50 * BASE, seed=1)
    sweep = root / "batch" / "report"
    sweep.mkdir(parents=True)
    write_json_atomic(sweep / "fits.json", {
        "per_run": [{"optimizer": "adamw", "val_loss": 4.0, "b_crit": 300.0, "in_kaplan": True},
                    {"optimizer": "adamw", "val_loss": 3.9, "b_crit": None, "in_kaplan": False}],
        "pareto": [{"optimizer": "adamw", "target_loss": 4.2, "b_crit": 200.0,
                    "degenerate": None}]})
    return run_analysis([root], tolerance=0.01, confidence=0.95,
                        batch_sweep=root / "batch", wandb_mode="disabled")


def adamw_rows(report) -> list[dict]:
    return [r for r in report["document"]["local_cbs"] if r["optimizer"] == "adamw"]


def test_the_local_bcrit_is_recovered_within_a_doubling_at_every_checkpoint(report):
    rows = adamw_rows(report)
    assert sorted(r["tokens"] for r in rows) == sorted(CHECKPOINTS)
    planted = [planted_bcrit(r["tokens"]) for r in rows]
    assert max(planted) / min(planted) > 8  # it rises, then plateaus
    for r, b in zip(rows, planted, strict=True):
        assert 0.5 <= r["b_crit"] / b <= 2, (r["tokens"], r["b_crit"], b)
        assert not r["lower_bound_only"] and r["margin"] > 0
        assert r["b_crit_tokens"] == r["b_crit"] * SEQ_LEN
        if r["tokens"] != 3 * 2**20:  # at an eval point of the base run
            assert r["val_loss"] == pytest.approx(planted_loss(r["tokens"]))
        assert r["b_crit_ema"] in [k * BASE for k in KS]
    # The paper's rule sees only steps after the fork (each branch's row before it has loss 99):
    assert sum(0.5 <= r["b_crit_ema"] / b <= 2 for r, b in zip(rows, planted, strict=True)) >= 8
    between = next(r for r in rows if r["tokens"] == 3 * 2**20)  # interpolated in log tokens
    assert planted_loss(2**22) < between["val_loss"] < planted_loss(2**21)


def test_fits_rows_have_the_contract_fields(report):
    doc = report["document"]
    for r in doc["local_cbs"]:
        assert set(ROW_KEYS) <= set(r)
        assert set(r["tokens_equivalent"]) == {str(k) for k in r["multipliers"][1:]}
        for te in r["tokens_equivalent"].values():  # k = 1 replicates: an interval all the same
            assert te["excess_low"] < te["excess"] < te["excess_high"]
            assert te["b_crit"] is None or te["b_crit_tokens"] == te["b_crit"] * SEQ_LEN
            assert te["b_crit"] is not None or te["note"]
        assert r["multipliers"][0] == 1 and r["base_batch_size"] == BASE
        assert set(r["excess"]) == set(r["upper"]) == {str(k) for k in r["multipliers"][1:]}
        assert r["tolerance"] == 0.01 and r["confidence"] == 0.95
        assert r["branch_sd_dof"] >= 0 and r["b_noise"] > 0
    muon = [r for r in doc["local_cbs"] if r["optimizer"] == "muon"]
    assert all(r["lower_bound_only"] and r["b_crit"] == 4 * BASE for r in muon)
    cost = {c["optimizer"]: c for c in doc["local_cbs_cost"]}
    n_branches = len(CHECKPOINTS) * (len(KS) + 1)
    assert cost["adamw"]["branches"] == n_branches
    assert cost["adamw"]["token_fraction"] == pytest.approx(n_branches * WINDOW / BASE_TOKENS)
    assert cost["adamw"]["wall_fraction"] == pytest.approx(n_branches * 2.0 / 100.0)
    assert set(doc) == set(FITS_KEYS) >= {"local_cbs", "local_cbs_kaplan", "local_cbs_cost"}


def test_the_kaplan_fit_of_the_local_points_recovers_the_planted_exponent(report):
    fits = {k["optimizer"]: k for k in report["document"]["local_cbs_kaplan"]}
    adamw = fits["adamw"]
    assert adamw["n_points"] == len(CHECKPOINTS)
    assert adamw["exponent_low"] <= EXPONENT <= adamw["exponent_high"]
    assert adamw["kaplan_exponent"] == 4.8
    assert fits["muon"]["exponent"] is None and "lower bound only" in fits["muon"]["left_out"][0]
    assert "none" in fits["muon"]["interval"]


def test_report_and_plots_are_written(report):
    out = report["out"]
    text = (out / "report.md").read_text()
    assert "one-sided 95% upper bound from per-sequence pairs plus seed replicates" in text
    assert "### adamw, lr sqrt" in text and "### muon, lr sqrt" in text
    assert ">= 4 x 32 = 128" in text
    assert "1 per-run and 1 Pareto B_crit" in text
    for name in ("local_bcrit_vs_tokens.png", "local_bcrit_vs_loss.png", "fits.json"):
        assert (out / name).stat().st_size > 1000
    assert not list(out.glob(".*tmp*"))
    assert not any("stopped on noise" in w for w in report["document"]["warnings"])


@pytest.fixture
def script_main(analysis_main):
    return analysis_main(SCRIPT.name)


@pytest.fixture
def small(tmp_path) -> Path:
    """A small valid tree: one base run, two checkpoints, k = 1, 2, 4."""
    return synthetic_local_cbs(tmp_path / "runs", ks=(1, 2, 4), checkpoints=CHECKPOINTS[:2])


def one_line_error(script_main, capsys, *args) -> str:
    with pytest.raises(SystemExit) as exit_:
        script_main([*map(str, args), "--wandb", "disabled"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("critbatch: error: ") and "\n" not in err
    return err


def test_the_script_writes_the_report_into_the_last_run_dir(script_main, small, capsys):
    script_main([str(small), "--wandb", "disabled"])
    assert (small / "report" / "fits.json").exists()
    assert "report:" in capsys.readouterr().out


def test_no_local_cbs_folders_is_a_one_line_error(script_main, tmp_path, capsys):
    assert "no local_cbs folders" in one_line_error(script_main, capsys, tmp_path)


def test_a_branch_without_val_sequences_is_a_one_line_error(script_main, small, capsys):
    missing = small / "local_cbs" / f"tokens={CHECKPOINTS[1]}" / "k=2" / "val_sequences.json"
    missing.unlink()
    err = one_line_error(script_main, capsys, small)
    assert str(missing) in err and "rerun that branch" in err


def test_mismatched_sequence_counts_are_a_one_line_error(script_main, small, capsys):
    path = small / "local_cbs" / f"tokens={CHECKPOINTS[0]}" / "k=4" / "val_sequences.json"
    data = json.loads(path.read_text())
    write_json_atomic(path, {**data, "val_loss_per_sequence": data["val_loss_per_sequence"][:100]})
    err = one_line_error(script_main, capsys, small)
    assert "has 100 per-sequence losses" in err and "same validation windows" in err


def test_a_missing_k_at_one_checkpoint_is_a_one_line_error(script_main, small, capsys):
    shutil.rmtree(small / "local_cbs" / f"tokens={CHECKPOINTS[1]}" / "k=4")
    err = one_line_error(script_main, capsys, small)
    assert f"tokens={CHECKPOINTS[1]} lacks the branch(es) k=4" in err


def test_bad_batch_sweep_and_rule_are_one_line_errors(script_main, small, tmp_path, capsys):
    err = one_line_error(script_main, capsys, small, "--batch-sweep", tmp_path / "nowhere")
    assert "fit_bcrit.py" in err
    err = one_line_error(script_main, capsys, small, "--confidence", "0.3")
    assert "--confidence 0.3" in err


def diverge(branch_dir: Path) -> None:
    """Make a branch a diverged run: status diverged, no final loss, no val_sequences.json."""
    s = json.loads((branch_dir / "summary.json").read_text())
    write_json_atomic(branch_dir / "summary.json",
                      {**s, "status": "diverged", "val_loss": math.nan, "curve": []})
    (branch_dir / "val_sequences.json").unlink()


def test_a_diverged_branch_is_a_rejection(tmp_path):
    """Every k is within tolerance (planted B_crit 50 B); a diverged k = 4 caps B_crit at 2 B
    and a diverged k = 2 leaves B only, with no lower end; a diverged k = 1 is an error."""
    root = synthetic_local_cbs(tmp_path / "runs", ks=(1, 2, 4, 8), checkpoints=CHECKPOINTS[:3],
                               bcrit=lambda t: 50 * BASE)
    diverge(root / "local_cbs" / f"tokens={CHECKPOINTS[0]}" / "k=4")
    diverge(root / "local_cbs" / f"tokens={CHECKPOINTS[1]}" / "k=2")
    result = run_analysis([root], out=tmp_path / "out", wandb_mode="disabled")
    rows = {r["tokens"]: r for r in result["document"]["local_cbs"]}
    four, two, none = (rows[t] for t in CHECKPOINTS[:3])
    assert (four["b_crit"], four["lower_bound_only"], four["diverged"]) == (2 * BASE, False, [4])
    assert four["upper"]["4"] is None and four["upper"]["8"] is None and four["margin"] > 0
    assert (two["b_crit"], two["first_step_rejected"], two["margin"]) == (BASE, True, None)
    assert none["lower_bound_only"] and none["b_crit"] == 8 * BASE and none["diverged"] == []
    # The paper's rule is no walk: it never picks the diverged k, but may pick one above it.
    assert four["b_crit_ema"] != 4 * BASE and two["b_crit_ema"] != 2 * BASE
    text = (tmp_path / "out" / "report.md").read_text()
    assert "4: diverged" in text and "< 2 x 32 = 64 (first step up rejected)" in text
    diverge(root / "local_cbs" / f"tokens={CHECKPOINTS[2]}" / "k=1")
    with pytest.raises(ResultsError, match="k=1 branch diverged"):
        run_analysis([root], out=tmp_path / "out", wandb_mode="disabled")


def test_branches_without_seed_replicates_are_a_one_line_error(script_main, small, capsys):
    for folder in small.glob("local_cbs/*/k=1,seed=*"):
        shutil.rmtree(folder)
    err = one_line_error(script_main, capsys, small)
    assert "no seed replicates" in err and "replicate seed" in err


def test_a_walk_stopped_by_branch_noise_is_flagged(tmp_path):
    """Branches that scatter by 0.03 nats/token (3x the tolerance) with every k truly within
    tolerance: the walk stops early, and the report says it was the noise, not the excess."""
    root = synthetic_local_cbs(tmp_path / "runs", ks=(1, 2, 4), checkpoints=CHECKPOINTS[:4],
                               bcrit=lambda t: 50 * BASE, branch_sd=0.03)
    result = run_analysis([root], out=tmp_path / "out", wandb_mode="disabled")
    rows = result["document"]["local_cbs"]
    assert any(r["noise_limited"] for r in rows)
    assert all(r["branch_sd"] > 0.01 for r in rows)
    assert any("stopped on noise" in w for w in result["document"]["warnings"])


def test_replicated_ladders_cancel_the_data_order(tmp_path):
    """Each seed's data order shifts all its branches by sd 0.03 nats/token (3x the
    tolerance; the cpu runs' k = 1 replicates scatter by ~0.02). With every k trained again at
    two replicate seeds, the seed-paired bounds recover the planted B_crit within a doubling
    at every checkpoint; the two Muon lr rules are reported and fitted apart."""
    root = tmp_path / "runs"
    synthetic_local_cbs(root, ks=KS[:5], checkpoints=CHECKPOINTS[:6], ladder_seeds=(1, 2),
                        order_sd=0.03, branch_sd=0.001, seed=5)
    for rule, seed in (("none", 6), ("sqrt", 7)):
        synthetic_local_cbs(root, optimizer="muon", ks=(1, 2, 4), checkpoints=CHECKPOINTS[:3],
                            ladder_seeds=(1,), lr_scaling=rule, seed=seed,
                            name=f"muon_{rule}", bcrit=lambda t: 50 * BASE)
    result = run_analysis([root], out=tmp_path / "out", wandb_mode="disabled")
    doc = result["document"]
    adamw = [r for r in doc["local_cbs"] if r["optimizer"] == "adamw"]
    for r in adamw:
        truth = min(planted_bcrit(r["tokens"]), 16 * BASE)
        assert 0.5 <= r["b_crit"] / truth <= 2, (r["tokens"], r["b_crit"], truth)
    noise = {(n["optimizer"], n["lr_scaling"]): n for n in doc["local_cbs_noise"]}
    assert noise["adamw", "sqrt"]["design"] == "replicated ladders"
    assert [x["seeds"] for x in noise["adamw", "sqrt"]["per_k"]] == [3] * 4
    assert all(x["sd"] < 0.01 for x in noise["adamw", "sqrt"]["per_k"])
    assert "scatter across seeds of the seed-paired excess" in doc["rule"]["interval"]
    labels = sorted(k["label"] for k in doc["local_cbs_kaplan"])
    assert labels == ["adamw, lr sqrt", "muon, lr none", "muon, lr sqrt"]
    text = (result["out"] / "report.md").read_text()
    assert "### muon, lr none" in text and "### muon, lr sqrt" in text


@pytest.mark.slow
def test_the_sweep_draws_the_batch_sweep_of_the_same_scale_when_it_exists(tmp_path):
    """`python -m critbatch.sweep local_cbs` analyses with --batch-sweep runs/batch/<scale>
    when that report exists, and without it otherwise."""
    from critbatch.orchestration.experiments import EXPERIMENTS
    from critbatch.orchestration.reports import analyse_sweep

    runs_root = tmp_path / "runs"
    sweep = runs_root / "local_cbs" / "cpu"
    synthetic_local_cbs(sweep, ks=(1, 2, 4), checkpoints=CHECKPOINTS[:2])
    out = sweep / "report"
    assert analyse_sweep(EXPERIMENTS["local_cbs"], [str(sweep)], out, "alone")
    assert "Batch sweep drawn" not in (out / "report.md").read_text()
    batch = runs_root / "batch" / "cpu" / "report"
    batch.mkdir(parents=True)
    write_json_atomic(batch / "fits.json", {
        "per_run": [{"optimizer": "adamw", "val_loss": 4.0, "b_crit": 300.0}], "pareto": []})
    assert analyse_sweep(EXPERIMENTS["local_cbs"], [str(sweep)], out, "with the batch sweep")
    assert "Batch sweep drawn for comparison" in (out / "report.md").read_text()


def test_a_flat_local_bcrit_fits_an_exponent_of_exactly_zero(tmp_path):
    """Every checkpoint at 4 B: the fit and its bootstrap give 1/alpha_B = 0, not rounding
    noise such as -8e-15."""
    root = synthetic_local_cbs(tmp_path / "runs", ks=(1, 2, 4, 8, 16),
                               checkpoints=CHECKPOINTS[:4], bcrit=lambda t: 4 * BASE)
    result = run_analysis([root], out=tmp_path / "out", wandb_mode="disabled")
    fit = result["document"]["local_cbs_kaplan"][0]
    assert {r["b_crit"] for r in result["document"]["local_cbs"]} == {4 * BASE}
    assert fit["exponent"] == 0.0 and fit["exponent_low"] == 0.0 == fit["exponent_high"]


# ---------------------------------------------------------------------------------------------
# The local B_crit in effective tokens, and pooling only consistent checkpoints


def equivalent_world(root: Path, *, b_crit: float, checkpoints=CHECKPOINTS[:4],
                     ks=(1, 2, 4, 8, 16), seeds=(0, 1, 2), branch_sd=lambda at: BRANCH_SD,
                     seed: int = 0) -> Path:
    """A base run (`synthetic_local_cbs`'s) whose branches keep training: over the window the
    k = 1 branch follows the base run's planted_loss (evaluated at W/8, W/4, W/2 and W after
    the fork), and branch k ends at the k = 1 loss after W / r_k tokens, with
    r_k = (1 + k B / b_crit) / (1 + B / b_crit): a local B_crit of `b_crit` sequences in
    effective tokens. Every k trained at every seed in `seeds` (0: the base's)."""
    rng = np.random.default_rng(seed)
    base_dir = synthetic_local_cbs(root, checkpoints=())
    for at in checkpoints:
        mu = rng.normal(0, 0.5, SEQUENCES)
        mu -= mu.mean()
        inner = tuple((at + WINDOW // d, planted_loss(at + WINDOW / d)) for d in (8, 4, 2))
        for s in seeds:
            for k in ks:
                r = (1 + k * BASE / b_crit) / (1 + BASE / b_crit)
                write_branch(base_dir / "local_cbs" / f"tokens={at}" /
                             (f"k={k}" + (f",seed={s}" if s else "")), rng=rng, mu=mu, at=at,
                             k=k, excess=planted_loss(at + WINDOW / r), optimizer="adamw",
                             seed=s, branch_sd=branch_sd(at), inner=inner if k == 1 else ())
    return base_dir


def test_the_local_bcrit_in_effective_tokens_comes_back(tmp_path):
    """Planted 96 sequences (3 B) in effective tokens at four checkpoints, every k at three
    seeds: each k's tokens-equivalent B_crit is within 5% of it and most intervals hold it;
    the report shows it beside the rule's, and says what the interval is."""
    root = equivalent_world(tmp_path / "runs", b_crit=96.0)
    result = run_analysis([root], out=tmp_path / "out", wandb_mode="disabled")
    doc = result["document"]
    values = [te for r in doc["local_cbs"] for te in r["tokens_equivalent"].values()]
    assert len(values) == 4 * 4
    for te in values:
        assert te["b_crit"] == pytest.approx(96.0, rel=0.05), te
        assert te["b_crit_tokens"] == pytest.approx(te["b_crit"] * SEQ_LEN)
    held = sum(te["b_crit_low"] <= 96.0 <= (te["b_crit_high"] or math.inf) for te in values)
    assert held >= 12
    assert all(r["tokens_equivalent_points"] == 5 for r in doc["local_cbs"])
    rule = doc["rule"]["tokens_equivalent"]
    assert "two-sided 90% interval" in rule["interval"] and "seed-paired" in rule["interval"]
    text = (result["out"] / "report.md").read_text()
    assert "## Local B_crit in effective tokens" in text and "### adamw, lr sqrt" in text
    assert "(r = " in text and rule["interval"] in text
    assert not any("Bartlett" in w or "straight line" in w for w in doc["warnings"])


def test_a_checkpoint_of_unequal_scatter_is_not_pooled_and_is_flagged(tmp_path):
    """Branch offsets of sd 0.03 nats/token at the first checkpoint against 0.0005 at the
    other five: Bartlett's test rejects one variance for all, that checkpoint is bound on its
    own seeds, the others are pooled, and the report and a warning say so."""
    first = CHECKPOINTS[0]
    root = equivalent_world(tmp_path / "runs", b_crit=96.0, checkpoints=CHECKPOINTS[:6],
                            ks=(1, 2, 4), branch_sd=lambda at: 0.03 if at == first else 0.0005)
    result = run_analysis([root], out=tmp_path / "out", wandb_mode="disabled")
    per_k = result["document"]["local_cbs_noise"][0]["per_k"]
    for row in per_k:
        for key in ("equal_variance", "equal_variance_vs_k1"):
            v = row[key]
            assert v["test"] == "Bartlett" and v["p_value"] < 0.05 <= v["p_value_pooled"]
            assert v["alone_tokens"] == [first]
            assert v["pooled_tokens"] == list(CHECKPOINTS[1:6])
        assert row["sd"] < 0.005 and row["dof"] == 10
    warnings = result["document"]["warnings"]
    assert sum("Bartlett p" in w and f"{first:,} tokens" in w for w in warnings) == 4
    assert f"(alone: {first:,})" in (result["out"] / "report.md").read_text()


def test_a_two_point_k1_curve_and_a_cooldown_are_flagged(tmp_path):
    """The older folders: k = 1 replicates only, k = 1 evaluated at its window's end alone
    (the curve is the fork and the end) and a cooldown at the window's end. They still
    analyse; the tokens-equivalent B_crit is given and both biases are named."""
    root = synthetic_local_cbs(tmp_path / "runs", ks=(1, 2, 4), checkpoints=CHECKPOINTS[:2])
    for summary_path in root.glob("local_cbs/*/k=*/summary.json"):
        s = json.loads(summary_path.read_text())
        write_json_atomic(summary_path, {**s, "schedule": "wsd", "cooldown_fraction": 0.1})
    result = run_analysis([root], out=tmp_path / "out", wandb_mode="disabled")
    doc = result["document"]
    assert doc["local_cbs_noise"][0]["design"] == "k = 1 replicates"
    assert all(r["tokens_equivalent_points"] == 2 for r in doc["local_cbs"])
    assert "per-sequence pairs plus twice" in doc["rule"]["tokens_equivalent"]["interval"]
    assert any("straight line in log tokens" in w for w in doc["warnings"])
    assert any("cooldown" in w and "not annealed" in w for w in doc["warnings"])
