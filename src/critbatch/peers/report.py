"""`make peers`: every public sweep read from its source's file, analysed and written up.

For each source: find the file (`sources.locate`: PEERS_DIR, else a sha256-checked download
pinned by commit), analyse it (`steplaw`, `zhang`), and write OUT/peers.md, OUT/peers.json,
the figures (`plots`), and with `docs` (`make docs-results`) the same page to docs/results/peers.md
with its figures beside it.
Step Law's grid also goes through critbatch's own table path (steplaw_table.csv in the
download cache, never beside the report: the grid has no license) to the joint model, for
B_crit(L) beside Kaplan's, and to the recommend of a user's sweep.
"""

from __future__ import annotations

import datetime
import os
import shutil
import sys
import time
from pathlib import Path

from critbatch.analysis.render import fmt, json_clean, md_table
from critbatch.peers import plots, steplaw, zhang
from critbatch.peers import recommend as peers_recommend
from critbatch.peers.sources import SOURCES, locate
from critbatch.peers.sources import cache_dir as default_cache
from critbatch.results.files import write_json_atomic, write_text_atomic
from critbatch.results.runs import short_revision
from critbatch.science.answer import Promise
from critbatch.science.intervals import central_percentiles

JSON_FILE = "peers.json"
REPORT_FILE = "peers.md"
TABLE_FILE = "steplaw_table.csv"


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


QUESTION = (1e9, 2e10)  # (params, tokens) asked through both doors: about Step Law's largest


def joint_on_table(runs: list[dict], folder: Path, cells_answer: dict) -> dict:
    """Step Law's runs through critbatch's table path and `bcrit.analyse`: the joint model's
    verdict and its B_crit(L) row (Kaplan's form); and `recommend --table`'s answer to
    QUESTION beside the `--peers` door's (`cells_answer`): one engine, one answer. The table is
    the grid re-expressed, so it goes to `folder`, the download cache, never to the report
    folder (which may lie inside a repository: the grid has no license)."""
    from critbatch.analysis.bcrit import bcrit, tables

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / TABLE_FILE
    tables.write_table(steplaw.table_rows(runs), path)
    loaded = tables.load_tables([path])
    fits = bcrit.analyse(loaded["runs"], **loaded["analyse_kwargs"])["fits"]
    joint = fits["joint"].get("adamw", {})
    row = next((k for k in fits["kaplan"] if k["method"] == "joint"), None)
    keep = ("verdict", "chi2_per_dof", "form", "b_small", "transition_power", "n_cells",
            "loss_alone", "log_loss_span")
    return {"table": str(path), "joint": {k: joint.get(k) for k in keep},
            "kaplan_joint": row, "doors": doors(loaded["runs"], cells_answer)}


def doors(table_runs: list[dict], peers_doc: dict) -> dict:
    """QUESTION through `recommend --table` (the runs read as a user's table) beside the
    `--peers` door's answer `peers_doc`: the batches and lrs, and whether they agree within 5%."""
    from critbatch.analysis.recommend import engine
    from critbatch.analysis.recommend.recommend import sized_sweeps

    sweep = sized_sweeps(table_runs, [])["adamw"]
    fitted = engine.fit(engine.grid_cells(sweep), Promise(), sweep.seq_len, sweep)
    table_doc = engine.answer(fitted, *QUESTION)
    keys = ("batch_size", "lr", "loss_optimal_batch", "loss_optimal_lr")
    table = {k: table_doc[k] for k in keys}
    peers = {k: peers_doc[k] for k in keys}
    return {"params": QUESTION[0], "tokens": QUESTION[1], "table": table, "peers": peers,
            "agree_within_5%": all(abs(table[k] / peers[k] - 1) <= 0.05 for k in keys)}


