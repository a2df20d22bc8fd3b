"""`python analysis/recommend.py`: the answer printed, written (JSON, report.md, plot) and logged
to W&B; `engine.py` computes it, for this door and every other.

With several optimizers in the sweep (and no --optimizer), each gets its answer; the JSON's
top level is the one whose recommended batch predicts the lowest loss (where both predict
one), the others under `others`. `--validate` writes `validation` instead: per optimizer, each
held-out case's answer scored on the case's own runs.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from critbatch.analysis import plotting
from critbatch.analysis.bcrit.report import inputs_of
from critbatch.analysis.recommend import engine
from critbatch.analysis.recommend.recommend import (
    SizedSweep,
    beta2_of,
    sized_sweeps,
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
from critbatch.results.runs import scale_of
from critbatch.science.answer import GridCell, Promise
from critbatch.science.intervals import percentile_interval, refits_at
from critbatch.science.recommend import to_target_loss

PLOT_FILE = "recommend.png"
JSON_FILE = "recommend.json"
REPORT_FILE = "recommend.md"


def fmt_range(low, high, spec: str = ".4g") -> str:
    return "" if low is None or high is None else f" [{low:{spec}}, {high:{spec}}]"


def short(x: float) -> str:
    """A count in 2 significant digits, 1.1e9 rather than 1.1e+09 (legends)."""
    return f"{x:.2g}".replace("e+0", "e").replace("e+", "e")


def count_words(x: float) -> str:
    """A large count as 3 significant digits, 1e9 rather than 1e+09."""
    return f"{x:.3g}".replace("e+0", "e").replace("e+", "e")


def lr_range(value: float | None, low: float | None, high: float | None) -> str:
    """An lr and its interval as 1.09e-03 [8.12e-04, 1.54e-03]."""
    if value is None:
        return "-"
    bounds = "" if low is None or high is None else f" [{low:.2e}, {high:.2e}]"
    return f"{value:.2e}{bounds}"


def batch_words(batch: float, seq_len: int) -> str:
    return f"{batch:,.0f} sequences of {seq_len:,} tokens"


def answer_lines(doc: dict) -> list[str]:
    """An answer as the console shows it: its warnings first, then the batch and lr, the
    promise and what it costs, the loss-optimal batch, the route and the check."""
    name = doc.get("optimizer") or doc.get("grid") or ""
    prefix = f"{name}: " if name else ""
    lines = [prefix + w for w in doc["headline"]]
    size = (f"width {doc['width']} ({doc['params']:,.0f} params)" if doc.get("width")
            else f"{count_words(doc['params'])} params")
    lr = f"lr {lr_range(doc['lr'], doc['lr_low'], doc['lr_high'])}"
    if doc.get("beta2") is not None:
        lr += f", AdamW beta2 {doc['beta2']:.4g}"
    low, high = doc["batch_low"], doc["batch_high"]
    interval = fmt_range(low, high, ",.0f")
    if low is not None and not low <= doc["batch_size"] <= high:
        # the interval is the largest batch within the promise's; the answer is kept below it
        interval = (f" (below{interval}, the 95% interval of the largest batch within the "
                    "promise: kept below it so that the promise holds over the refits and "
                    "leaves room for the lr's miss)")
    lines.append(
        f"{prefix}batch {batch_words(doc['batch_size'], doc['seq_len'])}"
        f"{interval} at {lr}, for {size} on "
        f"{count_words(doc['tokens'])} tokens ({doc['steps']:,} steps)")
    loss = ("" if doc.get("predicted_loss") is None else
            f"; predicted loss {doc['predicted_loss']:.4f}"
            f"{fmt_range(doc.get('predicted_loss_low'), doc.get('predicted_loss_high'))}")
    lines.append(f"  promise: {doc['promise']}, which gives up {doc['loss_given_up']:.4f} "
                 f"nats/token{loss}")
    opt = doc["loss_optimal_batch"]
    where = (" (the smallest trained: loss keeps falling towards it)"
             if doc.get("loss_optimal_is_smallest") else "")
    interval = fmt_range(doc.get("loss_optimal_batch_low"), doc.get("loss_optimal_batch_high"),
                         ",.0f")
    lines.append(
        f"  loss-optimal: batch {opt:,.0f}{interval}{where} at lr "
        + lr_range(doc["loss_optimal_lr"], doc["loss_optimal_lr_low"],
                   doc["loss_optimal_lr_high"]))
    if doc.get("b_crit") is not None:
        lines.append(f"  B_crit {doc['b_crit']:,.0f}"
                     f"{fmt_range(doc['b_crit_low'], doc['b_crit_high'], ',.0f')} sequences at "
                     f"that loss: E/E_min {doc['tokens_over_min']:.2f}, S/S_min "
                     f"{doc['steps_over_min']:.2f}")
    lines += [f"  how: {doc['route_words']}",
              f"  intervals: {doc['model']['intervals']}",
              f"  verdict: {doc['verdict']}; check: {doc['check']}"]
    return lines


def candidate_rows(doc: dict, fitted: engine.Fitted) -> list[dict]:
    """Powers of two around the answer: steps and lr (and on the B_crit route the predicted
    loss with its 95% interval, the compute overhead against the loss-optimal batch, E/E_min
    - 1 as `token_overhead`, B_crit at that loss and the lr's interval)."""
    low = 2 ** math.floor(math.log2(min(doc["loss_optimal_batch"], doc["batch_size"]) / 2))
    high = 2 ** math.ceil(math.log2(doc["batch_size"] * 4))
    rows = []
    b = max(low, 1)
    while b <= high and b * doc["seq_len"] <= doc["tokens"]:
        row = {"batch_size": b, "steps": int(doc["tokens"] // (b * doc["seq_len"])),
               "within_promise": b <= doc["batch_size"] * (1 + 1e-9)}
        if fitted.route == engine.ROUTE_B_CRIT:
            fit, ref = fitted.model.fit, doc["loss_optimal_batch"]
            loss = float(fit.predict_loss(doc["params"], b, doc["tokens"])[0])
            draws = [float(r.predict_loss(doc["params"], b, doc["tokens"])[0])
                     for r in fitted.model.refits]
            row["predicted_loss"] = loss
            row["predicted_loss_low"], row["predicted_loss_high"] = percentile_interval(
                draws, log=False)
            row["overhead"] = doc["tokens"] / float(fit.tokens_to(loss, doc["params"], ref)) - 1
            row["token_overhead"] = float(fit.overhead_factor(loss, b)) - 1  # E/E_min - 1
            row["b_crit"] = float(fit.b_crit(loss))
            row["lr"], row["lr_low"], row["lr_high"] = engine.lr_of(fitted, doc["params"],
                                                                    doc["tokens"], b)
        else:
            row["lr"] = fitted.grid.lr.predict(doc["params"], doc["tokens"], b)
        rows.append(row)
        b *= 2
    return rows


def candidate_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    loss = any("predicted_loss" in r for r in rows)
    header = ["batch (seq)", "steps", "lr", "within the promise"] + (
        ["loss (nats/token)", "compute overhead"] if loss else [])
    out = []
    for r in rows:
        cells = [str(r["batch_size"]), f"{r['steps']:,}", fmt(r["lr"], ".3g"),
                 "yes" if r["within_promise"] else "no"]
        if loss:
            cells += [fmt(r["predicted_loss"], ".4f"), f"{r['overhead']:+.1%}"]
        out.append(cells)
    return header, out


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def target_lines(doc: dict) -> list[str]:
    t = doc.get("target_loss")
    if not t:
        return []
    rows = [[str(r["batch_size"]), fmt(r["tokens"], ".4g"), fmt(r["steps"], ",")]
            for r in t["rows"]]
    pick = ("no batch reaches it" if t["batch_size"] is None else
            f"fewest steps within the tolerance: batch {t['batch_size']} ({t['steps']:,} "
            f"steps, {t['tokens']:.4g} tokens; allowed up to {t['allowed_tokens']:.4g} tokens)")
    return [f"to reach {t['target_loss']} nats/token (the predicted Pareto frontier): {pick}",
            text_table(["batch (seq)", "tokens", "steps"], rows)]


def validation_lines(name: str, rows: list[dict]) -> list[str]:
    """Each held-out case: the answer beside what the case's own runs measured."""
    out = [f"{name}: held out in turn (the answer fitted without the case, its cost read off "
           "the case's own runs)"]
    for r in rows:
        a, m, o = r["answer"], r["measured"], r["loss_optimal_measured"]
        checks = ", ".join(f"{k} {'ok' if v else 'NO'}" for k, v in m["checks"].items()
                           if v is not None)
        interval = fmt_range(a["batch_low"], a["batch_high"], ",.0f")
        out += [f"  {r['case']}",
                f"    batch {a['batch_size']:,.0f}{interval} vs measured largest within "
                f"{a['loss_given_up']:.4f}: "
                f"{m['measured_largest_within']:,.0f}; gives up {m['loss_given_up']:.4f} "
                f"nats/token at its (batch, lr) ({checks})",
                f"    loss-optimal batch {a['loss_optimal_batch']:,.0f} gives up "
                f"{o['loss_given_up']:.4f}"
                + (f"; the formula's batch {r['formula']['batch_size']:,.0f} gives up "
                   f"{r['formula']['loss_given_up']:.4f}" if r.get("formula") else "")]
    s = engine.validation_summary(rows)
    out.append(f"  promise kept {s['promise_kept']['passed']} of {s['promise_kept']['of']}; "
               f"interval holds the measured batch {s['interval_holds']['passed']} of "
               f"{s['interval_holds']['of']}; within a doubling "
               f"{s['batch_within_a_doubling']['passed']} of {s['batch_within_a_doubling']['of']}")
    return out


def nearest_cells(cells: list[GridCell], params: float, tokens: float, count: int = 4
                  ) -> list[GridCell]:
    """The cells nearest the target in ln N and ln D."""
    return sorted(cells, key=lambda c: math.hypot(math.log(c.params / params),
                                                  math.log(c.tokens / tokens)))[:count]


def plot(docs: list[dict], fitted: dict[str, engine.Fitted], path: Path) -> None:
    """Per optimizer: the measured loss above each nearby cell's best against batch, the
    promised loss given up, the answer with its interval and the loss-optimal batch; on the
    B_crit route also the predicted loss above its best at the target (with its 95% band)."""
    plt = plotting.pyplot()
    fig, axes = plotting.panel_grid(max(1, len(docs)), "The answer against the measured "
                                    "profiles: loss above each cell's best against batch")
    for ax, doc in zip(axes, docs, strict=False):
        fit = fitted[doc.get("optimizer") or doc.get("grid")]
        near = nearest_cells(fit.cells, doc["params"], doc["tokens"])
        colors = plt.cm.viridis(np.linspace(0, 0.85, max(1, len(near))))
        for color, c in zip(colors, near, strict=False):
            b, loss = c.profile()
            ax.plot(b, loss - c.best, "s-", color=color, ms=3, lw=0.8,
                    label=f"measured: N {short(c.params)}, D {short(c.tokens)}")
        rows = doc.get("candidates") or []
        if fit.route == engine.ROUTE_B_CRIT and rows:
            b = [r["batch_size"] for r in rows]
            best = doc["predicted_best_loss"]
            ax.plot(b, [r["predicted_loss"] - best for r in rows], "-o", color="k", ms=3,
                    label="predicted at the target")
        ax.axhline(doc["loss_given_up"], color="tab:red", lw=0.8, ls=":",
                   label=f"promise: {doc['loss_given_up']:.4f} nats/token")
        if doc["batch_low"] is not None:
            ax.axvspan(doc["batch_low"], doc["batch_high"], color="tab:red", alpha=0.12,
                       label="95%: largest batch within")
        ax.axvline(doc["batch_size"], color="tab:red",
                   label=f"answer: {doc['batch_size']:,.0f} sequences")
        ax.axvline(doc["loss_optimal_batch"], color="tab:blue", ls="--",
                   label=f"loss-optimal: {doc['loss_optimal_batch']:,.0f}")
        ax.set_ylim(bottom=-0.002)
        plotting.log_axes(ax, x=True)
        plotting.label_axes(ax, "batch size (sequences)", "loss above the cell's best "
                            "(nats/token)", f"{doc.get('optimizer') or doc.get('grid')}: "
                            f"{doc['params']:.3g} params, {doc['tokens']:.3g} tokens")
    plotting.save_figure(fig, path)


def validation_plot(cases: dict[str, list[dict]], cells: dict[str, list[GridCell]],
                    path: Path) -> None:
    """Per optimizer and held-out case: the case's own measured profile (loss above its best
    against batch), the promised loss given up, the answer (fitted without the case) with its
    interval, the measured largest batch within the promise."""
    panels = [(name, row) for name, rows in cases.items() for row in rows]
    fig, axes = plotting.panel_grid(max(1, len(panels)), "Held out in turn: each case's own "
                                    "runs against the answer fitted without them")
    for ax, (name, row) in zip(axes, panels, strict=False):
        cell = next(c for c in cells[name] if c.key == (row["params"], row["tokens"]))
        b, loss = cell.profile()
        a, m = row["answer"], row["measured"]
        ax.plot(b, loss - cell.best, "s-", color="k", ms=3, lw=0.8, label="measured profile")
        ax.axhline(a["loss_given_up"], color="tab:red", lw=0.8, ls=":",
                   label=f"promised: {a['loss_given_up']:.4f} nats/token")
        if a["batch_low"] is not None:
            ax.axvspan(a["batch_low"], a["batch_high"], color="tab:red", alpha=0.12,
                       label="95%: largest batch within")
        ax.axvline(a["batch_size"], color="tab:red",
                   label=f"answer {a['batch_size']:,.0f}: gives up {m['loss_given_up']:.4f}")
        ax.axvline(m["measured_largest_within"], color="tab:green", ls="--",
                   label=f"measured largest within: {m['measured_largest_within']:,.0f}")
        plotting.log_axes(ax, x=True)
        plotting.label_axes(ax, "batch size (sequences)", "loss above the case's best "
                            "(nats/token)", f"{name}: {row['case']}")
    plotting.save_figure(fig, path)


def fit_all(sweeps: dict[str, SizedSweep], optimizer: str | None, promise: Promise,
            pipeline_test: bool, report_verdicts: dict | None = None,
            resamples: int | None = None) -> dict[str, engine.Fitted]:
    """Each optimizer's fit; `resamples` as `run` resolved it (None: the engine's)."""
    out = {}
    for name, sweep in sweeps.items():
        if optimizer and name != optimizer:
            continue
        print(f"  {name}: fitting the answer's laws and their bootstrap ...", flush=True)
        out[name] = engine.fit(engine.grid_cells(sweep), promise, sweep.seq_len, sweep,
                               resamples=resamples,
                               report_verdict=(report_verdicts or {}).get(name),
                               pipeline_test=pipeline_test)
    return out


def answer_for(name: str, fitted: engine.Fitted, sweep: SizedSweep, params: float,
               tokens: float, width: int | None, target_loss: float | None) -> dict:
    """One optimizer's answer document (engine.answer with the sweep's beta2, its candidates
    and, on the B_crit route, the steps to a target loss)."""
    doc = {"optimizer": name, **engine.answer(fitted, params, tokens, width)}
    doc["beta2"] = beta2_of(sweep.beta2_rule, round(doc["batch_size"]), sweep.seq_len)
    doc["beta2_rule"] = sweep.beta2_rule
    doc["candidates"] = candidate_rows(doc, fitted)
    doc["warnings"] = [f"{name}: {w}" for w in engine.size_warnings(fitted, params)]
    if target_loss is not None:
        if fitted.route != engine.ROUTE_B_CRIT:
            doc["warnings"].append(f"{name}: --target-loss needs the joint model's loss law, "
                                   "which a grid with an interior optimum does not use")
        else:
            model = fitted.model
            doc["target_loss"] = to_target_loss(model.fit, params, target_loss,
                                                [r["batch_size"] for r in doc["candidates"]],
                                                sweep.seq_len, doc["loss_given_up"])
    return doc


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
        optimizer: str | None = None, promise: Promise | None = None,
        target_loss: float | None = None, json_file: str | None = None,
        out: str | None = None, do_validate: bool = False, wandb_mode: str = "offline",
        project: str = "critbatch", resamples: int | None = None) -> dict:
    """Load the runs, answer (or validate), print, and write the report folder. `resamples`:
    the bootstrap's (None: the engine's, SMOKE_RESAMPLES at the smoke scale)."""
    t0 = time.perf_counter()
    promise = promise or Promise()
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
    scale = scale_of(loaded["runs"])
    smoke = scale == "smoke"
    resamples = refits_at(resamples, scale)
    lines: list[str] = []
    if do_validate:
        document = {"validation": {}, "warnings": warnings}
        docs, grids, cases = [], {}, {}
        for name, sweep in sweeps.items():
            if optimizer and name != optimizer:
                continue
            grids[name] = engine.grid_cells(sweep)
            cases[name] = engine.validate(grids[name], promise, sweep.seq_len, sweep,
                                          resamples,
                                          progress=lambda m, n=name: print(f"  {n}: {m}",
                                                                           flush=True))
            document["validation"][name] = {"cases": cases[name],
                                            "summary": engine.validation_summary(cases[name])}
            lines += validation_lines(name, cases[name]) + [""]
        validation_plot(cases, grids, out_dir / PLOT_FILE)
    else:
        size = target_params(sweeps, width, params)
        fitted = fit_all(sweeps, optimizer, promise, smoke, resamples=resamples)
        docs = [answer_for(name, f, sweeps[name], size, tokens, width, target_loss)
                for name, f in fitted.items()]
        docs.sort(key=lambda d: math.inf if d.get("predicted_loss") is None
                  else d["predicted_loss"])
        document = {**docs[0], "others": docs[1:]}
        document["warnings"] = warnings + [w for d in docs for w in d["warnings"]]
        for doc in docs:
            lines += [*answer_lines(doc), text_table(*candidate_table(doc["candidates"])),
                      *target_lines(doc), ""]
        plot(docs, fitted, out_dir / PLOT_FILE)
    document = json_clean(document)
    write_json_atomic(out_dir / JSON_FILE, document)
    if json_file:
        write_json_atomic(Path(json_file), document)
    doc_warnings = list(dict.fromkeys(document.get("warnings", [])))
    text = "\n".join(lines + [f"warning: {w}" for w in doc_warnings])
    (out_dir / REPORT_FILE).write_text(markdown(inputs, docs, lines, doc_warnings,
                                                time.perf_counter() - t0))
    publish_report(out_dir, name="recommend", group=f"recommend-{out_dir.parent.name}",
                   mode=wandb_mode, project=project, config={"inputs": inputs},
                   images={"recommend": PLOT_FILE}, files=[REPORT_FILE, JSON_FILE, PLOT_FILE],
                   summary={k: document.get(k) for k in ("optimizer", "batch_size", "lr",
                                                          "predicted_loss", "verdict")})
    print(text)
    print(f"report: {out_dir / REPORT_FILE} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return document


def markdown(inputs: list[str], docs: list[dict], lines: list[str], warnings: list[str],
             elapsed_s: float) -> str:
    out = ["# Recommendation", "", f"From {', '.join(inputs)} ({elapsed_s:.1f} s).", "",
           "```", *lines, "```", ""]
    out += [f"![answer]({PLOT_FILE})", ""]
    if docs:
        m = docs[0]["model"]
        rows = [[k, fmt(v, ".4g") if isinstance(v, float) else str(v)]
                for k, v in m.items() if not isinstance(v, dict | list)]
        out += ["## The model", "", md_table(["", "value"], rows), ""]
    if warnings:
        out += ["## Warnings", "", *[f"- {w}" for w in warnings], ""]
    return "\n".join(out)
