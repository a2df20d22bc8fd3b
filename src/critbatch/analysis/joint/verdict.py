"""The joint model's verdict (`analysis.joint.joint`'s document in, a verdict out): every check
it rests on (`checks_of`), the held-out sets' test (`passes`, `agrees`), the range check's
(`leans_on_extrapolation`) and the verdict itself (`decide`). Reads documents only: a
fits.json from before a check was recorded is judged by the checks it has.
"""

from __future__ import annotations

HELD_OUT_SIGMAS = 2.0  # a held-out cell "agrees" within this many seed sigmas
HELD_OUT_SHARE = 0.8  # of a held-out set that must agree for the law to count as predictive
# "resolved" estimates "1/alpha_B is known to +-0.5": a 95% interval at most 1 wide, held-out
# cells predicted, no shift beyond its own noise without the extrapolated cells. Its error
# rates on planted worlds are in docs/science.md ("A verdict is an estimator too")
RESOLVED_WIDTH = 1.0
RANGE_SHIFT_SIGMAS = 3.0  # a range-check shift beyond this many of its own sds: the law leans
RESOLVED, UNRESOLVED = "resolved", "unresolved"


def passes(held: dict) -> bool:
    """The verdict's test of a held-out set: at least HELD_OUT_SHARE of its cells within
    HELD_OUT_SIGMAS seed sigmas, or, where the refit's own spread was measured (only where
    the seed sigmas miss), within HELD_OUT_SIGMAS predictive sigmas: a refit on fewer cells
    predicts less precisely, and its miss is judged against that."""
    if held.get("cannot"):
        return False
    need = HELD_OUT_SHARE * held["n_cells"]
    predictive = held.get("within_2_predictive_sigma")
    return held["within_2_sigma"] >= need or (predictive is not None and predictive >= need)


def agrees(row: dict, key: str = "residual_sigmas") -> bool:
    """A held-out cell within HELD_OUT_SIGMAS of its prediction (`key`: in seed sigmas, or
    in the predictive sigma that adds the refit's own spread); an upper-bound cell agrees
    unless it lies that far below the prediction (a bound above it says nothing)."""
    z = row.get(key)
    if z is None:
        return False
    return z >= -HELD_OUT_SIGMAS if row.get("upper_bound") else abs(z) <= HELD_OUT_SIGMAS


def leans_on_extrapolation(doc: dict) -> str | None:
    """Why the law is not robust to leaving out the cells above the baseline's loss range,
    or None: their refit's exponent moved more than RANGE_SHIFT_SIGMAS of the shift's own
    sd (`range_check`). A fits.json from before that sd judges the refit against the full
    fit's interval, as it was written."""
    check, low, high = doc.get("above_baseline_range"), doc.get("exponent_low"), doc.get(
        "exponent_high")
    if not check or check.get("exponent") is None:
        return None
    z = check.get("shift_sigmas")
    if "shift_sigmas" in check:
        if z is None or abs(z) <= RANGE_SHIFT_SIGMAS:
            return None
        return (f"without the {check['n_cells']} cell(s) above the baseline's loss range "
                f"1/alpha_B is {check['exponent']:.2f}, {abs(z):.1f} sd of the shift away "
                f"(more than {RANGE_SHIFT_SIGMAS:g})")
    if low is None or high is None or low <= check["exponent"] <= high:
        return None
    return (f"without the {check['n_cells']} cell(s) above the baseline's loss range "
            f"1/alpha_B is {check['exponent']:.2f}, outside its interval")


PASS, FAIL, CANNOT = "pass", "fail", "cannot be formed"