def run(peers_dir: str | None, out: str | Path, docs: str | Path | None = None,
        resamples: int = steplaw.BOOTSTRAP, cache: str | Path | None = None,
        joint: bool = True, answer_resamples: int | None = None) -> dict:
    """Analyse every source and write the report (`joint` False: without the joint model on
    Step Law's table, its slowest part; `resamples`: each law's cell resamples,
    `answer_resamples` each held-out answer's, None: the engine's); returns the JSON
    document."""
    t0 = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache) if cache else None
    progress("Step Law: locating the grid and its bootstrap file")
    grid = locate(SOURCES["steplaw"], peers_dir, cache_dir)
    boot = locate(SOURCES["steplaw_bootstrap"], peers_dir, cache_dir)
    progress(f"Step Law: cell optima, laws ({resamples} cell resamples) and the answer held "
             "out in turn")
    step = steplaw.analyse(grid, boot, resamples, progress=progress,
                           answer_resamples=answer_resamples)
    model = step.pop("model")
    step["table_path"] = {"joint": {}, "kaplan_joint": None, "doors": None}
    if joint:
        progress("Step Law: the joint model and recommend --table on critbatch's table of the "
                 "grid")
        cells_doc = peers_recommend.answer("steplaw", *QUESTION, Promise(), peers_dir,
                                           str(cache_dir) if cache_dir else None)
        step["table_path"] = joint_on_table(steplaw.read_runs(grid), cache_dir or
                                            default_cache(), cells_doc)
    progress("Zhang et al.: Pareto fits and the CBS law")
    z = zhang.analyse_zhang()
    progress("figures")
    runs = steplaw.read_runs(grid)
    shown = [(v["params"], v["tokens"]) for v in step["validation"]][:6]
    plots.lr_curves(runs, step["cells"], shown, out / plots.LR_CURVES)
    plots.laws(step, model, lambda n, d: steplaw.formula(step["published"], n, d),
               out / plots.LAWS)
    plots.zhang(z, out / plots.ZHANG)
    elapsed = time.perf_counter() - t0
    document = json_clean({"steplaw": step, "zhang": z, "provenance": provenance(
        grid, boot, peers_dir, elapsed, docs)})
    write_json_atomic(out / JSON_FILE, document)
    text = markdown(document)
    write_text_atomic(out / REPORT_FILE, text)
    if docs:
        docs = Path(docs)
        figures = docs.parent / "peers"
        figures.mkdir(parents=True, exist_ok=True)
        for name in (plots.LR_CURVES, plots.LAWS, plots.ZHANG):
            shutil.copyfile(out / name, figures / name)
        write_text_atomic(docs, text.replace("](steplaw_", "](peers/steplaw_")
                          .replace("](zhang_", "](peers/zhang_"))
    print(summary_lines(document))
    print(f"report: {out / REPORT_FILE}" + (f", {docs}" if docs else "")
          + f" ({elapsed:.0f} s)", flush=True)
    return document


def provenance(grid: Path, boot: Path, peers_dir, elapsed: float, docs=None) -> dict:
    rev = short_revision()
    return {"date": datetime.date.today().isoformat(), "git_revision": rev,
            "elapsed_s": elapsed, "load_average": os.getloadavg()[0],
            "command": ("make docs-results" if docs else "make peers")
            + (" PEERS_DIR=<a folder holding the pinned files>"
                                       if peers_dir else ""),
            "files": {s.key: {"url": s.url, "sha256": s.sha256, "license": s.license}
                      for s in (SOURCES["steplaw"], SOURCES["steplaw_bootstrap"])},
            "read_from": [str(grid), str(boot), str(zhang.table_path())]}


# ---------------------------------------------------------------------------------------------
# The page


def interval_text(entry: dict | None, key: str = "bootstrap", spec: str = ".3f") -> str:
    if not entry:
        return "-"
    lo, hi = entry.get(key) or (None, None)
    bounds = f" [{format(lo, spec)}, {format(hi, spec)}]" if lo is not None else ""
    return f"{format(entry['value'], spec)}{bounds}"


def overlaps(entry: dict | None, published: dict) -> str:
    if not entry or "bootstrap" not in entry:
        return "-"
    lo, hi = entry["bootstrap"]
    plo, phi = published["interval"]
    return "yes" if lo <= phi and plo <= hi else "**no**"


