"""The `python -m critbatch.train` command: compose and check the config, then run Hydra."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from critbatch.results import runs
from critbatch.results.errors import ConfigError, CritbatchError, ResultsError, fail, user_errors
from critbatch.training import failures
from critbatch.training.config import CONF_DIR, Config, register_configs
from critbatch.training.config_checks import explain_compose_error, to_config
from critbatch.training.saved_config import run_differences

log = logging.getLogger("critbatch")

CREATED_BEFORE_TRAINING = (".hydra", "train.log", ".lock")  # removed when a run fails early


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
    for name in CREATED_BEFORE_TRAINING:
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


def check_output_dir(args: list[str]) -> Path:
    """The run (or sweep) folder, made; ConfigError unless it can be created and written.

    Hydra creates the folder before the job starts and would fail with a traceback; the
    folder is `hydra.run.dir` / `hydra.sweep.dir` when given, else under `runs/`. It is made
    here (what Hydra would do next), so a path the OS refuses -- a file in the way, no
    permission, a read-only or virtual file system such as /proc -- is one line.
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
    try:
        target.mkdir(parents=True, exist_ok=True)
        probe_file = target / f".critbatch-write-test.{os.getpid()}"
        probe_file.write_bytes(b"")
        probe_file.unlink()
    except OSError as err:
        raise ConfigError(f"cannot write the output folder {target}: {err.strerror or err}; "
                          "choose another hydra.run.dir (or hydra.sweep.dir)") from None
    return target


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(composed: DictConfig) -> None:
    """One Hydra job. In a multirun, a finished run is skipped and a failed one is
    recorded in its train.log without stopping the sweep."""
    from critbatch.training.loop import train_with_branches  # torch: not for --help, -sc

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
        _record_failure(run_dir)
    except Exception:
        if not multirun:
            raise
        log.exception(f"{run_dir}: failed with an exception; the sweep goes on")
        _record_failure(run_dir)


FAILURES_ENV = "CRITBATCH_FAILED_RUNS"  # a file where multirun jobs list the runs that failed


def _record_failure(run_dir: Path) -> None:
    """Note a failed multirun job, called while its exception is handled: why, in the run's
    own folder (`failures.record`), and the run in the list `main` reads after the sweep, a
    file in the output folder, which jobs on other nodes (SLURM) see too."""
    err = sys.exc_info()[1]
    cause = err.__context__ if isinstance(err, SystemExit) and err.__context__ else err
    first = (str(cause).splitlines() or [""])[0]
    failures.record(run_dir, first if isinstance(cause, CritbatchError) else
                    f"{type(cause).__name__}: {first} (traceback in {run_dir}/train.log)")
    path = os.environ.get(FAILURES_ENV)
    if path:
        with open(path, "a") as handle:
            handle.write(f"{run_dir}\n")


@contextmanager
def _failure_list(folder: Path | None) -> Iterator[Path | None]:
    """The file, in the output `folder`, where this command's multirun jobs list the runs
    that failed (named by host and process, so two commands never share one); removed after."""
    if folder is None:  # --help, --cfg: nothing trains
        yield None
        return
    path = folder / f".critbatch-failed-{os.uname().nodename}-{os.getpid()}.txt"
    os.environ[FAILURES_ENV] = str(path)
    try:
        yield path
    finally:
        os.environ.pop(FAILURES_ENV, None)
        path.unlink(missing_ok=True)


INFO_FLAGS = ("--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i",
              "--shell-completion", "-sc", "--version")  # Hydra prints, trains nothing
CONFIG_FLAGS = ("--config-name", "-cn", "--config-dir", "-cd", "--config-path", "-cp")
SKIP_CHECK_FLAGS = INFO_FLAGS + CONFIG_FLAGS


def options_to_check(args: list[str]) -> dict[str, list[str]] | None:
    """{key: its overrides, one per value} of the command line, to check before Hydra launches
    anything; None when a flag (--cfg, --config-name, ...) makes the command something else."""
    if any(a.split("=", 1)[0] in SKIP_CHECK_FLAGS for a in args):
        return None
    plain = [a for a in args if not a.startswith("-") and not a.startswith(("hydra.", "hydra/"))]
    options = sweep_options(plain)
    if not any(a in ("-m", "--multirun") for a in args):
        swept = [values[0].split("=", 1)[0] for values in options.values() if len(values) > 1]
        if swept:
            raise ConfigError(f"{swept[0]} has several values, a sweep: add -m (--multirun) "
                              "to train one run per value, or give it one value")
    return options