def checks_of(doc: dict) -> list[dict]:
    """Every check the verdict rests on, each {"check", "status" (PASS, FAIL or CANNOT),
    "detail"}: the interval's width, chi2/dof and the largest residual against
    their simulated ranges (`science.joint_inference.chi2_range`), parameters on a fitting
    bound, the loss-alone
    test (several widths), each held-out prediction, the range check and, with two draws,
    whether the misfit is the model's own error. A fits.json from before a check was
    recorded skips it; a check that could not be made is CANNOT, never a pass."""
    out = []

    def add(check: str, status: str, detail: str = "") -> None:
        out.append({"check": check, "status": status, "detail": detail})

    low, high = doc.get("exponent_low"), doc.get("exponent_high")
    if low is None or high is None:
        add("interval", CANNOT, f"no interval ({doc.get('interval', 'none')})")
    elif high - low > RESOLVED_WIDTH:
        add("interval", FAIL, f"1/alpha_B's 95% interval [{low:.2f}, {high:.2f}] is wider "
                              f"than {RESOLVED_WIDTH:g}")
    else:
        add("interval", PASS)
    fit_range = doc.get("chi2_range")
    if fit_range is not None:
        if fit_range.get("holds") is None:
            add("chi2/dof", CANNOT, "no degrees of freedom left to judge the fit by")
        elif fit_range["holds"]:
            add("chi2/dof", PASS)
        else:
            add("chi2/dof", FAIL, f"chi2/dof {fit_range['chi2_per_dof']:.2f} is above the "
                                  f"{fit_range['high']:.2f} the noise alone reaches in 97.5% "
                                  f"of draws (p {fit_range['p_value']:.3g})")
        if "largest_residual_holds" in fit_range:
            if fit_range["largest_residual_holds"]:
                add("largest residual", PASS)
            else:
                add("largest residual", FAIL,
                    f"a cell lies {fit_range['largest_residual']:.1f} seed sigmas from the "
                    f"model, beyond the {fit_range['largest_residual_high']:.1f} the noise "
                    f"alone reaches in 97.5% of draws (p {fit_range['largest_residual_p']:.3g}):"
                    " a heavier tail than the noise model's, or a cell the law misses")
    bounds = doc.get("at_bounds")
    if bounds is not None:
        if bounds:
            add("bounds", FAIL, f"{', '.join(bounds)} on its fitting bound: the interval is "
                                "conditional on it")
        else:
            add("bounds", PASS)
    test = doc.get("loss_alone")
    if test is not None:
        if test.get("holds") is None:
            add("loss alone", CANNOT, "the per-width fit could not be made")
        elif test["holds"]:
            add("loss alone", PASS)
        else:
            add("loss alone", FAIL, f"B_crit does not depend on the loss alone across widths "
                                    f"(p {test['p_value']:.3g})")
    for held in doc.get("held_out", []):
        name = f"held out {held['held_out']}"
        if held.get("cannot"):
            add(name, CANNOT, held["cannot"])
        elif held.get("refit_failed"):
            add(name, CANNOT, f"the refit failed ({held['refit_failed']})")
        elif passes(held):
            add(name, PASS)
        else:
            add(name, FAIL, f"{held['within_2_sigma']} of {held['n_cells']} cells within "
                            f"{HELD_OUT_SIGMAS:g} sigma")
    leans = leans_on_extrapolation(doc)
    if leans:
        add("range check", FAIL, leans)
    draws = doc.get("draws")
    if draws:
        from critbatch.science.replicates import NOISE

        if draws.get("verdict") == NOISE:
            add("two draws", PASS)
        else:
            add("two draws", FAIL, draws.get("sentence") or str(draws.get("verdict")))
    return out


def decide(doc: dict) -> dict:
    """The verdict as data: `verdict` RESOLVED where the law is known to about +-0.5 and
    every check holds (`checks_of`: a 95% interval at most RESOLVED_WIDTH wide, chi2/dof in
    its range, no parameter on a bound, B_crit a law of the loss alone, every held-out set
    predicted, no range-check shift beyond its own noise, and with two draws no model
    error), else UNRESOLVED; `reasons` names each failing check in one short sentence, a
    check that could not be made as "cannot check ..." (empty when resolved); `checks` all
    of them."""
    checks = checks_of(doc)
    reasons = [c["detail"] if c["status"] == FAIL else f"cannot check {c['check']}: {c['detail']}"
               for c in checks if c["status"] in (FAIL, CANNOT)]
    return {"verdict": UNRESOLVED if reasons else RESOLVED, "reasons": reasons,
            "checks": checks}
