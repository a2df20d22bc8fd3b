"""The noise scale's shortcut to B_crit (`results.shortcut`, `make noise`): B_noise times a
sweep's measured ratio, its interval, and the cases it must not be trusted in."""

from __future__ import annotations

import json
import math

import pytest

from critbatch.results import runs, shortcut
from critbatch.training.noise_program import main

RATIO = {"ratio": 2.0, "low": 1.0, "high": 4.0, "losses": [3.8, 4.6], "interval": "95% ..."}


def test_the_estimate_is_the_ratio_times_b_noise_with_both_uncertainties():
    out = shortcut.estimate(100.0, 100.0 * math.e**0.1, 4.0, False, RATIO, "f.json", "")
    assert out["b_crit_estimate"] == pytest.approx(200.0)
    sd = math.hypot(math.log(4.0) / (2 * 1.959964), 0.1)
    assert out["b_crit_estimate_low"] == pytest.approx(200.0 * math.exp(-1.959964 * sd))
    assert out["b_crit_estimate_high"] == pytest.approx(200.0 * math.exp(1.959964 * sd))
    assert out["b_crit_estimate_valid"] is True and out["b_crit_estimate_note"] is None
    assert out["ratio_source"]["fits"] == "f.json" and out["ratio_source"]["losses"] == [3.8, 4.6]
    # the ratio's interval alone, when B_noise were exact: its own 95%
    exact = shortcut.estimate(100.0, 100.0 * (1 + 1e-12), 4.0, False, RATIO, "f.json", "")
    assert exact["b_crit_estimate_low"] == pytest.approx(100.0, rel=1e-6)
    assert exact["b_crit_estimate_high"] == pytest.approx(400.0, rel=1e-6)


def test_outside_the_ratio_s_losses_or_after_a_cooldown_it_is_not_trusted():
    far = shortcut.estimate(100.0, 110.0, 3.5, False, RATIO, "f.json", "")
    assert far["b_crit_estimate"] == pytest.approx(200.0) and not far["b_crit_estimate_valid"]
    assert "outside the losses" in far["b_crit_estimate_note"]
    cooled = shortcut.estimate(100.0, 110.0, 4.0, True, RATIO, "f.json", "")
    assert not cooled["b_crit_estimate_valid"] and "decayed" in cooled["b_crit_estimate_note"]
    assert "NOT to be trusted" in shortcut.line(cooled)
    none = shortcut.estimate(100.0, 110.0, 4.0, False, None, "f.json", "no sweep report")
    assert none["b_crit_estimate"] is None and "no sweep report" in shortcut.line(none)
    unresolved = shortcut.estimate(None, None, 4.0, False, RATIO, "f.json", "")
    assert unresolved["b_crit_estimate"] is None and unresolved["ratio_source"] is not None


@pytest.mark.slow
def test_make_noise_writes_the_estimate_from_the_sweep_s_report(accum_run, tmp_path, capsys):
    run_dir, summary, cfg = accum_run
    fits = tmp_path / "fits.json"
    fits.write_text(json.dumps({"noise_ratio": {cfg.optim.name: RATIO}}))
    main([str(run_dir), "-K", "32", "-b", "4", "--ratio-from", str(fits)])
    record = runs.read_noise(run_dir)
    assert record["b_crit_estimate"] == pytest.approx(2.0 * record["b_noise"])
    assert record["b_crit_estimate_low"] < record["b_crit_estimate"] < record[
        "b_crit_estimate_high"]
    assert record["ratio_source"]["fits"] == str(fits)
    assert "B_crit from B_noise:" in capsys.readouterr().out
    # the run's own sweep has no report here: no estimate, and the note says what to pass
    main([str(run_dir), "-K", "32", "-b", "4"])
    record = runs.read_noise(run_dir)
    assert record["b_crit_estimate"] is None and "--ratio-from" in record["b_crit_estimate_note"]
    # a report without a ratio for this optimizer says so
    fits.write_text(json.dumps({"noise_ratio": {}}))
    main([str(run_dir), "-K", "32", "-b", "4", "--ratio-from", str(fits)])
    assert "has no noise_ratio" in runs.read_noise(run_dir)["b_crit_estimate_note"]