def exponent_rows(step: dict) -> list[list[str]]:
    pub = step["published"]
    forms, laws = step["steplaw_forms"], step["laws"]
    pairs = [("lr at B_opt: N exponent", forms["lr_at_b_opt"]["exponents"].get("N"),
              pub["lr_size_exponent"]),
             ("lr at B_opt: D exponent", forms["lr_at_b_opt"]["exponents"].get("D"),
              pub["lr_budget_exponent"]),
             ("B_opt (tokens): D exponent, D-only law",
              forms["b_opt_tokens"]["exponents"].get("D"), pub["batch_budget_exponent"]),
             ("B_opt: D exponent, law chosen held out (" + laws["b_opt"]["terms"] + ")",
              laws["b_opt"]["exponents"].get("D"), pub["batch_budget_exponent"])]
    rule = step.get("steplaw_rule") or {}
    keys = ("lr_size_exponent", "lr_budget_exponent", "batch_budget_exponent",
            "batch_budget_exponent")
    return [[name, interval_text(ours), interval_text(ours, "t"),
             f"{theirs['median']:.3f} [{theirs['interval'][0]:.3f}, "
             f"{theirs['interval'][1]:.3f}]", overlaps(ours, theirs),
             rule_text(rule.get(key))]
            for (name, ours, theirs), key in zip(pairs, keys, strict=True)]


def rule_text(entry: dict | None) -> str:
    if not entry:
        return "-"
    lo, hi = entry["interval"]
    return f"{entry['value']:.3f} [{lo:.3f}, {hi:.3f}]"


def held_out_terms_table(step: dict) -> str:
    rows = []
    for key, label in (("b_opt", "B_opt"), ("lr_at_b_opt", "lr at B_opt"),
                       ("lr", "lr*(B) at any batch")):
        law = step["laws"][key]
        for terms, s in law["held_out_rms_log"].items():
            rows.append([label, terms + (" (chosen)" if terms == law["terms"] else ""),
                         fmt(s["budget"], ".3f"), fmt(s["size"], ".3f"),
                         fmt(s["mean"], ".3f")])
    return md_table(["law", "terms", "held-out budgets", "held-out size", "mean"], rows)


def validation_table(step: dict) -> str:
    """Per held-out case: the answer a user gets (`recommend`, fitted without the case), its
    loss-optimal batch, and Step Law's formula, each scored on the case's own runs."""
    mark = {True: "yes", False: "**no**", None: "-"}
    rows = []
    for v in step["validation"]:
        a, m, o = v["answer"], v["measured"], v["loss_optimal_measured"]
        interval = ("-" if a["batch_low"] is None else
                    f"[{a['batch_low']:,.0f}, {a['batch_high']:,.0f}]")
        rows.append([v["case"], "critbatch: fastest within 10% compute",
                     f"{a['batch_size']:,.0f} {interval}",
                     f"{m['measured_largest_within']:,.0f}",
                     mark[m["checks"].get("interval_holds")],
                     mark[m["checks"].get("batch_within_a_doubling")],
                     f"{a['loss_given_up']:.4f}", f"{m['loss_given_up']:.4f}",
                     mark[m["checks"].get("promise_kept")],
                     f"{a['lr']:.2e}", f"{m['measured_lr']:.2e}"])
        rows.append(["", "critbatch: loss-optimal", f"{a['loss_optimal_batch']:,.0f}", "-",
                     "-", "-", "-", f"{o['loss_given_up']:.4f}", "-",
                     f"{a['loss_optimal_lr']:.2e}", f"{o['measured_lr']:.2e}"])
        f = v.get("formula")
        if f:
            rows.append(["", "Step Law's formula (aims at B_opt)", f"{f['batch_size']:,.0f}",
                         "-", "-", "-", "-", f"{f['loss_given_up']:.4f}", "-",
                         f"{f['lr']:.2e}", f"{f['measured_lr']:.2e}"])
    return md_table(["held out", "answer", "batch (seq) [95%]",
                     "measured largest within the promise", "interval holds it",
                     "within 2x of it", "promised loss given up", "measured loss given up",
                     "kept (within +0.004)", "lr", "measured best lr at that batch"], rows)


