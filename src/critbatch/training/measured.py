"""The measured local critical batch that `train.batch_schedule=measured` follows.

A local-CBS report (`make sweep-local-cbs`, analysis/local_cbs.py) writes `fits.json`, whose
`local_cbs` rows give, per optimizer and checkpoint, the tokens trained and the local
critical batch `b_crit` (sequences) measured there by branched training. The curve a run
follows is its optimizer's rows (and its lr rule's, when the file records one) as
(tokens, b_crit) points; `science.rules.log_interp` reads it between them.

The file is read once, when a run starts; the points are kept in the run's checkpoint and
summary.json (`measured_curve`), and a resumed run follows its stored copy, so a report
written again later does not change a run half-way.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from critbatch.results.errors import ConfigError


def read_curve(fits: str | None, optimizer: str, lr_scaling: str, scale: str) -> list[list[float]]:
    """[[tokens, b_crit (sequences)], ...] ascending in tokens, from the report at `fits`
    (a relative path is taken from the working directory, like `runs/`).

    Rows of `optimizer` whose `lr_scaling` is `lr_scaling` (rows without one, from a report
    written before it was recorded, match any). Raises ConfigError, one line, when the file
    is missing or unreadable or has no usable row for this run.
    """
    fix = f"run make sweep-local-cbs SCALE={scale} first, or set train.measured.fits"
    if not fits:
        raise ConfigError("train.batch_schedule=measured needs train.measured.fits, a local-CBS "
                          f"report's fits.json; {fix}")
    path = Path(fits).expanduser()
    try:
        rows = json.loads(path.read_text())["local_cbs"]
        if not isinstance(rows, list):
            raise TypeError("local_cbs is not a list")
    except FileNotFoundError:
        raise ConfigError(f"train.measured.fits={fits} does not exist; {fix}") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"train.measured.fits={fits} is not a local-CBS report's fits.json "
                          f"({type(err).__name__}: {err}); {fix}") from None
    mine = [r for r in rows if isinstance(r, dict) and r.get("optimizer") == optimizer
            and r.get("lr_scaling") in (None, lr_scaling)]
    points = sorted({(r["tokens"], r["b_crit"]) for r in mine if _positive(r.get("tokens"))
                     and _positive(r.get("b_crit"))})
    if not points or len({t for t, _ in points}) != len(points):
        held = sorted({f"{r.get('optimizer')}/{r.get('lr_scaling') or 'any'}" for r in rows
                       if isinstance(r, dict)})
        what = ("no row" if not points else "two b_crit values at one checkpoint")
        raise ConfigError(
            f"train.measured.fits={fits} has {what} for optim={optimizer} with lr_scaling="
            f"{lr_scaling} (it holds optimizer/lr_scaling {', '.join(held) or 'nothing'}); "
            f"{fix}, with OPT={optimizer} and the same optim.lr_scaling")
    return [[float(t), float(b)] for t, b in points]


def _positive(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0
