"""The `python -m critbatch.train` command: compose and check the config, then run Hydra."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from contextlib import contextmanager, suppress
from dataclasses import asdict
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from critbatch.analysis import results as runs
from critbatch.errors import ConfigError, CritbatchError, ResultsError, fail, user_errors
from critbatch.training.config import (
    CONF_DIR,
    Config,
    explain_compose_error,
    register_configs,
    run_differences,
    to_config,
)
from critbatch.training.distributed import launched_ranks
from critbatch.training.loop import train_with_branches

log = logging.getLogger("critbatch")

HYDRA_CREATED = (".hydra", "train.log")


def check_overrides(overrides: list[str]) -> Config:
    """Compose the config with the command-line overrides and validate it, before any work."""
    from hydra import compose, initialize_config_dir

    register_configs()
    try:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            composed = compose("config", overrides=overrides)
            return to_config(composed)
    except CritbatchError:
        raise
    except Exception as err:
        raise ConfigError(explain_compose_error(err)) from None


def _cleanup_failed_run(run_dir: Path) -> None:
    """Remove what Hydra created for a run that failed before training started."""
    if (run_dir / "summary.json").exists() or (run_dir / "metrics.jsonl").exists():
        return
    for name in HYDRA_CREATED:
        target = run_dir / name
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink()
    with suppress(OSError):
        run_dir.rmdir()


def finished_run(run_dir: Path, cfg: Config) -> bool:
    """True when `run_dir` already holds this config's results (completed or diverged).

    A directory holding a finished run of a *different* config is refused with the
    differing keys named, rather than silently reused or overwritten.
    """
    try:
        runs.read_summary(run_dir)
    except CritbatchError:
        return False
    saved = runs.read_config(run_dir)
    if saved is None:
        return False  # results without their config: train again
    differing = run_differences(saved, asdict(cfg))
    if differing:
        raise ConfigError(
            f"{run_dir} holds a finished run of a different config ({', '.join(differing)}); "
            "move it away or choose another hydra.run.dir / hydra.sweep.dir"
        )
    return True


@contextmanager
def disk_errors():
    """A file that cannot be written (disk full, permissions) becomes a one-line ResultsError."""
    try:
        yield
    except OSError as err:
        where = err.filename or "a file"
        raise ResultsError(f"cannot write {where} ({err.strerror or err}); free disk space or "
                           "fix the folder's permissions, then start the run again (it resumes "
                           "from its last checkpoint)") from None


def check_output_dir(args: list[str]) -> None:
    """ConfigError unless the run (or sweep) folder can be created and written.

    Hydra creates the folder before the job starts and would fail with a traceback; the
    folder is `hydra.run.dir` / `hydra.sweep.dir` when given, else under `runs/`.
    """
    keys = ("hydra.sweep.dir=", "hydra.run.dir=") if any(
        a in ("-m", "--multirun") for a in args) else ("hydra.run.dir=",)
    given = [a.split("=", 1)[1] for a in args if a.startswith(keys)]
    target = Path(given[-1] if given else "runs").expanduser().absolute()
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"cannot create the output folder {target}: {probe} is a file; "
                          "choose another hydra.run.dir (or hydra.sweep.dir)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write the output folder {target}: {probe} is not writable; "
                          "choose another hydra.run.dir (or hydra.sweep.dir)")


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(composed: DictConfig) -> None:
    """One Hydra job. In a multirun, a finished run is skipped and a failed one is
    recorded in its train.log without stopping the sweep."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    overrides = list(hydra_cfg.overrides.task)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        with user_errors(), disk_errors():
            cfg = to_config(composed)
            finished = finished_run(run_dir, cfg)
            if finished:
                log.info(f"{run_dir}: already finished, skipped")
            train_with_branches(cfg, run_dir, overrides, skip_finished=finished)
    except SystemExit:
        if not multirun:
            _cleanup_failed_run(run_dir)
            raise
        log.error(f"{run_dir}: failed; the sweep goes on")
    except Exception:
        if not multirun:
            raise
        log.exception(f"{run_dir}: failed with an exception; the sweep goes on")


def main() -> None:
    """Validate the overrides (one-line errors, nothing created), then hand over to Hydra."""
    register_configs()
    args = sys.argv[1:]
    ranks = launched_ranks()
    if ranks.parallel:  # torchrun: every rank must agree on the run dir; rank 0 alone writes
        if not any(a.startswith("hydra.run.dir=") for a in args):
            fail("under torchrun, give the run directory explicitly: hydra.run.dir=runs/...")
        if not ranks.main:
            extra = ["hydra.output_subdir=null", "hydra/job_logging=disabled",
                     "hydra/hydra_logging=disabled"]
            sys.argv += extra
    plain = [a for a in args if not a.startswith("hydra.") and not a.startswith("hydra/")]
    with user_errors():
        if not any(a.startswith("-") for a in args):  # flags (--multirun, --cfg, ...): Hydra's
            check_overrides(plain)
        check_output_dir(args)
    try:
        _hydra_main()
    except KeyboardInterrupt:
        fail("interrupted")
