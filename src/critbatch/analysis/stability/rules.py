"""The stability study's stages, thresholds and rules: the numbers the verdicts use and the
sentences that state them (in report.md and stability.json).

Batch sizes in sequences, steps are optimizer steps, differences of train losses relative
(|accum - plain| / |plain|).
"""

LR_STAGE, BATCH_STAGE, ACCUM_STAGE = "stability_lr", "stability", "stability_accum"
STAGES = (LR_STAGE, BATCH_STAGE, ACCUM_STAGE)

TAIL_STEPS = 100  # steps in the tail window (the last half of a run planned shorter than 200)
UNSTABLE_RATIO = 3.0  # a tail statistic this many times the reference's is "unstable"
UNSTABLE_CV_FLOOR = 0.1  # ... when the grad-norm CV itself is at least this
TAIL_SPIKE_RATIO = 5.0  # a tail grad norm above this x the tail's median is a spike: unstable
SPIKE_FACTOR = 10.0  # whole run: steps whose grad norm exceeds this x the run's median (counted)
ACCUM_FIRST_STEPS = 10  # steps over which accumulation must match the plain batch
# relative train-loss difference allowed over those steps (fp32): 1e-5 failed on a 2-vCPU
# AMD EPYC at smoke scale (one optimizer 1.2e-5, the other 2.0e-7; 2026-12-02)
ACCUM_TOLERANCE = 1e-4
# ... and under autocast, whose rounding is coarser (bf16 keeps 8 bits of mantissa)
ACCUM_TOLERANCE_BY_DTYPE = {"float32": ACCUM_TOLERANCE, "float16": 1e-3, "bfloat16": 1e-2}
ACCUM_DEVIATION = 1e-4  # "the curves separate": the first step whose difference exceeds this
LR_RTOL = 1e-6  # relative tolerance when comparing learning rates read back from JSON

VERDICTS = ("stable", "unstable", "diverged")
MATCHES, DIFFERS, NO_PLAIN, NOT_COMPARABLE = (
    "matches to float tolerance", "differs beyond float tolerance", "no plain run",
    "not comparable")

RULES = {
    "tail_window": (
        f"the last {TAIL_STEPS} steps of a run, or the last half of the steps planned when a run "
        f"plans fewer than {2 * TAIL_STEPS}; a run that stopped early uses its last rows, up to "
        "that many; means and variances over the tail are population ones (divided by n)"),
    "diverged": (
        "the trainer stopped the run (status diverged), or a train loss, a grad norm or the final "
        "validation loss is non-finite, or the mean train loss over the tail is above the "
        "first step's train loss"),
    "unstable": (
        f"not diverged, and: a tail grad norm is above {TAIL_SPIKE_RATIO:g}x the tail's median "
        "(a spike); or, against the reference (the group's first run at the base batch that did "
        f"not diverge), the tail's grad-norm coefficient of variation CV = std/mean, scaled by "
        f"sqrt(B / B_ref) as sampling noise predicts, is above {UNSTABLE_RATIO:g}x the "
        f"reference's (and the CV above {UNSTABLE_CV_FLOOR:g}), or the tail's loss noise B x Var "
        f"is above {UNSTABLE_RATIO:g}x the reference's (Var: variance of the train loss around a "
        "parabola fitted over the tail, B the batch in sequences)"),
    "stable": "neither diverged nor unstable",
    "accumulation": (
        f"{MATCHES} when the largest relative train-loss difference |accum - plain| / |plain| "
        f"over the first {ACCUM_FIRST_STEPS} steps is below {ACCUM_TOLERANCE:g} in float32 "
        f"(float16 {ACCUM_TOLERANCE_BY_DTYPE['float16']:g}, bfloat16 "
        f"{ACCUM_TOLERANCE_BY_DTYPE['bfloat16']:g}); else "
        f"{DIFFERS}. The plain run has the same optimizer, model, data, seed, batch size and lr "
        "used (stage stability first, then stability_lr; the same lr_scaling preferred)"),
}
THRESHOLDS = {
    "tail_steps": TAIL_STEPS, "unstable_ratio": UNSTABLE_RATIO,
    "unstable_cv_floor": UNSTABLE_CV_FLOOR, "tail_spike_ratio": TAIL_SPIKE_RATIO,
    "spike_factor": SPIKE_FACTOR,
    "accum_first_steps": ACCUM_FIRST_STEPS, "accum_tolerance": ACCUM_TOLERANCE,
    "accum_deviation": ACCUM_DEVIATION,
}
WHY_UNSTABLE = (
    "Why these statistics: a smaller batch is noisier by construction (Var(g_B) = Var(g_1)/B), "
    "and that alone is not instability. When sampling noise dominates the gradient, |g_B|^2 "
    "~ (1/B^2) sum_i |g_i|^2 + cross terms, whose relative spread falls as 1/sqrt(B): the "
    "grad-norm CV of a stable run grows as sqrt(B_ref/B) below the reference. So the CV is "
    "compared after that scaling, and only an excess beyond it -- or a spike several times the "
    "tail's median -- says oscillation rather than the expected noise. A step's train loss "
    "averages B independent sequences, so its sampling variance is Var_1/B and B x Var is the "
    "same at every batch size for a stable run; "
    "the fitted parabola is removed first because a loss that is still falling is a trend, "
    "not noise. Caveat: B x Var assumes the spread of the per-sequence losses is alike at every "
    "batch size, which holds when the runs reach similar losses; a run far behind the "
    "reference (near initialisation every sequence's loss is close to ln V) shows less noise, "
    "so there the rule errs toward 'stable'.")
