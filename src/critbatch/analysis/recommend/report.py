"""`python analysis/recommend.py`: the recommendation printed, written (JSON, report.md, plot)
and logged to W&B; `analysis.recommend` computes it.

With several optimizers in the sweep (and no --optimizer), each gets its answer; the JSON's
top level is the one whose recommended batch predicts the lowest loss, the others under
`others`. `--validate` writes `validation` instead: per optimizer, the held-out model's
recommendation beside what its runs measured.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from critbatch.analysis import plotting
from critbatch.analysis.bcrit.report import inputs_of
from critbatch.analysis.recommend.recommend import (
    DEFAULT_TOLERANCE,
    SizedSweep,
    answer,
    fit_model,
    sized_sweeps,
    validate,
    width_params,
)
from critbatch.analysis.render import (
    fmt,
    json_clean,
    md_table,
    on_one_blas_thread,
    publish_report,
)
from critbatch.results.errors import ResultsError
from critbatch.results.files import write_json_atomic

PLOT_FILE = "recommend.png"
JSON_FILE = "recommend.json"
REPORT_FILE = "recommend.md"


def fmt_range(low, high, spec: str = ".4g") -> str:
    return "-" if low is None or high is None else f"[{low:{spec}}, {high:{spec}}]"


def candidate_table(doc: dict) -> tuple[list[str], list[list[str]]]:
    header = ["batch (seq)", "loss (nats/token)", "95% (bootstrap)", "steps",
              "token overhead", "lr", "lr 95% (fit)", "B_crit (seq)"]
    rows = []
    for r in doc["candidates"]:
        mark = " <-" if r["batch_size"] == doc["batch_size"] else ""
        rows.append([f"{r['batch_size']}{mark}", f"{r['predicted_loss']:.4f}",
                     fmt_range(r["predicted_loss_low"], r["predicted_loss_high"]),
                     f"{r['steps']:,}", f"{r['token_overhead']:+.1%}", fmt(r["lr"], ".3g"),
                     fmt_range(r["lr_low"], r["lr_high"], ".3g"), fmt(r["b_crit"], ".3g")])
    return header, rows


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def headline(doc: dict) -> str:
    if doc["batch_size"] is None:
        return f"{doc['optimizer']}: no recommendation ({'; '.join(doc['warnings'])})"
    size = (f"width {doc['width']} ({doc['params']:,.0f} params)" if doc["width"]
            else f"{doc['params']:,.0f} params")
    lr = ("" if doc["lr"] is None else
          f" at lr {doc['lr']:.3g} {fmt_range(doc['lr_low'], doc['lr_high'], '.3g')}")
    if doc.get("beta2") is not None:
        lr += f", AdamW beta2 {doc['beta2']:.4g} ({beta2_words(doc['beta2_rule'])})"
    return (f"{doc['optimizer']}: batch {doc['batch_size']} sequences{lr} for {size} on "
            f"{doc['tokens']:,.0f} tokens: {doc['steps']:,} steps, predicted loss "
            f"{doc['predicted_loss']:.4f} "
            f"{fmt_range(doc['predicted_loss_low'], doc['predicted_loss_high'])} "
            f"nats/token, B_crit {fmt(doc['b_crit'], '.3g')} "
            f"{fmt_range(doc['b_crit_low'], doc['b_crit_high'], '.3g')} sequences (the largest "
            f"batch within {doc['tolerance']} nats/token of the best; intervals 95%)")


def target_lines(doc: dict) -> list[str]:
    t = doc.get("target_loss")
    if not t:
        return []
    rows = [[str(r["batch_size"]), fmt(r["tokens"], ".4g"), fmt(r["steps"], ",")]
            for r in t["rows"]]
    pick = ("no batch reaches it" if t["batch_size"] is None else
            f"fewest steps within the tolerance: batch {t['batch_size']} ({t['steps']:,} "
            f"steps, {t['tokens']:.4g} tokens; allowed up to {t['allowed_tokens']:.4g} tokens, "
            "what the most token-efficient batch needs for "
            f"{t['target_loss'] - doc['tolerance']:.4g})")
    return [f"to reach {t['target_loss']} nats/token (the predicted Pareto frontier): {pick}",
            text_table(["batch (seq)", "tokens", "steps"], rows)]


def validation_rows(v: dict) -> list[list[str]]:
    doc, m, at = v["recommendation"], v["measured"], v["predicted_at_measured_batch"] or {}
    checks = v["checks"]

    def ok(key):
        return {True: "yes", False: "no", None: "-"}[checks.get(key)]
    return [
        ["batch (seq)", str(doc["batch_size"]), str(m["batch_size"]),
         ok("batch_within_a_doubling")],
        ["lr at the measured batch", fmt(at.get("lr"), ".3g"),
         fmt(m["lr"], ".3g") + (f" (grid edge: {m['lr_edge']})" if m["lr_edge"] else ""),
         ok("lr_within_1.5x")],
        ["loss at the measured batch (nats/token)",
         f"{fmt(at.get('predicted_loss'), '.4f')} "
         f"{fmt_range(at.get('predicted_loss_low'), at.get('predicted_loss_high'))}",
         f"{m['loss']:.4f}", ok("loss_within_interval")],
    ]


def plot(docs: list[dict], sweeps: dict[str, SizedSweep], path: Path,
         measured: dict[str, dict] | None = None) -> None:
    """Per optimizer: predicted loss against batch at the target (line, 95% band, the pick
    ringed), the sweep's cells at each size's largest budget beside it (points), and with
    --validate the held-out runs' losses (crosses)."""
    plt = plotting.pyplot()
    fig, axes = plotting.panel_grid(max(1, len(docs)), "Predicted loss at the target tokens "
                                    "against batch (95% bootstrap band), beside the sweep")
    for ax, doc in zip(axes, docs, strict=False):
        rows = doc["candidates"]
        if not rows:
            plotting.empty_axes(ax, "no candidates")
            continue
        b = [r["batch_size"] for r in rows]
        ax.plot(b, [r["predicted_loss"] for r in rows], "-o", color="k", ms=4,
                label=f"predicted, {doc['params']:.3g} params, {doc['tokens']:.3g} tokens")
        if all(r["predicted_loss_low"] is not None for r in rows):
            ax.fill_between(b, [r["predicted_loss_low"] for r in rows],
                            [r["predicted_loss_high"] for r in rows], color="k", alpha=0.15)
        if doc["batch_size"]:
            ax.plot([doc["batch_size"]], [doc["predicted_loss"]], "o", ms=12, mfc="none",
                    color="tab:red", label=f"recommended: {doc['batch_size']}")
        sweep = sweeps[doc["optimizer"]]
        colors = plt.cm.viridis(np.linspace(0, 0.85, max(1, len(sweep.sizes))))
        for color, size in zip(colors, sweep.sizes, strict=False):
            mine = [c for c, p in zip(sweep.cells, sweep.params, strict=True) if p == size]
            top = max(c.budget for c in mine)
            pts = sorted((c.batch_size, c.loss) for c in mine if c.budget == top)
            ax.plot(*zip(*pts, strict=True), "s--", color=color, ms=4, lw=0.8,
                    label=f"sweep {size:.3g} params, {top:.3g} tokens")
        held = (measured or {}).get(doc["optimizer"])
        if held:
            ax.plot(list(held["losses"]), list(held["losses"].values()), "x", color="tab:red",
                    ms=8, mew=2, label="held-out runs (measured)")
        plotting.log_axes(ax, x=True)
        plotting.label_axes(ax, "batch size (sequences)", "loss (nats/token)",
                            f"{doc['optimizer']}")
    plotting.save_figure(fig, path)


