"""The batch-schedule study's outputs and pipeline: schedules.json (`schedules_document`),
report.md (`report_markdown`), the W&B table of arms and the terminal summary, and
`run_analysis` (what `analysis/schedules.py` calls), which loads the runs and writes them all
through `render.run_study`."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from critbatch.analysis import render
from critbatch.analysis.render import fmt, md_table
from critbatch.analysis.schedules.plots import PLOTS, write_plots
from critbatch.analysis.schedules.schedules import ANNEALED, SWEEP, UNANNEALED, analyse
from critbatch.results.errors import ResultsError
from critbatch.results.runs import load_runs

DOCUMENT_VERSION = 1  # of schedules.json
WANDB_COLUMNS = ("group", "arm", "batch_size_start", "batch_size_max", "batch_size_mean", "steps",
                 "tokens", "val_loss", "val_loss_per_byte", "s_small", "steps_saved",
                 "steps_saved_percent", "s_small_reference")
QUESTION_SHORT = "Does growing the batch save optimizer steps at no cost in tokens?"
QUESTION = (
    f"**The question.** {QUESTION_SHORT} "
    "Steps are serial time, tokens are compute (science.md section 1). A batch above the "
    "critical batch B_crit buys few steps for many tokens, and B_crit grows as the loss "
    "falls, so a batch that starts small and grows (GPT-3's ramp, or McCandlish et al. "
    "2018's prescription of following the gradient noise scale B_noise) should take fewer "
    "steps than a constant small batch at no loss in quality. Each optimizer trains five "
    "arms on the same token budget, each with a wsd lr schedule that ends annealed: a "
    "constant small batch, a constant large batch, a ramp (small -> large), an adaptive batch "
    "that follows the online B_noise estimate between the two, and a measured batch that "
    "doubles as the local critical batch measured by branched training grows. Batch sizes in "
    "sequences; losses in nats/token."
)
ANNEALED_NOTE = (
    "**Steps saved against the annealed small batch.** S_small(L) is read off the small "
    "batch's annealed points: the final loss of each of its cooldown branches (the run "
    "annealed to a smaller budget) and of the run itself, interpolated linearly in log(step) "
    "between the two that bracket L. Steps saved are exact up to that interpolation. Where an "
    "arm's loss is below the small run's final loss, the saving is at least steps_small - "
    "steps_arm (marked 'bound')."
)
CAVEAT = (
    "**Caveat: steps saved are an upper estimate.** S_small(L) is read off the constant-small "
    "run's validation curve, and that curve's intermediate points come before its "
    "learning-rate decay has finished: a small-batch run annealed to end at S_small(L) would "
    "reach L in fewer steps. So S_small(L) overstates what the small batch needs, and the "
    "steps saved (and their %) overstate the saving. Where an arm's loss is below everything "
    "the small run reached, the saving is at least steps_small - steps_arm by the small run's "
    "own curve (marked 'bound')."
)


# ---------------------------------------------------------------------------------------------
# schedules.json and report.md


def schedules_document(result: dict, inputs: list[str]) -> dict:
    """The public schedules.json (`render.run_study` makes it strict JSON: NaN and inf become
    null).

    {version, question, inputs, n_runs, caveat, groups: [{name, optimizer, model, reference,
    s_small_reference, annealed_points, arms: [{arm, batch_schedule, run_dir, status, lr,
    seq_len, batch_size_start, batch_size_final, batch_size_max, batch_size_mean,
    batch_changes, b_noise, steps, tokens,
    val_loss, val_loss_per_byte, is_reference, tokens_ratio, val_loss_delta,
    val_loss_per_byte_delta, s_small, s_small_kind, steps_saved, steps_saved_percent,
    steps_saved_bound, s_small_reference, note}]}], warnings, left_out}.
    s_small_reference: "annealed" (S_small read off the small batch's cooldown branches and
    its end: exact up to the log-step interpolation) or "unannealed curve: upper estimate"
    (off its validation curve; older sweeps), null without a small batch; annealed_points:
    the small batch's annealed [{step, val_loss}] ([] when it has none). caveat: the note
    that applies (both when groups differ). val_loss_delta: the arm's final loss
    minus the reference's (nats/token; `_per_byte`: nats/byte). s_small_kind: reference |
    interpolated | not_reached | first_eval | no_curve | no_reference | reference_diverged |
    arm_diverged; steps_saved_bound: null (an estimate), "lower" or "upper".
    """
    groups = [{k: g[k] for k in ("name", "optimizer", "model", "reference", "s_small_reference",
                                 "annealed_points", "arms")} for g in result["groups"]]
    return {
        "version": DOCUMENT_VERSION, "question": QUESTION_SHORT,
        "inputs": inputs, "n_runs": result["n_runs"],
        "caveat": " ".join(notes_for(result)).replace("**", ""),
        "groups": groups, "warnings": result["warnings"], "left_out": result["left_out"],
    }


def notes_for(result: dict) -> list[str]:
    """How steps saved were read: the annealed note, the upper-estimate caveat, or both."""
    kinds = {g["s_small_reference"] for g in result["groups"]}
    return [text for kind, text in ((ANNEALED, ANNEALED_NOTE), (UNANNEALED, CAVEAT))
            if kind in kinds] or [CAVEAT]


def _count(x: float | None) -> str:
    return fmt(x, ",.0f")


def arm_cells(a: dict) -> list[str]:
    """A table row for one arm (see `arm_table`)."""
    last = a["batch_size_final"]
    batch = (f"{a['batch_size_start']:g} -> {a['batch_size_max']:g} "
             f"({fmt(a['batch_size_mean'], '.4g')}"
             + (f"; last step {last:g})" if last != a["batch_size_max"] else ")"))
    if a["s_small_kind"] == "reference":
        s_small, saved, pct = "reference", "-", "-"
    elif a["s_small_kind"] == "not_reached":
        s_small = "not reached by the constant small batch"
        saved = f">= {_count(a['steps_saved'])} (bound)"
        pct = f">= {fmt(a['steps_saved_percent'], '.0f')}% (bound)"
    elif a["s_small_kind"] == "first_eval":
        s_small = f"<= {_count(a['s_small'])} (first eval)"
        saved = f"<= {_count(a['steps_saved'])} (bound)"
        pct = f"<= {fmt(a['steps_saved_percent'], '.0f')}% (bound)"
    elif a["s_small_kind"] == "interpolated":
        s_small, saved = _count(a["s_small"]), _count(a["steps_saved"])
        pct = f"{fmt(a['steps_saved_percent'], '.0f')}%"
    else:
        s_small, saved, pct = "-", "-", "-"
    status = "" if a["status"] == "completed" else f" ({a['status']})"
    reference = {ANNEALED: "annealed", UNANNEALED: "unannealed curve (upper estimate)"}.get(
        a["s_small_reference"], "-")
    return [a["arm"] + status, batch, fmt(a["lr"], ".3g"), f"{a['steps']:,}",
            f"{a['tokens']:,}", fmt(a["tokens_ratio"], ".2f"), fmt(a["val_loss"], ".4f"),
            "-" if a["is_reference"] else fmt(a["val_loss_delta"], "+.4f"),
            s_small, saved, pct, reference]


ARM_HEADER = ["arm", "batch start -> largest (mean; last step), seq", "peak lr", "steps", "tokens",
              "tokens vs small", "final val loss (nats/token)", "minus small's (nats/token)",
              "S_small at that loss (steps)", "steps saved", "% saved", "S_small read off"]


def arm_table(group: dict) -> str:
    return md_table(ARM_HEADER, [arm_cells(a) for a in group["arms"]])


def report_markdown(result: dict, inputs: list[str], plots: dict[str, str],
                    elapsed_s: float) -> str:
    lines = ["# Batch-size schedules report", "", QUESTION, "",
             render.inputs_line(result, inputs, elapsed_s), "",
             "## Arms per optimizer", "",
             "S_small: the optimizer steps the constant small batch needs to reach the arm's "
             "final validation loss, interpolated linearly in log(step) between the two points "
             "that bracket that loss (first crossing): its annealed points (the ends of its "
             "cooldown branches and of the run; 'S_small read off' = annealed) when it has "
             "them, else the eval points of its own curve (unannealed: an upper estimate). "
             "Steps saved = "
             "S_small - the arm's steps, and as a % of S_small. Tokens vs small: the arm's "
             "tokens over the constant-small run's (1.00 at equal tokens). Batch: the first "
             "step's -> the largest trained (the ramp's final batch, the most the adaptive "
             "batch grew to), mean = tokens / (steps x seq_len); a scheduled run's last steps "
             "shrink to fit the token budget exactly, and the last step's batch is shown when "
             "smaller.", ""]
    for g in result["groups"]:
        lines += [f"### {g['name']}", ""]
        if g["reference"]:
            how = (f"annealed at {len(g['annealed_points'])} budgets: "
                   + ", ".join(f"{p['val_loss']:.4f} at {p['step']:,} steps"
                               for p in g["annealed_points"])
                   if g["annealed_points"] else "its unannealed curve")
            lines += [f"Reference (constant small batch): {g['reference']}; S_small read off "
                      f"{how}", ""]
        lines += [arm_table(g), ""]
        notes = [f"- {a['arm']}: {a['note']}" for a in g["arms"]
                 if a["note"] and not a["is_reference"]]
        notes += [f"- {a['arm']}: final online B_noise {a['b_noise']:.4g} sequences"
                  f" ({a['b_noise'] * a['seq_len']:.3g} tokens)"
                  for a in g["arms"] if a["b_noise"] is not None]
        lines += notes + ([""] if notes else [])
    for note in notes_for(result):
        lines += [note, ""]
    lines += render.plots_section(plots, PLOTS)
    lines += render.warnings_section(result["warnings"])
    if result["left_out"]:
        lines += ["", "## Runs left out", "", render.left_out_table(result["left_out"])]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The pipeline


def wandb_fields(result: dict, loaded: dict) -> dict:
    """The analysis run's group (that of the first run read) and its table of arms."""
    first = loaded["runs"][0]
    arms = [(g["name"], *(a.get(c) for c in WANDB_COLUMNS[1:]))
            for g in result["groups"] for a in g["arms"]]
    return {"group": render.logged_group(first["run_dir"], first["sweep"]),
            "tables": {"arms": (WANDB_COLUMNS, arms)}}


