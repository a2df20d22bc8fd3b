"""The one render/publish pipeline of every study (B_crit, stability, batch schedules).

A study describes itself as a `Study` (its analysis, plots, machine-readable document,
markdown and summary lines); `run_study` chains them the same way for each:

    load -> analyse -> plots -> document -> report.md -> W&B -> printed summary

and writes the report folder:

- `report.md`      the study's markdown;
- the document     e.g. `fits.json`: strict JSON (NaN and inf become null), written atomically;
- `<plot>.png`     the study's plots (`plotting`);
- a W&B run        job_type "analysis", with the plots, the study's tables and summary, and
                   the folder as an artifact (offline unless told otherwise; a W&B failure is
                   a warning, never an error: the folder is complete without it).

Also here: number and table formatting, the sections every report.md shares, the one-line
errors "no runs found" and "all runs left out", and the --wandb/--project arguments.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from critbatch.results.errors import ResultsError, user_errors
from critbatch.results.files import write_json_atomic
from critbatch.results.runs import read_config, wandb_group_name

# ---------------------------------------------------------------------------------------------
# Numbers, tables, JSON


def fmt(x, spec: str = ".4g") -> str:
    """A table cell: '-' for None/NaN/inf, else `format(x, spec)`."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def fmt_nan(x, spec: str = ".4g") -> str:
    """A table cell that spells NaN and inf out ('-' for None): where a diverged number is a
    result, not a gap."""
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, spec)