def validation_text(step: dict) -> str:
    """The held-out section's summary sentence."""
    s = step["validation_summary"]
    doors_doc = step["table_path"].get("doors")
    text = (f"Over the {s['promise_kept']['of']} cases the promise is kept (the measured loss "
            f"given up at most the promised one + 0.004 nats/token, the grid's noise) in "
            f"{s['promise_kept']['passed']}, the 95% interval holds the measured largest batch "
            f"within the promise in {s['interval_holds']['passed']}, and the batch lies within "
            f"a doubling of it in {s['batch_within_a_doubling']['passed']}. The loss-optimal "
            f"answer gives up a median {s['median_loss_optimal_given_up']:.4f} nats/token, "
            f"Step Law's formula {fmt(s['median_formula_given_up'], '.4f')}.")
    if doors_doc:
        t, p = doors_doc["table"], doors_doc["peers"]
        text += (f" The same question ({doors_doc['params']:.0e} params, "
                 f"{doors_doc['tokens']:.0e} tokens) through `recommend --table` (the grid "
                 f"as a user's table) and `recommend --peers steplaw`: batch "
                 f"{t['batch_size']:,.0f} and {p['batch_size']:,.0f} sequences, lr "
                 f"{t['lr']:.3g} and {p['lr']:.3g} ("
                 + ("the same answer" if doors_doc["agree_within_5%"] else
                    "**they differ by more than 5%**") + ").")
    return text


def zhang_table(z: dict) -> str:
    rows = [[s["label"], f"{s['s_min']:.0f}", f"{s['published_s_min']:.0f}",
             f"{100 * s['s_min_rel_diff']:+.2f}%", f"{s['e_min']:.4g}",
             f"{s['published_e_min']:.4g}", f"{100 * s['e_min_rel_diff']:+.2f}%",
             f"{s['cbs']:.0f}", f"{s['published_cbs']:.0f}", f"{s['b_crit']:.0f}"]
            for s in z["sizes"]]
    return md_table(["model", "S_min (steps)", "published", "diff", "E_min (seq)", "published",
                     "diff", "CBS (seq)", "published", "E_min/S_min (seq)"], rows)


def differences(step: dict) -> str:
    """Where critbatch and Step Law differ, with the numbers behind it."""
    laws, rule = step["laws"], step.get("steplaw_rule") or {}
    b_opt, lr = laws["b_opt"], laws["lr"]
    scores = b_opt["held_out_rms_log"]
    text = []
    if rule:
        text.append(
            f"Step Law's own rule as its repository states it (code/fit_tool.py, "
            "query_optimal_lr_bs_data: the runs within "
            f"{100 * rule['threshold']:.2f}% of their cell's best, {rule['runs']} here, pooled "
            "and resampled) applied to this public file gives the last column: its budget "
            f"exponent of the lr, {rule['lr_budget_exponent']['value']:.3f}, lies outside the "
            f"published interval, so the public file alone does not reproduce the published "
            f"{step['published']['lr_budget_exponent']['median']:.3f} (the paper reports about "
            f"3,700 models; the file holds {step['runs']:,} runs).")
    n_exp = b_opt["exponents"].get("N")
    if n_exp:
        text.append(
            f"The held-out test keeps a size term in B_opt (exponent {n_exp['value']:.2f}, "
            f"cell bootstrap [{n_exp['bootstrap'][0]:.2f}, {n_exp['bootstrap'][1]:.2f}]): "
            f"held-out error {scores['N+D']['mean']:.3f} e-folds with it, "
            f"{scores['D']['mean']:.3f} without (Step Law's D-only form).")
    elif "D" in b_opt["terms"]:
        text.append(
            f"The held-out test keeps B_opt in D alone, Step Law's form: a size term lowers "
            f"the held-out budgets' error ({scores['N+D']['budget']:.3f} e-folds against "
            f"{scores['D']['budget']:.3f}) but raises the held-out size's "
            f"({scores['N+D']['size']:.3f} against {scores['D']['size']:.3f}), and a "
            "recommendation for a larger model is a question of size.")
    full = (step.get("steplaw_forms") or {}).get("lr_with_budget")
    if "D" not in lr["terms"] and full:
        p = lr["exponents"]["B"]["value"]
        k = b_opt["exponents"]["D"]["value"]
        r = full["exponents"]["D"]
        text.append(
            f"At a fixed batch a budget term in the best lr is not detected: the law with it "
            f"gives lr ~ D^{r['value']:.3f} (cell bootstrap [{r['bootstrap'][0]:.3f}, "
            f"{r['bootstrap'][1]:.3f}]) and predicts held-out cells no better "
            f"({lr['held_out_rms_log']['B+N+D']['mean']:.3f} e-folds against "
            f"{lr['held_out_rms_log']['B+N']['mean']:.3f}), so it is dropped; the lr's budget "
            f"exponent at B_opt comes mostly through the batch: lr ~ B^{p:.2f} and B_opt ~ "
            f"D^{k:.2f} give D^{p * k:.2f}.")
    return " ".join(text)


