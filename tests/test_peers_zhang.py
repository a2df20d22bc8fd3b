"""Zhang et al. 2025's sweep (vendored) through critbatch's fits: their numbers reproduced."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import PEERS_DIR

from critbatch.peers import zhang

SHARED = PEERS_DIR
# plots/chinchilla.ipynb (hlzhang109/critical-batch-size @ c5b509d8) cell 5 stdout, as
# copied into published_fits.csv: CBS per size (their 20%-overhead rule), sequences
PUBLISHED_CBS_BY_SIZE = {
    "85M": 745.3201466381583,
    "151M-ablation": 955.1582414387951,
    "302M": 1393.726947253441,
    "604M": 1888.5221009346358,
    "1.2B": 2533.4108017868743,
}
RESAMPLES = 200


@pytest.fixture(scope="module")
def result() -> dict:
    return zhang.analyse_zhang(resamples=RESAMPLES, seed=0)


def test_s_min_e_min_and_cbs_within_2_percent(result):
    sizes = {r["label"]: r for r in result["sizes"]}
    assert list(sizes) == list(zhang.PUBLISHED)  # ascending model size
    for label, (s_min, e_min) in zhang.PUBLISHED.items():
        row = sizes[label]
        assert row["s_min"] == pytest.approx(s_min, rel=0.02), label
        assert row["e_min"] == pytest.approx(e_min, rel=0.02), label
        assert abs(row["s_min_rel_diff"]) < 0.02 and abs(row["e_min_rel_diff"]) < 0.02
        assert row["cbs"] == pytest.approx(PUBLISHED_CBS_BY_SIZE[label], rel=0.02), label
        assert row["published_cbs"] == pytest.approx(PUBLISHED_CBS_BY_SIZE[label], rel=1e-9)
        assert row["b_crit"] == pytest.approx(row["e_min"] / row["s_min"])
        assert row["b_crit_tokens"] == pytest.approx(row["b_crit"] * 512)
        assert row["cbs_20pct"] == pytest.approx(row["e_min"] / (5 * row["s_min"]))
        assert row["n_batch_sizes"] == 9 and row["degenerate"] is None
        assert row["s_min_low"] < row["s_min"] < row["s_min_high"]
        assert row["cbs_boot_low"] < row["cbs"] < row["cbs_boot_high"]


def test_cbs_law_beta_and_its_intervals(result):
    law = result["cbs_law"]
    d_pub, beta_pub = zhang.PUBLISHED_CBS
    assert law["beta"] == pytest.approx(beta_pub, abs=0.03)
    assert law["d"] == pytest.approx(d_pub, rel=0.1)
    for kind in ("t", "boot"):
        low, high = law[f"beta_{kind}_low"], law[f"beta_{kind}_high"]
        assert low < law["beta"] < high and high - low > 0, kind
        assert law[f"published_beta_in_{kind}"] == (low <= beta_pub <= high)
    assert law["resamples_used"] == RESAMPLES and law["t_dof"] == 3
    b_law = result["b_crit_law"]
    assert b_law["beta_t_low"] < b_law["beta"] < b_law["beta_t_high"]


def test_published_law_is_their_cbs_against_nominal_sizes():
    """The constants reproduce cell 7: their CBS regressed on the labels' nominal N_M."""
    import numpy as np

    x = np.log([zhang.NOMINAL_MILLIONS[k] for k in zhang.PUBLISHED])
    y = np.log(list(PUBLISHED_CBS_BY_SIZE.values()))
    beta, c = np.polyfit(x, y, 1)
    assert beta == pytest.approx(zhang.PUBLISHED_CBS[1], rel=1e-6)
    assert np.exp(c) == pytest.approx(zhang.PUBLISHED_CBS[0], rel=1e-6)
    for label, (a, b) in zhang.PUBLISHED.items():
        assert zhang.cbs_rule(a, b, zhang.CBS_OFFSET) == pytest.approx(
            PUBLISHED_CBS_BY_SIZE[label], rel=1e-9)


def test_bootstrap_reproducible_by_seed_and_json_ready(result):
    again = zhang.analyse_zhang(resamples=RESAMPLES, seed=0)
    assert again == result
    other = zhang.analyse_zhang(resamples=RESAMPLES, seed=1)
    assert other["cbs_law"]["beta"] == result["cbs_law"]["beta"]
    assert other["cbs_law"]["beta_boot_low"] != result["cbs_law"]["beta_boot_low"]
    json.dumps(result, allow_nan=False)
    assert set(result["units"]) >= {"steps", "batch_size", "loss"}
    none = zhang.analyse_zhang(resamples=0)
    assert none["cbs_law"]["beta_boot_low"] is None and none["cbs_law"]["beta_t_low"]


def test_vendored_table_is_the_notebook_fit_input():
    path = zhang.table_path()
    assert path.is_file() and (path.parent / "NOTICE.md").is_file()
    source = SHARED / "zhang2025_steps_to_target.csv"
    if not source.is_file():
        pytest.skip(f"no local copy of the source at {source}")
    with open(path, newline="") as handle:
        ours = [(r["group"], int(r["params"]), int(r["batch_size"]), int(r["seq_len"]),
                 float(r["target_loss"]), float(r["steps"])) for r in csv.DictReader(handle)]
    with open(source, newline="") as handle:
        theirs = [(r["model_label"], int(r["model_params"]), int(r["batch_size_seqs"]),
                   int(r["seq_len"]), float(r["loss"]), float(r["steps"]))
                  for r in csv.DictReader(handle) if r["variant"] == "fit_input_cell5"]
    assert len(theirs) == 45 and ours == theirs