def bad_values(options: dict[str, list[str]]) -> list[str]:
    """One reason per bad value of a command line's overrides (`options_to_check`), [] when
    every job composes and validates.

    Each value is tried once against a reference job that passes: the first job, else the
    first of the jobs varying one value of it that passes, else the values added one key at
    a time to the defaults where they pass. A bad value thus cannot hide another (the first
    job of `batch_size=0,-3` fails on 0 whatever -3 is).
    """
    tried: dict[tuple[str, ...], str | None] = {}

    def reason(choice: dict[str, str]) -> str | None:
        job = tuple(choice[key] for key in options if key in choice)
        if job not in tried:
            try:
                check_overrides(list(job))
                tried[job] = None
            except ConfigError as err:
                tried[job] = str(err)
        return tried[job]

    first = {key: values[0] for key, values in options.items()}
    varied = [{**first, key: value} for key, values in options.items() for value in values[1:]]
    reference = next((job for job in [first, *varied] if reason(job) is None), None)
    if reference is None:
        reference = {}
        for key, values in options.items():
            reference.update(next(({key: v} for v in values
                                   if reason({**reference, key: v}) is None), {}))
    reasons = [reason({**reference, key: v}) for key, values in options.items() for v in values]
    return list(dict.fromkeys(r for r in reasons if r))


def check_values(args: list[str]) -> None:
    """ConfigError unless every value on the command line composes and validates; when several
    are bad, each is named on its own line (the last by the ConfigError)."""
    options = options_to_check(args)
    reasons = bad_values(options) if options is not None else []
    for other in reasons[:-1]:
        print(f"critbatch: error: {other}", file=sys.stderr)  # `fail`'s format, one per line
    if reasons:
        raise ConfigError(reasons[-1])


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """Every job's overrides of a multirun over `overrides`, as Hydra's basic sweeper expands
    them: each sweep (`a,b`, `range(...)`, `choice(...)`) a factor of the product, in order of
    first appearance, a later override of a key replacing an earlier one."""
    return [list(job) for job in itertools.product(*sweep_options(overrides).values())]


def sweep_options(overrides: list[str]) -> dict[str, list[str]]:
    """{key: its overrides, one per value} of a multirun's command line (see `sweep_jobs`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as err:
        raise ConfigError(explain_compose_error(err)) from None
    options: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override() and not o.is_discrete_sweep():
            raise ConfigError(f"{o.input_line}: a sweep here is a list (a,b), range() or "
                              "choice(); interval sweeps need a sweeper plugin")
        values = o.sweep_string_iterator() if o.is_sweep_override() else (
            [o.get_value_element_as_str()] if o.value() is not None else [None])
        options[key] = [key if v is None else f"{key}={v}" for v in values]
    return options


def _join_torchrun(args: list[str]) -> None:
    """Under torchrun every rank must agree on the run dir; rank 0 alone writes."""
    from critbatch.training.distributed import launched_ranks

    ranks = launched_ranks()
    if ranks.parallel:
        if not any(a.startswith("hydra.run.dir=") for a in args):
            fail("under torchrun, give the run directory explicitly: hydra.run.dir=runs/...")
        if not ranks.main:
            sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=disabled",
                         "hydra/hydra_logging=disabled"]


def main() -> None:
    """Validate the overrides (one-line errors, nothing created), then hand over to Hydra."""
    register_configs()
    args = sys.argv[1:]
    info = any(a.split("=", 1)[0] in INFO_FLAGS for a in args)
    if not info:  # --help and tab completion (-sc) stay quick: no torch import
        _join_torchrun(args)
    folder = None
    with user_errors():
        check_values(args)
        if not info:
            folder = check_output_dir(args)
    with _failure_list(folder) as failed:
        try:
            _hydra_main()
        except KeyboardInterrupt:
            fail("interrupted")
        except BrokenPipeError:  # `critbatch-train --help | head`: the reader has gone
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None
        listed = failed.read_text() if failed is not None and failed.exists() else ""
        runs_failed = [line for line in listed.splitlines() if line]
    if runs_failed:
        fail(f"{len(runs_failed)} run(s) of the sweep failed (the others completed): "
             f"{', '.join(runs_failed[:3])}{' ...' if len(runs_failed) > 3 else ''}; the reason "
             "is in each run's failed.txt and train.log", code=1)