def summary_lines(result: dict) -> list[str]:
    """Per group, the arms as an aligned table: batch, steps, tokens, loss, steps saved."""
    header = ["arm", "batch", "steps", "tokens x", "loss", "S_small", "saved", "%", "read off"]
    lines = []
    for g in result["groups"]:
        lines.append(f"{g['name']}:")
        rows = [[c[0], c[1], c[3], c[5], c[6], c[8], c[9], c[10], c[11]] for c in
                map(arm_cells, g["arms"])]
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        lines += ["  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))
                  for r in [header, *rows]]
    return lines


STUDY = render.Study(
    name="schedules", document_file="schedules.json",
    no_runs_fix="a sweep folder, or run make sweep-schedules",
    analyse=analyse, write_plots=write_plots, document=schedules_document,
    markdown=report_markdown, wandb=wandb_fields, summary_lines=summary_lines)


def run_analysis(paths: list[str] | None = None, out: str | None = None,
                 runs_root: str = "runs", wandb_mode: str = "offline",
                 project: str = "critbatch") -> dict:
    """Load, analyse and write the report folder; returns {"out", "result", "document"}.

    The runs come from `paths`, else the `<runs_root>/schedules/<scale>` folder written last.
    Raises ResultsError (one line for the user) when nothing can be analysed: a missing
    path, no runs, or every run left out.
    """
    if paths:
        roots = [Path(p) for p in paths]
    else:
        folders = render.sweep_folders(runs_root, (SWEEP,))
        if not folders:
            raise ResultsError(f"no schedule-study runs under {runs_root}/{SWEEP}/; pass run "
                               "directories or train them first (make sweep-schedules)")
        roots = [folders[0].path]
        print(f"no paths given: analysing {roots[0]}, the most recent schedule study (its "
              f"newest run finished {folders[0].age()})", flush=True)
    return render.run_study(STUDY, partial(load_runs, roots), [str(p) for p in roots],
                            Path(out) if out else render.default_out(roots),
                            wandb_mode=wandb_mode, project=project)