def joint_text(joint: dict, kaplan: dict) -> str:
    """The paragraph on the joint model's B_crit(L) beside Kaplan's."""
    if not joint:
        return "(The joint model was not run.)"
    return (
        f"The grid as a critbatch table (`critbatch-fit --table {TABLE_FILE}`, written to the "
        f"download cache): the joint model over {joint.get('n_cells')} best-lr cells fits "
        f"B_crit(L) = B* / L^{fmt(kaplan.get('exponent'), '.1f')} "
        f"[{fmt(kaplan.get('exponent_low'), '.1f')}, {fmt(kaplan.get('exponent_high'), '.1f')}]"
        f" with B* = {fmt(kaplan.get('b_star_tokens'), '.3g')} tokens, chi2/dof "
        f"{fmt(joint.get('chi2_per_dof'), '.0f')}, verdict {joint.get('verdict')}; Kaplan et al. "
        "2020: B* ~ 2e8 tokens, 1/alpha_B ~ 4.8 (WebText2 nats, losses 2-6). Units differ "
        "(StepFun's tokenizer and corpus against WebText2), and the grid spans a loss range "
        f"of only {fmt(joint.get('log_loss_span'), '.2f')} e-folds, where a power of L is "
        "barely measured. The joint model assumes B_crit depends on the loss alone; "
        + ("its loss-alone test rejects that here (per-size exponents "
           + ", ".join(f"{x:.0f}" for x in (joint.get("loss_alone") or {}).get(
               "per_width_exponents", [])) + "): on this grid the batch follows the budget "
           "and size (the B_opt law above) more than the loss."
           if (joint.get("loss_alone") or {}).get("holds") is False else
           "its loss-alone test does not reject that here."))