def beta2_words(rule: dict) -> str:
    if rule["scaling"] == "tokens":
        return f"the sweep's half-life of {rule['half_life_tokens']:,.0f} tokens"
    return "the sweep's, fixed at every batch"


def recommend_all(sweeps: dict[str, SizedSweep], optimizer: str | None, params: float,
                  tokens: float, tolerance: float, width: int | None,
                  target_loss: float | None) -> list[dict]:
    """A document per optimizer (the asked one, or every one), best predicted loss first."""
    docs = []
    for name, sweep in sweeps.items():
        if optimizer and name != optimizer:
            continue
        model = fit_model(sweep)
        docs.append(answer(model, name, params, tokens, sweep.seq_len, tolerance, width,
                           target_loss))
    return sorted(docs, key=lambda d: math.inf if d["predicted_loss"] is None
                  else d["predicted_loss"])


def target_params(sweeps: dict[str, SizedSweep], width: int | None,
                  params: float | None) -> float:
    if params:
        return float(params)
    depths = {s.depth for s in sweeps.values()}
    if len(depths) != 1 or None in depths:
        raise ResultsError("--width needs a sweep of one depth (its runs name no single "
                           "depth); pass --params (non-embedding parameters) instead")
    return width_params(width, depths.pop())


@on_one_blas_thread
def run(paths: list[str], tables: list[str] | None, from_wandb: str | None, group: str | None,
        *, width: int | None = None, params: float | None = None, tokens: float | None = None,
        optimizer: str | None = None, tolerance: float = DEFAULT_TOLERANCE,
        target_loss: float | None = None, json_file: str | None = None,
        out: str | None = None, do_validate: bool = False, wandb_mode: str = "offline",
        project: str = "critbatch") -> dict:
    """Load the runs, answer (or validate), print, and write the report folder."""
    t0 = time.perf_counter()
    load, inputs, default = inputs_of(paths, from_wandb, group, tables, "runs")
    loaded = load()
    if not loaded["runs"]:
        raise ResultsError(f"no runs found under {', '.join(inputs)}; pass a sweep folder "
                           "(make sweep-batch or make sweep-widths) or --table FILE")
    warnings = list(loaded["warnings"])
    sweeps = sized_sweeps(loaded["runs"], warnings)
    if optimizer and optimizer not in sweeps:
        raise ResultsError(f"--optimizer {optimizer}: the runs have {', '.join(sweeps) or 'none'}"
                           "; pass one of those")
    if not sweeps:
        raise ResultsError(f"no usable cells under {', '.join(inputs)} (every run left out or "
                           "without a model size)")
    out_dir = Path(out) if out else default
    out_dir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    if do_validate:
        checks = {name: validate(s, tolerance) for name, s in sweeps.items()
                  if not optimizer or name == optimizer}
        docs = [v["recommendation"] for v in checks.values()]
        document = {"validation": list(checks.values()), "warnings": warnings}
        for name, v in checks.items():
            lines += [f"{name}: held out {v['held_out']}; recommended from the rest vs measured",
                      text_table(["", "recommended", "measured", "match"], validation_rows(v)),
                      ""]
        measured = {name: v["measured"] for name, v in checks.items()}
    else:
        size = target_params(sweeps, width, params)
        docs = recommend_all(sweeps, optimizer, size, tokens, tolerance, width, target_loss)
        document = {**docs[0], "others": docs[1:]}
        document["warnings"] = warnings + docs[0]["warnings"]
        for doc in docs:
            lines += [headline(doc), text_table(*candidate_table(doc)), *target_lines(doc), ""]
        measured = None
    plot(docs, sweeps, out_dir / PLOT_FILE, measured)
    document = json_clean(document)
    write_json_atomic(out_dir / JSON_FILE, document)
    if json_file:
        write_json_atomic(Path(json_file), document)
    doc_warnings = [w for d in docs for w in d["warnings"]] + warnings
    text = "\n".join(lines + [f"warning: {w}" for w in dict.fromkeys(doc_warnings)])
    (out_dir / REPORT_FILE).write_text(markdown(inputs, docs, lines, doc_warnings,
                                                time.perf_counter() - t0))
    publish_report(out_dir, name="recommend", group=f"recommend-{out_dir.parent.name}",
                   mode=wandb_mode, project=project, config={"inputs": inputs},
                   images={"recommend": PLOT_FILE}, files=[REPORT_FILE, JSON_FILE, PLOT_FILE],
                   summary={k: document.get(k) for k in ("optimizer", "batch_size", "lr",
                                                          "predicted_loss")})
    print(text)
    print(f"report: {out_dir / REPORT_FILE} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return document


def terms_rows(model: dict) -> list[list[str]]:
    """The fitted optional terms of a recommendation's model (older documents: none)."""
    rows = []
    if model.get("b_small") is not None:
        rows.append(["B_s (sequences)", f"{model['b_small']:.3g}"])
    if model.get("transition_power") is not None:
        rows.append(["p (the transition's power)", f"{model['transition_power']:.2f}"])
    return rows


def markdown(inputs: list[str], docs: list[dict], lines: list[str], warnings: list[str],
             elapsed_s: float) -> str:
    out = ["# Recommendation", "", f"From {', '.join(inputs)} ({elapsed_s:.1f} s).", "",
           "```", *lines, "```", "", f"![prediction]({PLOT_FILE})", ""]
    if docs:
        m = docs[0]["model"]
        out += ["## The model", "", md_table(["", "value"], [
            ["form", m["form"]], *terms_rows(m), ["chi2/dof", f"{m['chi2_per_dof']:.2f}"],
            ["sizes (params)", ", ".join(f"{s:,.0f}" for s in m["sizes"])],
            ["intervals", m["intervals"]]]), ""]
    if warnings:
        out += ["## Warnings", "", *[f"- {w}" for w in dict.fromkeys(warnings)], ""]
    return "\n".join(out)
