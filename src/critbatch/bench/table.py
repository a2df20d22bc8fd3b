"""The benchmark's targets (met / not met, from the measured figures) and its markdown table,
for `python -m critbatch.bench`."""

from __future__ import annotations


def targets(results: dict, device_type: str) -> list[dict]:
    """The speed targets critbatch holds itself to, each with the measured figure and met
    (True/False; None if the section did not run here or its figure is noise)."""
    rows = []

    def add(target: str, value: float | None, goal: str, met: bool | None) -> None:
        rows.append({"target": target, "measured": value, "goal": goal, "met": met})

    def cost_met(percent: float | None, limit: float) -> bool | None:
        """A cost far below zero is noise (the machine was busy), not a met target."""
        if percent is None or percent < -limit:
            return None
        return percent <= limit

    trained = results.get("train", {}).get("presets", {})
    main = "cpu" if device_type == "cpu" else "gpu"
    over = trained.get(main, {}).get("overhead_percent")
    add(f"trainer overhead vs minimal eager loop ({main} preset), %", over, "<= 5",
        cost_met(over, 5))
    data = results.get("data")
    ratio = min((r["ratio"] for r in data.values()), default=None) if data else None
    add("data path speed / training step speed (slowest preset), x", ratio, ">= 20",
        None if ratio is None else ratio >= 20)
    gns = results.get("gns", {}).get("overhead_percent")
    add("online noise tracking cost, % of tokens/s", gns, "< 3", cost_met(gns, 3))
    analysis = results.get("analysis", {}).get("total_s")
    add("analysis of 1,000 synthetic runs, s", analysis, "< 10",
        None if analysis is None else analysis < 10)
    table = results.get("analysis", {}).get("table", {})
    for name in ("fit_bcrit", "recommend"):
        seconds = table.get(name, {}).get("seconds")
        add(f"{name} --table on {table.get('rows', 2000):,} generated rows, s", seconds,
            "< 30", None if seconds is None else seconds < 30)
    if device_type == "cpu":
        value = trained.get("cpu-w256", {}).get("mfu")
        add("CPU MFU at width 256 vs measured fp32 peak, %",
            None if value is None else 100 * value, ">= 50 (goal)",
            None if value is None else value >= 0.5)
        add("GPU MFU at width 384 vs bf16 peak, %", None, ">= 40 (goal)", None)
    else:
        value = trained.get("gpu-w384", {}).get("mfu")
        add("GPU MFU at width 384 vs bf16 peak (compile), %",
            None if value is None else 100 * value, ">= 40 (goal)",
            None if value is None else value >= 0.4)
    share = results.get("share", {}).get("layouts", [])
    best = max((x["speedup"] for x in share), default=None) if device_type == "cuda" else None
    add("GPU aggregate speed-up from sharing the card among small jobs, x", best, ">= 2",
        None if best is None else best >= 2)
    return rows


def table(results: dict) -> str:
    """The results as markdown: the per-preset table, the variants, the single figures."""
    meta = results["meta"]
    lines = [f"Device: {meta['device']} ({meta['device_type']}, {meta['threads']} torch threads), "
             f"torch {meta['torch']}, {meta['date']}", ""]
    peak = results.get("peak")
    if peak:
        lines += [f"Peak (large matmul): {peak['float32_gflops']:,.0f} GFLOP/s fp32, "
                  f"{peak['bfloat16_gflops']:,.1f} GFLOP/s bf16 (largest n measured: "
                  f"{max(map(int, peak['float32_by_size']))} fp32, "
                  f"{max(map(int, peak['bfloat16_by_size']))} bf16)", ""]
    trained = results.get("train", {}).get("presets", {})
    if trained:
        lines += ["| preset | width x depth, T, B | params | tokens/s trainer | tokens/s minimal "
                  "loop | overhead | step ms: data | fwd+bwd | optimizer | noise | logging | MFU |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in trained.items():
            noise = f"{r['noise_ms']:.2f}" + ("" if r["noise_counted"] else " (off)")
            mfu_text = f"{100 * r['mfu']:.1f}% {r['dtype']}" if "mfu" in r else "-"
            lines.append(
                f"| {name} | {r['width']}x{r['depth']}, {r['seq_len']}, {r['batch_size']} | "
                f"{r['params'] / 1e6:.2f}M | {r['tokens_per_s']:,.0f} | "
                f"{r['minimal_tokens_per_s']:,.0f} | {r['overhead_percent']:+.1f}% | "
                f"{r['data_ms']:.2f} | {r['fwd_bwd_ms']:.1f} | {r['optimizer_ms']:.2f} | "
                f"{noise} | {r['logging_ms']:.3f} | {mfu_text} |")
        lines.append("")
    variants = results.get("variants")
    if variants:
        lines += ["| preset | variant | A | B | B / A |", "|---|---|---|---|---|"]
        for name, pairs in variants.items():
            for pair, timed in pairs.items():
                if "skipped" in timed:
                    lines.append(f"| {name} | {pair} | skipped: {timed['skipped']} | | |")
                    continue
                a, b = [k for k in timed if k not in ("ratio", "compared")]
                key = timed["compared"]
                what = "optimizer ms" if key == "optim_ms" else "step ms"
                lines.append(f"| {name} | {pair} ({what}) | {a} {timed[a][key]:.2f} | "
                             f"{b} {timed[b][key]:.2f} | {timed['ratio']:.2f} |")
        lines.append("")
    data = results.get("data")
    if data:
        lines.append("Data path: " + "; ".join(
            f"{n} {r['batches_per_s']:,.0f} batches/s ({r['ratio']:,.0f}x the step)"
            for n, r in data.items()))
    if "analysis" in results:
        a = results["analysis"]
        lines.append(f"Analysis: {a['n_runs']} synthetic runs in {a['total_s']:.2f} s "
                     f"(load {a['load_s']:.2f} s, analyse {a['analyse_s']:.2f} s)")
        table = a.get("table", {})
        lines += [f"Analysis: {name} --table on {table['rows']:,} generated rows in "
                  f"{table[name]['seconds']:.1f} s ({table[name]['rows_per_s']:,.0f} rows/s)"
                  for name in ("fit_bcrit", "recommend") if name in table]
    if "share" in results:
        sh = results["share"]
        lines.append(f"Jobs sharing the device ({sh['preset']} preset, trainer): " + "; ".join(
            f"{x['jobs']} x {x['threads_per_job'] or 'default'} threads "
            f"{x['aggregate_tokens_per_s']:,.0f} tokens/s ({x['speedup']:.2f}x)"
            for x in sh["layouts"]))
    if "gns" in results:
        g = results["gns"]
        lines.append(f"Online noise tracking (4 micro-batches, width 128): "
                     f"{g['overhead_percent']:.2f}% of tokens/s")
    lines += ["", "| target | measured | goal | met |", "|---|---|---|---|"]
    for t in results.get("targets", []):
        value = "not measured" if t["measured"] is None else f"{t['measured']:,.2f}"
        met = {True: "met", False: "not met", None: "-"}[t["met"]]
        lines.append(f"| {t['target']} | {value} | {t['goal']} | {met} |")
    return "\n".join(lines)