def markdown(doc: dict) -> str:
    step, z, prov = doc["steplaw"], doc["zhang"], doc["provenance"]
    laws = step["laws"]
    lr_law = laws["lr"]
    kaplan = step["table_path"]["kaplan_joint"] or {}
    joint = step["table_path"]["joint"]
    cbs, bcrit_law = z["cbs_law"], z["b_crit_law"]
    loss = laws["loss"] or {}
    lines = [
        "# critbatch on public sweeps",
        "",
        f"Generated by `{prov['command']}` on {prov['date']} (revision {prov['git_revision']}, "
        f"{prov['elapsed_s']:.0f} s, load average {prov['load_average']:.1f}). Every number "
        "below comes from the sources' own files, read unchanged (sha256 in peers.json); "
        "intervals are 95%.",
        "",
        *summary_section(doc),
        "## Step Law (Li et al. 2025): the dense grid",
        "",
        f"{step['runs']} runs, {len(step['cells'])} (N, D) cells: 215M-1.07B non-embedding "
        "parameters, 4B-100B tokens, about 10 batch sizes x 12 peak lrs each; losses are the "
        "smoothed end of training (nats/token on StepFun's corpus and tokenizer: comparable "
        "within the grid only). Batches are sequences of 2,048 tokens.",
        "",
        "How critbatch reads a cell: per batch, the best lr is the vertex of a parabola in "
        "ln lr through the grid minimum and its neighbours; the loss-optimal batch B_opt is "
        "the same vertex in ln B over the batches' best losses; the lr at B_opt is read off a "
        "line in ln B through the lr optima of the five grid batches nearest it. Step Law "
        "instead pools every run within 0.25% of its cell's best loss and fits those runs. "
        "Intervals: critbatch's are a bootstrap over the cells (the unit its laws are fitted "
        f"to, {laws['b_opt']['resamples']} resamples) beside the OLS t interval; Step Law's "
        "the {:g}-{:g} percentiles".format(*central_percentiles())
        + f" of its {step['published']['resamples']} bootstrap fits.",
        "",
        "### Exponents, like with like",
        "",
        md_table(["quantity", "critbatch (cell bootstrap)", "critbatch (t)",
                  "Step Law median [95%]", "intervals overlap",
                  "Step Law's rule on this file"], exponent_rows(step)),
        "",
        differences(step),
        "",
        "### Which terms each law keeps (held-out prediction)",
        "",
        "Every subset of the ln N and ln D terms is fitted with a fold held out: each size's "
        "largest budget (held-out budgets), and the largest model (held-out size). The "
        "subset with the lowest root-mean-square error of the logged quantity, the mean of the "
        "two kinds of fold (a new budget and a new size weigh the same), is kept, each term "
        "having to lower it by 5%. Errors are in e-folds (0.1 is about 10%).",
        "",
        held_out_terms_table(step),
        "",
        f"The lr at any batch, lr*(B) ~ B^{lr_law['exponents']['B']['value']:.2f}"
        + "".join(f" {c}^{e['value']:.2f}" for c, e in lr_law["exponents"].items() if c != "B")
        + f", keeps {lr_law['terms']}: "
        + ("a budget term at a given batch is not detected (above), and Step Law's D "
           "exponent in the lr comes mostly through the loss-optimal batch growing with D."
           if "D" not in lr_law["terms"] else "at a given batch the best lr still grows with "
           "the budget.")
        + " The loss at B_opt: "
        + (f"L* = {loss['e']:.3f} + {loss['a']:.3f} (N/1e8)^-{loss['alpha']:.3f} + "
           f"{loss['b']:.3f} (D/1e10)^-{loss['beta']:.3f} (residual sd "
           f"{loss['residual_sd']:.4f} nats/token)" if loss else "not fitted")
        + ".",
        "",
        "### The answer held out in turn",
        "",
        "What a user gets from `critbatch-recommend` (any door: this grid through `--peers`, "
        "or as their own table through `--table`), fitted without the held-out cells, for "
        "the held-out (N, D), with the default promise: the largest batch costing at most "
        "10% more compute than the loss-optimal one. That promise, in nats/token, is "
        "L*(N, D/1.1) - L*(N, D) from the loss law above. Each answer is scored on the "
        "held-out cell's own runs: its loss at the answer's (batch, lr), read off the grid "
        "(linear in ln lr within each batch, then in ln B), above the cell's best run. The "
        "measured largest batch within the promise is where the cell's profile (each "
        "batch's best run) crosses its best + the promised loss. The measured best lr at a "
        "batch interpolates the nearest batches' lr optima. Step Law's formula was fitted on "
        "every cell, these included, and aims at the loss-optimal batch.",
        "",
        validation_table(step),
        "",
        validation_text(step),
        "",
        "![loss against lr](steplaw_loss_vs_lr.png)",
        "",
        f"*{plots.CAPTIONS[plots.LR_CURVES]}*",
        "",
        "![laws](steplaw_laws.png)",
        "",
        f"*{plots.CAPTIONS[plots.LAWS]}*",
        "",
        "### B_crit(L) from the joint model, beside Kaplan's",
        "",
        joint_text(joint, kaplan),
        "",
        "## Zhang et al. 2025: steps to a target loss",
        "",
        "Steps to reach a C4 validation loss per model and batch (sequences of 512 tokens), "
        "fitted per model as S = S_min + E_min / B by critbatch's Pareto fit (the "
        "`--table` path; the rows are vendored under their MIT license).",
        "",
        zhang_table(z),
        "",
        f"CBS(N) = d N_M^beta with their CBS (0.2 E_min/S_min + {zhang.CBS_OFFSET} sequences, "
        f"the rule that reproduces their printed numbers): beta = {cbs['beta']:.3f}, t "
        f"interval [{cbs['beta_t_low']:.3f}, {cbs['beta_t_high']:.3f}] (3 dof), residual "
        f"bootstrap [{cbs['beta_boot_low']:.3f}, {cbs['beta_boot_high']:.3f}]; published "
        f"{cbs['published_beta']:.3f}. Without the offset, B_crit = E_min/S_min (McCandlish's "
        f"definition; the 20% token-overhead rule's CBS is a fifth of it) grows as N^"
        f"{bcrit_law['beta']:.3f} [{bcrit_law['beta_boot_low']:.3f}, "
        f"{bcrit_law['beta_boot_high']:.3f}]: the published 0.468 rests on the constant "
        "307.2-sequence offset, which flattens the law.",
        "",
        "![Zhang CBS](zhang_cbs.png)",
        "",
        f"*{plots.CAPTIONS[plots.ZHANG]}*",
        "",
    ]
    return "\n".join(lines)