def fmt_interval(value, low, high, spec: str = ".3g") -> str:
    """'value [low, high]' (an open upper end reads 'inf'); the value alone without bounds."""
    if value is None:
        return "-"
    if low is None and high is None:
        return fmt(value, spec)
    upper = fmt(high, spec) if high is not None else "inf"
    return f"{fmt(value, spec)} [{fmt(low, spec)}, {upper}]"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def json_clean(obj):
    """Replace NaN/inf by None and numpy scalars by Python numbers (strict JSON)."""
    if isinstance(obj, dict):
        return {k: json_clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# ---------------------------------------------------------------------------------------------
# Sections every report.md has


def inputs_line(result: dict, inputs: list[str], elapsed_s: float) -> str:
    return (f"Inputs: {', '.join(inputs)}; {result['n_runs']} runs read, "
            f"{len(result['left_out'])} left out; analysis took {elapsed_s:.1f} s.")


def left_out_table(left_out: list[dict]) -> str:
    return md_table(["run", "reason", "detail"],
                    [[d["run_dir"], d["reason"], d["detail"]] for d in left_out])


def plots_section(plots: dict[str, str], captions: dict[str, str]) -> list[str]:
    """'## Plots': each plot file as an image with its caption."""
    lines = ["## Plots", ""]
    for name, file in plots.items():
        lines += [f"![{captions[name]}]({file})", f"*{captions[name]}.*", ""]
    return lines


# The lr a warning cites is the one trained; the grid and the run folders hold optim.lr.
TRAINED_LR = (". The lr cited is the one trained at that batch: `optim.lr` (the grid's value, "
              "in the run folder's name) carried there by `optim.lr_scaling`")
# What fixes each kind of warning, by a phrase the warning contains: the override or option
# to change. `{optimizer}` is filled in when every warning of the kind names one optimizer.
WARNING_FIXES = (
    ("best lr on the high edge", "the optimum lies above the lrs tried: rerun the sweep with "
     "more lr search (`grid.lr_search_rounds`, `grid.lr_search_budget`; the runs done are "
     "kept), or add a larger lr to `grid.lrs.{optimizer}` (the baseline batch's lrs, in the "
     "grid's step)" + TRAINED_LR),
    ("best lr on the low edge", "the optimum lies below the lrs tried: rerun the sweep with "
     "more lr search (`grid.lr_search_rounds`, `grid.lr_search_budget`), or add a smaller lr "
     "to `grid.lrs.{optimizer}` (in the grid's step)" + TRAINED_LR),
    ("warmup steps", "lower `train.warmup_steps`, or drop the smallest fraction from "
     "`grid.branch_budgets` (those cells train too few steps to measure the batch)"),
    ("reaches a lower loss than the baseline", "`--baseline-batch auto` (the most "
     "token-efficient batch as the baseline), or start `grid.batch_sizes` at that batch"),
    ("extrapolated beyond the baseline's budgets", "give the baseline smaller and larger "
     "budgets: smaller fractions in `grid.branch_budgets` (e.g. [0.0625,0.125,0.25,0.5]) and "
     "a longer `train.tokens`"),
    ("diverged", "lower the largest lr of `grid.lrs.{optimizer}`, or raise "
     "`train.warmup_steps`"),
)


def warning_kind(warning: str) -> str:
    """A warning without its group prefix and numbers: warnings of one kind share it."""
    text = re.sub(r"^[^:]{1,80}: ", "", warning)  # "stdlib V2048 T64 w64 d2 adamw: ..."
    return re.sub(r"[-+]?\d[\d,._e+-]*", "#", text).split(";")[0].split(" (")[0]


# The same fixes for a results table (`--table`), whose user has rows, not a sweep's config
TABLE_WARNING_FIXES = (
    ("best lr on the high edge", "add rows at a larger lr for that batch and budget (the lr "
     "column), so that its best lr lies inside the lrs tried"),
    ("best lr on the low edge", "add rows at a smaller lr for that batch and budget (the lr "
     "column), so that its best lr lies inside the lrs tried"),
    ("warmup steps", "add rows of longer runs at those batch sizes (more steps than 3x their "
     "warmup_steps), or leave such rows out"),
    ("reaches a lower loss than the baseline", "`--baseline-batch auto` (the most "
     "token-efficient batch as the baseline)"),
    ("extrapolated beyond the baseline's budgets", "add rows of the baseline batch at smaller "
     "and larger token budgets"),
    ("diverged", "add rows at smaller lrs for that batch, or leave the diverged rows out"),
)


def warning_fix(kind_warnings: list[str], fixes: tuple = WARNING_FIXES) -> str | None:
    for phrase, fix in fixes:
        if phrase in kind_warnings[0]:
            named = {o for w in kind_warnings for o in ("adamw", "muon") if f" {o}" in w}
            return fix.format(optimizer=named.pop() if len(named) == 1 else "<optimizer>")
    return None


def warning_kinds(warnings: list[str]) -> list[tuple[str, list[str]]]:
    """(kind, its warnings), the most frequent kind first."""
    kinds: dict[str, list[str]] = {}
    for w in warnings:
        kinds.setdefault(warning_kind(w), []).append(w)
    return sorted(kinds.items(), key=lambda kv: -len(kv[1]))


def warning_lines(warnings: list[str], fixes: tuple = WARNING_FIXES) -> list[str]:
    """What a script prints: one line per kind, counted, with its first instance and fix."""
    out = []
    for _, members in warning_kinds(warnings):
        fix = warning_fix(members, fixes)
        count = f" ({len(members)} like it; all in report.md)" if len(members) > 1 else ""
        out.append(f"warning: {members[0]}{count}" + (f"; fix: {fix}" if fix else ""))
    return out


def warnings_section(warnings: list[str], fixes: tuple = WARNING_FIXES) -> list[str]:
    """Every warning, grouped by kind (counted, the most frequent first), each kind with
    the override (or, for a table, the rows) that fixes it where one does."""
    if not warnings:
        return ["## Warnings", "", "None."]
    kinds = warning_kinds(warnings)
    lines = ["## Warnings", "", f"{len(warnings)} warning(s) of {len(kinds)} kind(s), the most "
             "frequent first.", ""]
    for kind, members in kinds:
        fix = warning_fix(members, fixes)
        if len(members) == 1 and not fix:
            lines.append(f"- {members[0]}")
            continue
        lines.append(f"- **{len(members)} x {kind}**" + (f" Fix: {fix}." if fix else ""))
        lines += [f"  - {w}" for w in members]
    return lines


# ---------------------------------------------------------------------------------------------
# Inputs and user errors


def default_out(paths: list[Path]) -> Path:
    """`<sweep dir>/report`: beside the common folder of the inputs (above a run directory)."""
    common = Path(os.path.commonpath([str(Path(p).resolve()) for p in paths]))
    if (common / "summary.json").exists():
        common = common.parent
    return common / "report"


@dataclass(frozen=True)
class SweepFolder:
    """A sweep's folder `<runs_root>/<stage>/<scale>` that holds finished runs."""

    path: Path
    newest_s: float  # modification time of its newest `<run>/summary.json` (epoch seconds)

    def age(self, now: float | None = None) -> str:
        """How long ago its newest run finished: 'just now', '3 min ago', '5 h ago', ..."""
        seconds = max(0.0, (time.time() if now is None else now) - self.newest_s)
        if seconds < 60:
            return "just now"
        if seconds < 3600:
            return f"{seconds // 60:.0f} min ago"
        if seconds < 2 * 86400:
            return f"{seconds / 3600:.0f} h ago"
        return f"{seconds / 86400:.0f} days ago"


def sweep_folders(runs_root: str | Path, stages: tuple[str, ...]) -> list[SweepFolder]:
    """Every `<runs_root>/<stage>/<scale>` folder of `stages` with a finished run in it (a
    `<run>/summary.json`: the trainer writes it when a run completes or diverges), the most
    recently written first. Other folders (`runs/single/...`, `runs/multirun/...`) are never
    among them."""
    newest: dict[Path, float] = {}
    for stage in stages:
        for path in Path(runs_root).glob(f"{stage}/*/*/summary.json"):
            folder = path.parent.parent
            newest[folder] = max(newest.get(folder, 0.0), path.stat().st_mtime)
    return sorted((SweepFolder(f, t) for f, t in newest.items()),
                  key=lambda s: (-s.newest_s, str(s.path)))


def latest_scale(runs_root: str | Path, stages: tuple[str, ...]) -> str | None:
    """The scale whose newest `<runs_root>/<stage>/<scale>/<run>/summary.json`, over `stages`,
    is the most recent; None when there is none."""
    folders = sweep_folders(runs_root, stages)
    return folders[0].path.name if folders else None


def no_runs(where: str, fix: str) -> ResultsError:
    """The one-line error of an analysis that found no run at all."""
    return ResultsError(f"no runs found under {where} (no summary.json); pass run directories "
                        f"or {fix}")


def all_left_out(where: str, left_out: list[dict]) -> ResultsError:
    """The one-line error of an analysis whose every run was left out (with the reasons)."""
    counts = Counter(d["reason"] for d in left_out)
    return ResultsError(f"nothing to analyse under {where}: all {len(left_out)} runs were left "
                        "out (" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                        + f"); first: {left_out[0]['detail']}")


# ---------------------------------------------------------------------------------------------
# W&B


def resamples_error(flag: str, count: int | None) -> str | None:
    """What is wrong with `count` refits given as `flag`: fewer than SMOKE_RESAMPLES, the
    fewest any interval of the analysis rests on; None when they will do (or none given)."""
    from critbatch.science.intervals import SMOKE_RESAMPLES

    if count is not None and count < SMOKE_RESAMPLES:
        return (f"{flag} {count}: give {SMOKE_RESAMPLES} or more (the fewest the smoke "
                "scale's intervals rest on)")
    return None


def check_resamples(parser, flag: str, count: int | None) -> None:
    """Stop in one line (argparse's error, exit 2) on `resamples_error`."""
    if message := resamples_error(flag, count):
        parser.error(message)


def add_wandb_arguments(parser) -> None:
    """--wandb and --project, as every analysis script takes them."""
    parser.add_argument("--wandb", dest="wandb_mode", default="offline",
                        choices=("offline", "online", "disabled"),
                        help="how to log the report to W&B (default: offline)")
    parser.add_argument("--project", default="critbatch", help="W&B project (default: critbatch)")


def study_command(argv: list[str] | None, doc: str, run_analysis: Callable, paths_help: str,
                  out_help: str) -> None:
    """A study's command line: PATHS, --out, --wandb and --project, then `run_analysis` with
    user errors as one line (the stability and schedule studies' `cli.main`)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("paths", nargs="*", help=paths_help)
    parser.add_argument("--out", help=out_help)
    add_wandb_arguments(parser)
    args = parser.parse_args(argv)
    with user_errors():
        run_analysis(args.paths, args.out, wandb_mode=args.wandb_mode, project=args.project)


def logged_group(run_dir: str | Path | None, sweep: str | None = None) -> str:
    """The W&B group a run was logged in (`results.wandb_group_name`), with logger.group read
    back from the run's config.json (the sweeps set it, e.g. "batch-cpu")."""
    config = read_config(run_dir) if run_dir is not None else None
    return wandb_group_name((config.get("logger") or {}).get("group") if config else None, sweep)


def analysis_run_id(project: str, group: str, name: str) -> str:
    """One W&B run per (project, group, report): a re-analysis resumes it rather than adding
    another run beside it."""
    return "analysis-" + hashlib.sha1(f"{project}/{group}/{name}".encode()).hexdigest()[:16]


def publish_report(out: Path, *, name: str, group: str, mode: str, project: str,
                   config: dict, images: dict[str, str], files: list[str],
                   summary: dict | None = None, tables: dict | None = None) -> str | None:
    """Log a report folder as a W&B run (job_type "analysis") in the experiment's group.

    `images`: {key: png file in `out`}, logged as images; `tables`: {key: (columns, rows)};
    `files` (report.md, the JSON, the plots) go into one artifact named `<name>-report`.
    The run's id is `analysis_run_id`: analysing the sweep again resumes the same W&B run.
    Returns the run id, or None when `mode` is "disabled" or W&B fails (a warning then).
    """
    if mode == "disabled":
        return None
    try:
        import wandb

        run = wandb.init(mode=mode, project=project, group=group, job_type="analysis",
                         name=name, dir=str(out), config=config,
                         id=analysis_run_id(project, group, name), resume="allow",
                         settings=wandb.Settings(console="off", silent=True))
        with run:
            run.log({key: wandb.Image(str(out / file)) for key, file in images.items()})
            for key, (columns, rows) in (tables or {}).items():
                run.log({key: wandb.Table(columns=list(columns), data=[
                    [json_clean(v) for v in row] for row in rows])})
            run.summary.update(summary or {})
            artifact = wandb.Artifact(f"{name}-report", type="report")
            for file in files:
                artifact.add_file(str(out / file))
            run.log_artifact(artifact)
            return run.id
    except Exception as err:  # W&B problems must not lose the report
        print(f"warning: W&B logging failed ({err}); the report folder is complete", flush=True)
        return None


# ---------------------------------------------------------------------------------------------
# The pipeline


def no_extra_files(result: dict, out: Path) -> list[str]:
    return []


@dataclass(frozen=True)
class Study:
    """What `run_study` needs from one study; every function is the study's own.

    A result (what `analyse` returns) holds at least `n_runs`, `groups`, `left_out` and
    `warnings` (a list that the plots may add to, so they are drawn before the document).
    """

    name: str  # the W&B analysis run's name; its artifact is `<name>-report`
    document_file: str  # the machine-readable document in the report folder, e.g. fits.json
    no_runs_fix: str  # ends the error "no runs found ...; pass run directories or <fix>"
    analyse: Callable[..., dict]  # (runs, left_out=, warnings=) -> result
    write_plots: Callable[[dict, Path], dict[str, str]]  # (result, out) -> {plot: png file}
    document: Callable[[dict, list[str]], dict]  # (result, inputs) -> the document
    # (result, inputs, plots, elapsed_s) -> the text of report.md
    markdown: Callable[[dict, list[str], dict[str, str], float], str]
    wandb: Callable[[dict, dict], dict]  # (result, loaded) -> group, tables=, summary=
    summary_lines: Callable[[dict], list[str]]  # printed between the counts and the warnings
    extra_files: Callable[[dict, Path], list[str]] = no_extra_files  # more files (bcrit.csv)


def one_blas_thread():
    """A context in which numpy/scipy's BLAS runs on one thread, for the analyses: their
    matrices are small (a few hundred cells by tens of parameters), and a threaded BLAS
    sharing two busy cores spent 80-300 ms on a 223 x 53 SVD that takes 0.5 ms on one thread;
    the trust-region fits take one per step. threadpoolctl limits the libraries loaded so far,
    so scipy.linalg (scipy's own OpenBLAS, beside numpy's) is loaded first. The analysis/
    scripts also set OPENBLAS_NUM_THREADS=1 (unless set) before numpy loads: OpenBLAS otherwise
    starts a thread per core at load, only to wait (0.06 s of a command's start on 2 cores)."""
    import scipy.linalg  # noqa: F401  (loads scipy's BLAS, so that the limit reaches it)
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def on_one_blas_thread(function):
    """`function` run inside `one_blas_thread`."""

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        with one_blas_thread():
            return function(*args, **kwargs)

    return wrapped


def run_study(study: Study, load: Callable[[], dict], inputs: list[str], out_dir: Path, *,
              wandb_mode: str = "offline", project: str = "critbatch") -> dict:
    """Load, analyse and write the report folder `out_dir`; returns {"out", "result",
    "document"}.

    `load()` returns {"runs", "left_out", "warnings"} (`results.load_runs`), and optionally
    "analyse_kwargs": more arguments for `study.analyse` (input beyond runs, e.g. a table's
    steps-to-target rows). `inputs` name what it reads. Raises ResultsError (one line for
    the user) only when nothing can be analysed: no input, or every run left out.
    """
    t0 = time.perf_counter()
    loaded = load()
    where = ", ".join(inputs)
    extra = loaded.get("analyse_kwargs", {})
    if not loaded["runs"] and not loaded["left_out"] and not extra:
        raise no_runs(where, study.no_runs_fix)
    print(f"analysing {len(loaded['runs'])} runs ...", flush=True)
    with one_blas_thread():
        result = study.analyse(loaded["runs"], left_out=loaded["left_out"],
                               warnings=loaded["warnings"], **extra)
    if not result["groups"]:
        raise all_left_out(where, result["left_out"])
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"writing the plots and the report ({time.perf_counter() - t0:.0f} s so far) ...",
          flush=True)
    plots = study.write_plots(result, out_dir)
    document = json_clean(study.document(result, inputs))
    write_json_atomic(out_dir / study.document_file, document)
    extra = study.extra_files(result, out_dir)
    (out_dir / "report.md").write_text(
        study.markdown(result, inputs, plots, time.perf_counter() - t0))
    publish_report(out_dir, name=study.name, mode=wandb_mode, project=project,
                   config={"inputs": inputs, "n_runs": result["n_runs"]}, images=plots,
                   files=["report.md", study.document_file, *extra, *plots.values()],
                   **study.wandb(result, loaded))
    print(f"{result['n_runs']} runs in {len(result['groups'])} group(s), "
          f"{len(result['left_out'])} left out", flush=True)
    for line in study.summary_lines(result):
        print(line)
    for line in warning_lines(result["warnings"], result.get("warning_fixes", WARNING_FIXES)):
        print(line)
    print(f"report: {out_dir / 'report.md'} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return {"out": out_dir, "result": result, "document": document}
