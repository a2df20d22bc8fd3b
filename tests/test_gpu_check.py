"""`make gpu-check`: one line and exit 0 without CUDA; on the CPU (`--device cpu --quick`) the
same mechanism runs end to end with bf16 autocast and torch.compile (eager backend): widths
trained compiled in one process, MFU against the bf16 peak, a branched smoke sweep, PASS."""

from __future__ import annotations

import json

import pytest
import torch

from critbatch.bench import gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_0(capsys):
    assert gpu_check.main([]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("gpu-check: no CUDA device here")


@pytest.mark.slow
def test_the_check_runs_end_to_end_on_the_cpu(tiny_overrides, tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    # the embedded corpus at the smoke vocabulary, as gpu-check trains it: its token cache in
    # the session's cache_dir is the one test_sweep's and test_train's smoke runs read, so the
    # suite builds it once (the tiny corpus's data.paths and vocab 512 made a stdlib cache of
    # its own, built for this test alone)
    data = [o for o in tiny_overrides if o.startswith("data.cache_dir=")]
    assert gpu_check.main(["--device", "cpu", "--quick", "--json", str(out), *data]) == 0
    results = json.loads(out.read_text())
    assert [w["width"] for w in results["widths"]] == list(gpu_check.QUICK_WIDTHS)
    assert all(w["compiled"] and w["tokens_per_s"] > 0 and w["mfu"] > 0
               for w in results["widths"])
    sweep = results["smoke_sweep"]
    assert sweep["returncode"] == 0 and sweep["runs"] == 3 and sweep["branches"] == 9
    assert capsys.readouterr().out.strip().splitlines()[-1] == "gpu-check: PASS"