def summary_section(doc: dict) -> list[str]:
    """The page's opening: what agrees with the papers, what does not, what to take."""
    step, z = doc["steplaw"], doc["zhang"]
    rows = exponent_rows(step)
    agree = [r[0] for r in rows if r[4] == "yes"]
    pub, rule = step["published"], step.get("steplaw_rule") or {}
    off = [(name, rule[key]["value"], pub[key]["interval"]) for name, key in (
        ("the lr's size exponent", "lr_size_exponent"),
        ("the lr's budget exponent", "lr_budget_exponent"),
        ("B_opt's budget exponent", "batch_budget_exponent"))
        if rule.get(key) and not pub[key]["interval"][0] <= rule[key]["value"]
        <= pub[key]["interval"][1]]
    v = step["validation_summary"]
    cbs = z["cbs_law"]
    worst = max(max(abs(s["s_min_rel_diff"]), abs(s["e_min_rel_diff"])) for s in z["sizes"])
    holds = cbs["beta_boot_low"] <= cbs["published_beta"] <= cbs["beta_boot_high"]
    lines = ["## Summary", "",
             f"- **What agrees.** critbatch's intervals, fitted from the public file, overlap "
             f"Step Law's published ones in {len(agree)} of the {len(rows)} comparisons below. "
             "Zhang et al.'s S_min and E_min per model are reproduced within "
             f"{100 * worst:.2f}%, and their CBS exponent {cbs['beta']:.3f} "
             f"[{cbs['beta_boot_low']:.3f}, {cbs['beta_boot_high']:.3f}] "
             + ("holds" if holds else "does not hold")
             + f" the published {cbs['published_beta']:.3f}."]
    if off:
        lines.append("- **What does not.** Step Law's own selection rule applied to this public "
                     "file gives " + "; ".join(
                         f"{name} {value:.3f}, outside the published [{lo:.3f}, {hi:.3f}]"
                         for name, value, (lo, hi) in off)
                     + ": the public file alone does not reproduce it (it holds "
                     f"{step['runs']:,} runs of the paper's larger set). Zhang et al.'s CBS "
                     f"law rests on a constant offset: without it B_crit grows as N^"
                     f"{z['b_crit_law']['beta']:.3f}.")
    lines += [f"- **What to take from it.** Asked for each held-out budget and size, "
              f"`make recommend PEERS=steplaw` kept its promise (at most 10% more compute) in "
              f"{v['promise_kept']['passed']} of {v['promise_kept']['of']} cases and its "
              f"interval held the measured batch in {v['interval_holds']['passed']} of "
              f"{v['interval_holds']['of']}; its loss-optimal answer gave up a median "
              f"{v['median_loss_optimal_given_up']:.4f} nats/token, Step Law's formula "
              f"{fmt(v['median_formula_given_up'], '.4f')}. Batch and lr carry over to "
              "another corpus better than the loss does: use the grid for the batch and lr of a "
              "run near its sizes (215M-1.07B parameters, 4B-100B tokens), and a sweep of "
              "your own for anything else.", ""]
    return lines


def summary_lines(doc: dict) -> str:
    step = doc["steplaw"]
    rows = exponent_rows(step)
    out = ["Step Law: critbatch [cell bootstrap] against Step Law's bootstrap:"]
    out += [f"  {r[0]}: {r[1]} vs {r[3]} (overlap: {r[4]})" for r in rows]
    v = step["validation_summary"]
    out.append(f"  held out in turn: promise kept in {v['promise_kept']['passed']} of "
               f"{v['promise_kept']['of']}, interval holds the measured batch in "
               f"{v['interval_holds']['passed']}; loss-optimal answer gives up a median "
               f"{v['median_loss_optimal_given_up']:.4f} nats/token, Step Law's formula "
               f"{fmt(v['median_formula_given_up'], '.4f')}")
    cbs = doc["zhang"]["cbs_law"]
    worst = max(max(abs(s["s_min_rel_diff"]), abs(s["e_min_rel_diff"]))
                for s in doc["zhang"]["sizes"])
    out.append(f"Zhang: S_min and E_min within {100 * worst:.2f}% of published; CBS beta "
               f"{cbs['beta']:.3f} [{cbs['beta_boot_low']:.3f}, {cbs['beta_boot_high']:.3f}] "
               f"vs {cbs['published_beta']:.3f}")
    return "\n".join(out)
