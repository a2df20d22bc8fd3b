"""`critbatch-train` before any training: tab completion without torch, a `--help` that
starts with what the command does and its units, every bad value of a multirun named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("critbatch-train")


def _imported(args: list[str], cwd: Path, env: dict | None = None) -> tuple[set[str], str]:
    """(top-level modules the console script imported, its stdout), from `-X importtime`."""
    proc = subprocess.run([sys.executable, "-X", "importtime", str(SCRIPT), *args], cwd=cwd,
                          text=True, capture_output=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return {line.rsplit("|", 1)[1].strip() for line in lines}, proc.stdout


def test_tab_completion_does_not_import_torch(tmp_path):
    """A completion query runs on every Tab: torch (about a second to import) stays out."""
    modules, out = _imported(["-sc", "query=bash"], tmp_path,
                             {"COMP_LINE": "critbatch-train optim.l"})
    assert "optim.lr=" in out.split() and "optim.lr_scaling=" in out.split()
    assert "hydra" in modules and "torch" not in modules
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("args", "named"), [
    (["train.batch_size=0,-3,8"], ["train.batch_size=0 ", "train.batch_size=-3 "]),
    (["optim.name=adam,muon,sgd"], ["optim.name=adam ", "optim.name=sgd "]),
    # no job composes: the bad values of two keys, each on its line
    (["optim.name=adam,sgd", "train.batch_size=0,8"],
     ["optim.name=adam ", "optim.name=sgd ", "train.batch_size=0 "]),
    # width 30 with 3 heads is a good pair; only the batch is bad
    (["model.width=30", "model.heads=3", "train.batch_size=8,0"], ["train.batch_size=0 "]),
])
def test_every_bad_value_of_a_multirun_is_named_on_its_own_line(tmp_path, train_cli, args,
                                                                named):
    sweep = tmp_path / "sweep"
    code, err = train_cli(["-m", *args, f"hydra.sweep.dir={sweep}"])
    lines = err.splitlines()
    assert code == 2 and len(lines) == len(named), lines
    for line, value in zip(lines, named, strict=True):
        assert line.startswith(f"critbatch: error: {value}"), lines
    assert not sweep.exists()


def test_help_says_what_the_command_does_with_units_before_the_config(tmp_path):
    modules, out = _imported(["--help"], tmp_path)
    lines = out.splitlines()
    dump = lines.index("== Config: the defaults with the overrides given; any key can be set "
                       "(key=value) ==")
    head = "\n".join(lines[:dump])
    assert lines[0].startswith("critbatch-train (python -m critbatch.train): train one GPT")
    for key, unit in [("train.tokens", "tokens"), ("train.batch_size", "sequences per optimizer"),
                      ("train.warmup_steps", "optimizer steps"), ("model.seq_len", "tokens"),
                      ("optim.lr ", "optim.base_batch_size (sequences)")]:
        (line,) = [line for line in lines[:dump] if line.strip().startswith(key)]
        assert unit in line, line
    assert "Examples:" in head and "critbatch-train -m train.batch_size=" in head
    assert dump < 45 and "  batch_size: 32" in lines[dump:]  # then Hydra's dump, cpu preset
    assert "torch" not in modules


def test_recommend_s_errors_speak_make_variables_through_make():
    """Bare `make recommend` names WIDTH=, PARAMS=, TOKENS= (its recipe sets
    CRITBATCH_VIA_MAKE=recommend); the command line itself keeps its flags, also when run from
    some other make recipe (MAKELEVEL set, as under `make test`)."""
    script = Path(__file__).resolve().parents[1] / "analysis" / "recommend.py"
    env = {k: v for k, v in os.environ.items() if k != "CRITBATCH_VIA_MAKE"} | {"MAKELEVEL": "1"}
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=env, timeout=120)
    via_make = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              env={**env, "CRITBATCH_VIA_MAKE": "recommend"}, timeout=120)
    assert plain.returncode == via_make.returncode == 2
    assert "--width W or --params N, and --tokens D" in plain.stderr
    assert via_make.stderr.strip().splitlines() == [
        "make recommend: say the target: WIDTH=W or PARAMS=N, and TOKENS=D (or VALIDATE=1) "
        "(make help lists the variables)"]
