"""Planning a study's stages: each multirun of sweeps/<stage>.yaml expanded into its jobs
exactly as Hydra's basic sweeper will (`plan_stage`), the lr each stage trains at (the tuning
stage's best, or the grid's middle lr), and the checks on a plan before anything trains (a
swept key fixed by an override, a run folder holding another config, runs outside the plan)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Callable, Iterator
from pathlib import Path

from omegaconf import DictConfig

from critbatch.orchestration.experiments import SWEEPS_DIR, Experiment
from critbatch.orchestration.planned import Job
from critbatch.results import runs
from critbatch.results.errors import ConfigError
from critbatch.training import config as schema
from critbatch.training.cli import sweep_jobs
from critbatch.training.config_checks import explain_compose_error, to_config


@contextlib.contextmanager
def sweep_composer(cached: bool = True) -> Iterator[Callable[[str, list[str]], DictConfig]]:
    """`compose(stage, overrides)` of sweeps/<stage>.yaml with conf/ on the search path (as
    the `--config-dir sweeps` launch has it) and Hydra's config; a Hydra error in the block
    becomes a one-line ConfigError. `cached`: the jobs of a stage differ in values alone, so
    the config their groups choose is composed once and each job's values applied to a copy,
    as Hydra applies them (`ValueComposer`); False composes every call from scratch."""
    from hydra import compose, initialize_config_dir

    schema.register_configs()
    search = [f"hydra.searchpath=[file://{schema.CONF_DIR}]"]  # as `--config-dir sweeps` does
    try:
        with initialize_config_dir(str(SWEEPS_DIR), version_base="1.3"):
            def full(stage: str, overrides: list[str]) -> DictConfig:
                return compose(stage, overrides=search + overrides, return_hydra_config=True)
            yield ValueComposer(full, search) if cached else full
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(explain_compose_error(err)) from None


class ValueComposer:
    """Hydra's composition in two parts: the defaults list (the config groups an override
    chooses: `scale=`, `optim=`, `hydra/launcher=`, `arm=`) composed once per stage and choice
    of groups, then each plain value override (`train.batch_size=8`, `hydra.sweep.dir=...`)
    set in order on a copy, and the job's override lists and `override_dirname` written as
    Hydra writes them. Equal to a full compose for every stage at every scale
    (tests/test_sweep.py), and several times faster for a stage of many jobs; an override it
    cannot set (a key the schema lacks) is left to a full compose, which says why."""

    def __init__(self, full: Callable[[str, list[str]], DictConfig], search: list[str]) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self.full, self.search = full, search  # `full` composes with `search` before the rest
        self.parser = OverridesParser.create()
        self.bases: dict[tuple, bytes] = {}  # each composed base, pickled: copied per job
        self.parsed: dict[str, object] = {}  # each override line, parsed once

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def chooses_groups(override: str) -> bool:
        """The override picks a config group, sets the search path or adds or deletes a key
        (`+`, `~`): it goes to the defaults-list composition; any other only sets a value."""
        key = override.split("=", 1)[0]
        if key.startswith(("+", "~", "@")) or "/" in key or "=" not in override \
                or key.startswith("hydra.searchpath"):
            return True
        folder = key.replace(".", "/")
        return any((root / folder).is_dir() for root in (SWEEPS_DIR, schema.CONF_DIR))

    def __call__(self, stage: str, overrides: list[str]) -> DictConfig:
        import pickle

        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        groups = [o for o in overrides if self.chooses_groups(o)]
        key = (stage, tuple(groups))
        if key not in self.bases:
            self.bases[key] = pickle.dumps(lean(self.full(stage, groups)))
        cfg = pickle.loads(self.bases[key])  # a copy: 2.5x faster than copy.deepcopy
        given = self.search + overrides
        new = [line for line in dict.fromkeys(given) if line not in self.parsed]
        if new:  # the jobs of a stage share most of their lines
            self.parsed.update(zip(new, self.parser.parse_overrides(new), strict=True))
        parsed = [self.parsed[line] for line in given]
        try:
            for override, line in zip(parsed, given, strict=True):
                if not self.chooses_groups(line):
                    OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
        except OmegaConfBaseException:
            return self.full(stage, overrides)  # Hydra's own message for what is wrong
        task = [p for p in parsed if not p.is_hydra_override()]
        cfg.hydra.overrides.task = [p.input_line for p in task]
        cfg.hydra.overrides.hydra = [p.input_line for p in parsed if p.is_hydra_override()]
        names = cfg.hydra.job.config.override_dirname
        lines = sorted(p.input_line for p in task if p.key_or_group not in names.exclude_keys)
        cfg.hydra.job.override_dirname = names.item_sep.join(lines).replace("=", names.kv_sep)
        return cfg


# Hydra's own settings a planned job never reads (its logging, help texts and the runtime it
# records): copying them took half of each job's copy of its stage's config
UNREAD_HYDRA_KEYS = ("help", "hydra_help", "hydra_logging", "job_logging", "runtime")


def lean(cfg: DictConfig) -> DictConfig:
    """`cfg` without UNREAD_HYDRA_KEYS (a job's value override of one of them finds no key,
    and the job is composed in full, which sets it)."""
    from omegaconf import open_dict

    with open_dict(cfg.hydra):
        for key in UNREAD_HYDRA_KEYS:
            cfg.hydra.pop(key, None)
    return cfg


def plan_stage(stage: str, scale: str, optimizer: str, extra: list[str]) -> list[Job]:
    """Expand one multirun exactly as Hydra's basic sweeper will, with each job's run dir."""
    cli = [f"scale={scale}", f"optim={optimizer}", *extra]
    with sweep_composer() as compose:
        root = compose(stage, cli)
        swept = root.hydra.sweeper.params or {}
        check_swept(stage, swept, extra)
        params = [f"{k}={v}" for k, v in swept.items()]
        return [compose_job(compose, stage, optimizer, overrides, extra)
                for overrides in sweep_jobs(params + cli)]


def compose_job(compose: Callable[[str, list[str]], DictConfig], stage: str, optimizer: str,
                overrides: list[str], extra: list[str]) -> Job:
    """One job of a stage from its full overrides (the sweep's values of its swept keys, the
    scale, the optimizer and `extra`), named as Hydra names the job."""
    cfg = compose(stage, overrides)
    run_dir = Path(cfg.hydra.sweep.dir) / cfg.hydra.job.override_dirname
    del cfg.hydra
    task = [o for o in overrides if not o.startswith(("hydra.", "hydra/"))]  # as Hydra
    return Job(stage, optimizer, task, run_dir, to_config(cfg), list(extra))


# where a stage sweeps a key, the grid key a user sets instead (the sweep's own values)
SWEPT_BY = {"train.seed": "grid.seed (the grid's runs) and grid.baseline_seeds (the extra seeds)",
            "train.batch_size": "grid.batch_sizes (and grid.seeded_batch_sizes)",
            "optim.lr": "grid.lrs.<optimizer> (and grid.seeded_lrs.<optimizer>)",
            "model.width": "grid.widths"}


def check_swept(stage: str, swept, extra: list[str]) -> None:
    """ConfigError where an override fixes a key the stage sweeps over: Hydra would let it
    win, and the stage would train one value where it meant several (`train.seed=10` made
    the seeds stage train the grid's seed again)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(swept, resolve=False) if OmegaConf.is_config(swept) else swept
    for override in extra:
        key = override.split("=", 1)[0].lstrip("+~")
        # a stage that sweeps `optim.lr: ${optim.lr}` takes its one value from the override
        if key in swept and raw[key] != f"${{{key}}}":
            instead = SWEPT_BY.get(key, f"the grid key behind {key}")
            raise ConfigError(f"{override}: the {stage} stage sweeps {key} over {swept[key]}; "
                              f"set {instead} instead")


def unplanned_runs(jobs: list[Job]) -> dict[Path, list[Path]]:
    """Finished run directories in the plan's stage folders that the plan does not name (an
    older grid, a different lr_scaling): {folder: [run dirs]}, for the folders that have any."""
    planned = {d.resolve() for j in jobs for d in [j.run_dir, *(b.run_dir for b in j.branches)]}
    found = {}
    for folder in sorted({j.run_dir.parent for j in jobs}):
        finished = runs.find_run_dirs([folder])[0] if folder.exists() else []
        extra = [d for d in finished if d.resolve() not in planned]
        if extra:
            found[folder] = extra
    return found


def check_finished(jobs: list[Job]) -> None:
    """ConfigError when a planned run directory holds a finished run of another config (its
    grid changed since): the sweep would skip it and the report would mix the two."""
    stale = [(j, keys) for j in jobs if (keys := j.differences)]
    if stale:
        job, keys = stale[0]
        raise ConfigError(
            f"{job.run_dir} holds a finished run of a different config ({', '.join(keys)})"
            + (f", and {len(stale) - 1} more run(s) like it" if len(stale) > 1 else "")
            + f"; move {job.run_dir.parent} away (or pass hydra.sweep.dir=...) to train this plan"
        )


def final_loss(job: Job) -> float:
    """A finished job's final val loss (nats/token); inf when it diverged."""
    loss = runs.read_summary(job.run_dir)["val_loss"]
    return loss if math.isfinite(loss) else math.inf


def tuned_lr(jobs: list[Job], stage: str, optimizer: str) -> float | None:
    """`optim.lr` of the tuning stage's best finished run at its smallest batch (lowest final
    val loss), or None while none of those has finished without diverging."""
    done = [j for j in jobs if j.stage == stage and j.optimizer == optimizer and j.done]
    done = [j for j in done if j.cfg.train.batch_size == min(k.cfg.train.batch_size
                                                             for k in done)]
    best = min(done, key=final_loss, default=None)
    if best is None or final_loss(best) == math.inf:
        return None
    return best.cfg.optim.lr


def middle_lr(scale: str, optimizer: str) -> float:
    """The middle lr of the scale's batch grid (`grid.lrs`) for `optimizer`."""
    from critbatch.training.cli import check_overrides

    lrs = check_overrides([f"scale={scale}", f"optim={optimizer}"]).grid.lrs[optimizer]
    values = [float(x) for x in str(lrs).split(",")]
    return values[len(values) // 2]


def stage_extra(exp: Experiment, stage: str, optimizer: str, plan: list[Job],
                extra: list[str], scale: str = "cpu") -> list[str] | None:
    """The overrides of one stage: `extra`, plus the tuned lr for the stages after a tuning
    stage (None when the tuning stage has no usable run yet), or the grid's middle lr."""
    if exp.middle_lr and not any(o.startswith("optim.lr=") for o in extra):
        return [*extra, f"optim.lr={middle_lr(scale, optimizer)!r}"]
    if exp.tuning_stage is None or stage == exp.tuning_stage:
        return extra
    lr = tuned_lr(plan, exp.tuning_stage, optimizer)
    return None if lr is None else [*extra, f"optim.lr={lr!r}"]


def plan_experiment(exp: Experiment, scale: str, optimizers: list[str], extra: list[str],
                    plan: list[Job] | None = None) -> list[Job]:
    """Every job of the experiment that can be planned now (a stage waiting for its tuned lr
    is planned at its tuning grid's middle lr, as an estimate, until the lr is known)."""
    jobs: list[Job] = []
    for stage, opt in itertools.product(exp.stages, optimizers):
        overrides = stage_extra(exp, stage, opt, (plan or []) + jobs, extra, scale)
        if overrides is None:
            grid = [j.cfg.optim.lr for j in jobs if (j.stage, j.optimizer) ==
                    (exp.tuning_stage, opt)]
            overrides = [*extra, f"optim.lr={grid[len(grid) // 2]!r}"] if grid else extra
        jobs += plan_stage(stage, scale, opt, overrides)
    return jobs


def missing_measurement(scale: str, extra: list[str]) -> Path | None:
    """The local-CBS report (fits.json) the schedules sweep's `measured` arm follows, when that
    arm is in the sweep and the file does not exist yet; else None."""
    with sweep_composer() as compose:
        root = compose("schedules", [f"scale={scale}", *extra])
        arms = str((root.hydra.sweeper.params or {}).get("arm", "")).split(",")
        fits = Path(root.grid.schedules.measured_fits)
    return fits if "measured" in arms and not fits.exists() else None


def replan_after_tuning(exp: Experiment, scale: str, optimizers: list[str], extra: list[str],
                        plan: list[Job]) -> tuple[list[Job], list[str]]:
    """The plan with the stages after the tuning stage at its best lr (per optimizer), and
    the stages that cannot run: a tuning run failed (its grid is not complete), or every one
    diverged."""
    problems = []
    for stage, optimizer in itertools.product(exp.stages, optimizers):
        if stage == exp.tuning_stage:
            continue
        plan = [j for j in plan if (j.stage, j.optimizer) != (stage, optimizer)]
        failed = [j for j in plan if (j.stage, j.optimizer) == (exp.tuning_stage, optimizer)
                  and not j.done]
        if failed:  # its best lr may be among them: nothing is carried from a partial grid
            problems.append(f"{stage} (optim={optimizer}) not run: {len(failed)} run(s) of "
                            f"{exp.tuning_stage} failed; rerun the sweep to train them, then "
                            f"{stage}")
            continue
        overrides = stage_extra(exp, stage, optimizer, plan, extra, scale)
        if overrides is None:
            problems.append(f"{stage} (optim={optimizer}) not run: every run of "
                            f"{exp.tuning_stage} diverged or failed, so no lr to carry")
            continue
        plan += plan_stage(stage, scale, optimizer, overrides)
        print(f"== {stage} (optim={optimizer}): {overrides[-1]}, the best of "
              f"{exp.tuning_stage}")
    check_finished(plan)
    return plan, problems
