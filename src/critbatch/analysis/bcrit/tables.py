"""Results from elsewhere: a table of finished runs, or of steps to a target loss.

    python analysis/fit_bcrit.py --table FILE [--table FILE ...]
    python analysis/fit_bcrit.py [PATHS | --from-wandb E/P] --export-table FILE

A table is CSV with a header row (`.csv`) or JSON Lines, one object per line (`.jsonl`,
`.ndjson`), one row per finished run or per (batch size, target loss). Two kinds of row:

- a run row: `batch_size` (sequences per optimizer step), `seq_len` (tokens per sequence),
  `tokens` (tokens trained) and `loss` (final validation loss, nats/token; blank or nan when
  the run has none: it is left out). Run rows become run dicts that `bcrit.analyse` reads
  like the summaries of a sweep: one eval point, the final one, per run.
- a steps-to-target row: `batch_size`, `seq_len`, `target_loss` (nats/token) and `steps`
  (optimizer steps to first reach it), the form most papers publish. They go to
  `bcrit.analyse(targets=...)`: one Pareto fit S = S_min + E_min / B per (group, optimizer,
  seq_len, target loss), and from there into Kaplan's law.

Optional columns: `group` (runs that may be compared: same model and data; default: one
group, `DEFAULT_GROUP`), `optimizer` (default `best_lr.UNKNOWN_OPTIMIZER`), `lr` (without it,
each cell has one lr and is flagged as untuned), `seed`, `run` (a name for the run; default
FILE:row N), `status` (completed or diverged), `bytes_per_token` (for losses per byte) and
`params` (the row's model's non-embedding parameters: `python analysis/recommend.py` predicts
across model sizes from it). What a sweep's run folder says beyond that, so that its table
gives the same fits and intervals:

- the model (`MODEL_COLUMNS`): `data_name`, `vocab_size`, `width`, `depth`. A row whose data
  is named and whose `group` is blank or the name these columns give
  (`<data_name> V<vocab_size> T<seq_len> w<width> d<depth>`, what --export-table writes) is
  grouped exactly like the run it came from: the widths of one corpus share a joint model and
  its fits are labelled by width. `data_fingerprint`: runs whose fingerprint differs from
  their group's majority are left out as mismatched.
- `warmup_steps` (the run's lr warmup, optimizer steps): a run of fewer steps than 3 times
  it is flagged and kept out of Kaplan's law and the Pareto fits, as for a run folder.
- `branch_of`: for a cooldown branch, the `run` of the run it forked from (its last path part
  is what counts: the folder name, as summary.json writes it). A run and its branches share
  one trunk, the unit of the per-run and joint bootstraps (`best_lr.trunks`).
- the B_noise measurements: `b_noise` (sequences) and `b_noise_loss` (the training loss it
  was measured at, nats/token), the online tracker's value at the end of the run; `noise`,
  the noise program's measurement (noise.json's object, as JSON); `curve`, the run's eval
  points (summary.json's curve, as JSON), whose `b_noise` is the online B_noise(L) series;
  `noise_readings`, the tracker read at the peak lr (summary.json's, as JSON: a list of
  {step, tokens, val_loss, b_noise}); `schedule` (wsd, constant, cosine, linear) and
  `cooldown_fraction`, which say which eval points were taken at the peak lr.
  A CSV cell holds JSON text, a JSON Lines row the object or list itself.
- `beta2` (AdamW's beta2 as trained at the row's batch) and `beta2_scaling` (`tokens`: the
  runs kept its half-life in tokens; `none`: one beta2 at every batch): `recommend` gives the
  beta2 of its batch by the same rule.
- `scale`: the preset the run was trained at (`smoke`, `cpu`, `gpu`): a smoke sweep measures
  nothing, and its report and every `recommend` answer say so (`summary.scale_of`).

Other columns are ignored. A bad table stops with one line naming the file, the row (the
file's line: a CSV header is row 1), the column and how to fix it.

`export_rows` and `write_table` turn loaded runs (a sweep's folders or W&B) into run rows
with every column above (`curve` only where its eval points carry a B_noise), so a sweep
round-trips through a table: the same fits.json, intervals included (`run` keeps the run
folder's path, on which the bootstraps' units are named). Older tables without the later
columns still load: their runs are their own trunks, never flagged for warmup and carry no
B_noise.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from critbatch.analysis.bcrit.bcrit import FixHints
from critbatch.analysis.bcrit.best_lr import UNKNOWN_OPTIMIZER, group_key, model_name
from critbatch.analysis.render import TABLE_WARNING_FIXES
from critbatch.results.errors import ResultsError
from critbatch.results.files import write_text_atomic
from critbatch.results.runs import (
    CURVE_KEYS,
    CURVE_OPTIONAL_KEYS,
    is_finite,
    malformed_curve,
    validate_noise,
    wrong_types,
)

RUN_COLUMNS = ("batch_size", "seq_len", "tokens", "loss")
TARGET_COLUMNS = ("batch_size", "seq_len", "target_loss", "steps")
MODEL_COLUMNS = ("data_name", "vocab_size", "width", "depth")
# Later columns are appended, never renamed: a table's columns are a public format.
EXPORT_COLUMNS = ("run", "group", "optimizer", "lr", "seed", "status", "batch_size", "seq_len",
                  "tokens", "loss", "bytes_per_token", "params", *MODEL_COLUMNS,
                  "data_fingerprint", "warmup_steps", "branch_of", "b_noise", "b_noise_loss",
                  "noise", "curve", "beta2", "beta2_scaling", "scale", "schedule",
                  "cooldown_fraction", "noise_readings")
FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
DEFAULT_GROUP = "table"
STATUSES = ("completed", "diverged")

# What each numeric column holds: (what a valid cell is, how to write one).
NUMBERS = {
    "batch_size": ("a positive whole number", "write the sequences per optimizer step, e.g. 256"),
    "seq_len": ("a positive whole number", "write the tokens per sequence, e.g. 512"),
    "tokens": ("a positive whole number", "write the tokens the run trained on, e.g. 1.3e9"),
    "loss": ("a loss in nats/token (a number above 0 and below 1000)",
             "write the final validation loss in nats/token, e.g. 3.42 (blank or nan when the "
             "run has none; status diverged for a run that blew up)"),
    "target_loss": ("a positive number", "write the target validation loss in nats/token, "
                                         "e.g. 3.42"),
    "steps": ("a positive number", "write the optimizer steps the run took to first reach "
                                   "target_loss, e.g. 13282"),
    "lr": ("a positive number", "write the peak learning rate, e.g. 3e-4 (every row, or drop "
                                "the column)"),
    "seed": ("a whole number", "write the run's seed, e.g. 0, or leave it blank"),
    "bytes_per_token": ("a positive number", "write the corpus's bytes per token, e.g. 4.2, "
                                             "or leave it blank"),
    "params": ("a positive whole number", "write the model's non-embedding parameters, e.g. "
                                          "85e6, or leave it blank"),
    "vocab_size": ("a positive whole number", "write the tokenizer's vocabulary size, e.g. "
                                              "50304, or leave it blank"),
    "width": ("a positive whole number", "write the model's width (d_model), e.g. 768, or "
                                         "leave it blank"),
    "depth": ("a positive whole number", "write the model's layers, e.g. 12, or leave it "
                                         "blank"),
    "warmup_steps": ("a whole number", "write the run's lr warmup in optimizer steps, e.g. "
                                       "10, or leave it blank"),
    "b_noise": ("a positive number", "write the online B_noise at the end of the run in "
                                     "sequences, e.g. 730, or leave it blank"),
    "b_noise_loss": ("a positive number", "write the training loss (nats/token) the online "
                                          "B_noise was measured at, e.g. 3.97, or leave it "
                                          "blank"),
    "beta2": ("a number in [0, 1)", "write AdamW's beta2 as trained at the row's batch, e.g. "
                                    "0.99, or leave it blank"),
    "cooldown_fraction": ("a number in (0, 1]", "write the share of a wsd run's steps its "
                                                "cooldown took, e.g. 0.2, or leave it blank"),
}
OPTIONAL_NUMBERS = ("lr", "seed", "bytes_per_token", "params", *MODEL_COLUMNS[1:],
                    "warmup_steps", "b_noise", "b_noise_loss", "beta2", "cooldown_fraction")
OPTIONAL_TEXTS = ("data_name", "data_fingerprint", "branch_of", "beta2_scaling", "scale",
                  "schedule")
SCHEDULES = ("wsd", "constant", "cosine", "linear")
BETA2_SCALINGS = ("none", "tokens")
READING_KEYS = ("step", "tokens", "val_loss", "b_noise")  # a noise_readings entry
WHOLE = ("batch_size", "seq_len", "tokens", "seed", "params", "vocab_size", "width", "depth",
         "warmup_steps")
POSITIVE = ("batch_size", "seq_len", "tokens", "target_loss", "steps", "lr", "bytes_per_token",
            "params", "vocab_size", "width", "depth", "b_noise", "b_noise_loss")
# The JSON cells: how to write one.
JSON_CELLS = {
    "noise": "write the noise program's noise.json object (`make noise` writes it), or leave "
             "it blank",
    "curve": "write the run's eval points as summary.json's curve: a list of {step, tokens, "
             "val_loss, val_loss_per_byte, b_noise (optional, sequences)}, or leave it blank",
    "noise_readings": "write the tracker's peak-lr readings as summary.json's noise_readings: "
                      "a list of {step, tokens, val_loss, b_noise}, or leave it blank",
}

# nats/token: no language model's loss (ln of a 1e6-token vocabulary is 13.8); a loss of 1e300
# would overflow the seed variance
MAX_LOSS = 1000.0
NO_LR = math.nan  # the lr of rows without one: one object, so a cell's rows share one lr bin

TABLE_HINTS = FixHints(
    baseline="add rows of batch {batch} at {more} more token budget(s), each a complete run "
             "with its own lr schedule",
    batch="add rows of larger batch sizes at the budgets of batch {batch}",
    pareto="add rows of a second batch size at two token budgets or more (or steps-to-target "
           "rows of several batch sizes)",
    lr="add rows at three learning rates or more per batch size (an lr column), so that each "
       "best lr lies inside its grid",
    losses="add steps-to-target rows at several target losses (or run rows at more budgets) "
           "for B_crit across losses",
    seeds="add rows of the smallest batch at a second seed (a seed column) for the seed "
          "noise",
    warning_fixes=TABLE_WARNING_FIXES)


# ---------------------------------------------------------------------------------------------
# Reading


def read_records(path: Path) -> tuple[list[tuple[int, dict]], str]:
    """The rows of a table file as (row number, {column: cell}), and its format.

    Row numbers are the file's lines (a CSV header is row 1); blank lines are skipped. CSV
    cells are stripped strings; JSON Lines cells are what JSON holds.
    """
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ResultsError(f"{path}: unknown table format {path.suffix or '(no extension)'!r}; "
                           "name it .csv (a header row, then one row per run) or .jsonl (one "
                           "JSON object per line)")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ResultsError(f"{path} does not exist; pass a .csv or .jsonl table") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path} cannot be read as text ({err}); save it as UTF-8 "
                           ".csv or .jsonl") from None
    if not text.strip():
        raise ResultsError(f"{path}: the file is empty; write a header row ("
                           f"{','.join(RUN_COLUMNS)} or {','.join(TARGET_COLUMNS)}) and one "
                           "row per finished run")
    records = []
    if kind == "csv":
        reader = csv.reader(io.StringIO(text))
        header = [h.strip() for h in next(reader)]
        for cells in reader:
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise ResultsError(f"{path} row {reader.line_num}: {len(cells)} cells under "
                                   f"{len(header)} columns; give every row one cell per "
                                   "header column (leave optional ones empty)")
            records.append((reader.line_num, dict(zip(header, (c.strip() for c in cells),
                                                      strict=True))))
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ResultsError(f"{path} row {n}, column {err.colno}: not valid JSON "
                                   f"({err.msg}); write one JSON object per line") from None
            if not isinstance(record, dict):
                raise ResultsError(f"{path} row {n}: a JSON {type(record).__name__}, not an "
                                   "object; write one object per line, e.g. "
                                   '{"batch_size": 256, "seq_len": 512, "tokens": 1e9, '
                                   '"loss": 3.4}')
            records.append((n, record))
    if not records:
        raise ResultsError(f"{path}: no rows below the header; add one row per finished run")
    return records, kind


def is_blank(cell) -> bool:
    return cell is None or (isinstance(cell, str) and not cell.strip())


def number(cell, column: str, where: str) -> float:
    """A numeric cell (NUMBERS[column]), or a one-line error naming where it is."""
    what, how = NUMBERS[column]
    try:
        if isinstance(cell, bool) or not isinstance(cell, int | float | str):
            raise ValueError
        value = float(cell)
    except ValueError:
        raise ResultsError(f"{where}, column {column}: {cell!r} is not {what}; {how}") from None
    bad = not math.isfinite(value) and not (column == "loss" and math.isnan(value))
    bad |= column in POSITIVE and not value > 0
    bad |= column == "loss" and not (math.isnan(value) or 0 < value < MAX_LOSS)
    bad |= column in WHOLE and math.isfinite(value) and value != round(value)
    if bad:
        raise ResultsError(f"{where}, column {column}: {cell!r} is not {what}; {how}")
    return int(value) if column in WHOLE else value


def text(record: dict, column: str, default: str | None) -> str | None:
    cell = record.get(column)
    return default if is_blank(cell) else str(cell).strip()


def json_cell(cell, column: str, where: str):
    """A JSON cell (JSON_CELLS[column]), validated: JSON text in a CSV cell, the value itself
    in JSON Lines."""
    how = JSON_CELLS[column]
    if isinstance(cell, str):
        try:
            cell = json.loads(cell)
        except json.JSONDecodeError as err:
            raise ResultsError(f"{where}, column {column}: not valid JSON ({err.msg}); "
                               f"{how}") from None
    if column == "noise":
        return validate_noise(cell, f"{where}, column noise", how)
    if column == "noise_readings":
        if not isinstance(cell, list) or any(
                not isinstance(p, dict) or any(k not in p for k in READING_KEYS) for p in cell):
            raise ResultsError(f"{where}, column noise_readings: not a list of readings; {how}")
        return cell
    bad = [] if malformed_curve(cell) else [
        x for p in cell for x in wrong_types(
            p, CURVE_KEYS, optional=tuple(k for k in CURVE_OPTIONAL_KEYS if k in p))]
    if malformed_curve(cell) or bad:
        raise ResultsError(f"{where}, column curve: not a list of eval points"
                           + (f" ({', '.join(bad[:3])})" if bad else "") + f"; {how}")
    return cell


def model_fields(row: dict) -> dict:
    """A row's group-key fields but seq_len and optimizer (`best_lr.GROUP_KEYS`): its model
    columns, and its `group` as the label (blank: DEFAULT_GROUP). A row that names its data
    and whose group is blank or the name its model columns give (`best_lr.model_name`, what
    --export-table writes for a sweep's run) has no label: it is grouped like that run."""
    fields = {k: row.get(k) for k in MODEL_COLUMNS}
    data, vocab, width, depth = fields.values()
    label = row["group"]
    if data is not None and label in (
            None, model_name((data, vocab, row["seq_len"], width, depth, None, None))):
        label = None
    elif label is None:
        label = DEFAULT_GROUP
    return {**fields, "group_label": label}


def parse_row(record: dict, where: str, header_where: str, has_lr: bool) -> dict:
    """One validated row: its `kind` ("run" or "target") and typed cells."""
    filled = {k for k, v in record.items() if not is_blank(v)}
    kind = "target" if filled & {"target_loss", "steps"} else "run"
    need = TARGET_COLUMNS if kind == "target" else RUN_COLUMNS
    for column in need:
        if column not in record:
            name, other, other_name = (("a steps-to-target row", RUN_COLUMNS, "a run row")
                                       if kind == "target" else
                                       ("a run row", TARGET_COLUMNS, "a steps-to-target row"))
            raise ResultsError(f"{header_where}: no column {column}; add it: {name} needs "
                               f"{', '.join(need)} ({other_name}: {', '.join(other)})")
    row = {"kind": kind, "where": where}
    for column in need:
        cell = record[column]
        if is_blank(cell) and column == "loss":
            row[column] = math.nan
        elif is_blank(cell):
            raise ResultsError(f"{where}, column {column}: empty; {NUMBERS[column][1]}")
        else:
            row[column] = number(cell, column, where)
    for column in OPTIONAL_NUMBERS:
        if not is_blank(record.get(column)):
            row[column] = number(record[column], column, where)
    for column in OPTIONAL_TEXTS:
        row[column] = text(record, column, None)
    if "beta2" in row and not 0 <= row["beta2"] < 1:
        raise ResultsError(f"{where}, column beta2: {row['beta2']} is not {NUMBERS['beta2'][0]}; "
                           f"{NUMBERS['beta2'][1]}")
    if row["schedule"] not in (None, *SCHEDULES):
        raise ResultsError(f"{where}, column schedule: {row['schedule']!r} is not one of "
                           f"{', '.join(SCHEDULES)}; write the lr schedule, or leave it blank")
    if "cooldown_fraction" in row and not 0 < row["cooldown_fraction"] <= 1:
        raise ResultsError(f"{where}, column cooldown_fraction: {row['cooldown_fraction']} is "
                           f"not {NUMBERS['cooldown_fraction'][0]}; "
                           f"{NUMBERS['cooldown_fraction'][1]}")
    if row["beta2_scaling"] not in (None, *BETA2_SCALINGS):
        raise ResultsError(f"{where}, column beta2_scaling: {row['beta2_scaling']!r} is not one "
                           f"of {', '.join(BETA2_SCALINGS)}; write tokens or none, or leave it "
                           "blank")
    for column in JSON_CELLS:
        if not is_blank(record.get(column)):
            row[column] = json_cell(record[column], column, where)
    if kind == "run" and has_lr and "lr" not in row:
        raise ResultsError(f"{where}, column lr: empty; {NUMBERS['lr'][1]}")
    if ("b_noise" in row) != ("b_noise_loss" in row):
        have, need = ("b_noise", "b_noise_loss") if "b_noise" in row else (
            "b_noise_loss", "b_noise")
        raise ResultsError(f"{where}, column {need}: empty beside {have}; {NUMBERS[need][1]} "
                           f"(with {have} blank too)")
    row["group"] = text(record, "group", None)
    row["optimizer"] = text(record, "optimizer", UNKNOWN_OPTIMIZER)
    row["status"] = text(record, "status", "completed").lower()
    if row["status"] not in STATUSES:
        raise ResultsError(f"{where}, column status: {record['status']!r} is not one of "
                           f"{', '.join(STATUSES)}; write completed, diverged or leave it blank")
    row["run"] = text(record, "run", where)
    return row


def run_from_row(row: dict, source: str) -> dict:
    """A run dict that `bcrit.analyse` reads like a loaded summary: its eval points (`curve`,
    or its final loss as its one point), its group (`model_fields`), its trunk (`branch_of`),
    warmup and B_noise measurements when the row has them."""
    tokens, batch, seq_len = row["tokens"], row["batch_size"], row["seq_len"]
    loss = row["loss"] if row["status"] == "completed" else math.nan
    bytes_per_token = row.get("bytes_per_token", math.nan)
    steps = tokens // (batch * seq_len)
    per_byte = loss / bytes_per_token
    b_noise = row.get("b_noise")
    return {
        "status": row["status"], "sweep": source, "seed": row.get("seed", 0),
        "optimizer": row["optimizer"], "lr": row.get("lr", NO_LR), **model_fields(row),
        "params_nonembedding": row.get("params"), "seq_len": seq_len,
        "batch_size": batch, "tokens": tokens, "steps": steps,
        "warmup_steps": row.get("warmup_steps"), "bytes_per_token": bytes_per_token,
        "val_loss": loss, "val_loss_per_byte": per_byte,
        "data_fingerprint": row["data_fingerprint"], "run_dir": row["run"],
        "branch_of": row["branch_of"] and Path(row["branch_of"]).name,
        "noise": row.get("noise"),
        "b_noise": b_noise, "b_noise_tokens": None if b_noise is None else b_noise * seq_len,
        "b_noise_loss": row.get("b_noise_loss"), "status_reason": None, "diverged_step": None,
        "beta2": row.get("beta2"), "beta2_scaling": row.get("beta2_scaling"),
        "scale": row.get("scale"), "schedule": row.get("schedule"),
        "cooldown_fraction": row.get("cooldown_fraction"),
        **({"noise_readings": row["noise_readings"]} if "noise_readings" in row else {}),
        "curve": [] if row["status"] == "diverged" else row.get("curve") or [
            {"step": steps, "tokens": tokens, "val_loss": loss, "val_loss_per_byte": per_byte}]}


def target_from_row(row: dict, source: str) -> dict:
    """A steps-to-target row as `bcrit.target_frontiers` reads it."""
    return {**model_fields(row), "optimizer": row["optimizer"],
            "params_nonembedding": row.get("params"), "seq_len": row["seq_len"],
            "target_loss": row["target_loss"],
            "batch_size": row["batch_size"], "steps": row["steps"], "sweep": source,
            "run_dir": row["run"]}


def read_table(path: str | Path) -> tuple[list[dict], list[dict]]:
    """(run dicts, steps-to-target rows) of one table file; ResultsError on a bad one."""
    path = Path(path)
    records, kind = read_records(path)
    has_lr = any("lr" in r and not is_blank(r["lr"]) for _, r in records)
    runs, targets = [], []
    for n, record in records:
        where = f"{path} row {n}"
        header_where = f"{path} row 1 (the header)" if kind == "csv" else where
        row = parse_row(record, where, header_where, has_lr)
        if row["kind"] == "run":
            runs.append(run_from_row(row, path.name))
        else:
            targets.append(target_from_row(row, path.name))
    return runs, targets


def load_tables(paths: list[str | Path]) -> dict:
    """Every table's rows in `results.load_runs`'s shape, with the steps-to-target rows and
    the table's fix hints as `analyse_kwargs` for `bcrit.analyse`."""
    runs, targets = [], []
    for path in paths:
        more_runs, more_targets = read_table(path)
        runs += more_runs
        targets += more_targets
    return {"runs": runs, "left_out": [], "warnings": [],
            "analyse_kwargs": {"targets": targets, "hints": TABLE_HINTS}}


# ---------------------------------------------------------------------------------------------
# Writing


def export_rows(runs: list[dict]) -> tuple[list[dict], list[str]]:
    """Run rows (EXPORT_COLUMNS) of loaded runs, and a note for each run a table cannot hold:
    a scheduled batch (no one batch size) or a completed run without an eval point. A run's
    `curve` is exported only where an eval point carries a B_noise (the online series), its
    end-of-run B_noise only with the loss it was measured at."""
    rows, skipped = [], []
    for run in runs:
        if run.get("batch_schedule", "constant") != "constant":
            skipped.append(f"{run['run_dir']}: a {run['batch_schedule']} batch has no single "
                           "batch size")
            continue
        if run["status"] == "completed" and not run["curve"]:
            skipped.append(f"{run['run_dir']}: no eval point")
            continue
        loss = run["val_loss"] if run["status"] == "completed" else math.nan
        online = is_finite(run.get("b_noise")) and is_finite(run.get("b_noise_loss"))
        rows.append({"run": run["run_dir"], "group": model_name(group_key(run)),
                     "optimizer": run["optimizer"], "lr": run["lr"], "seed": run["seed"],
                     "status": run["status"], "batch_size": run["batch_size"],
                     "seq_len": run["seq_len"], "tokens": run["tokens"], "loss": loss,
                     "bytes_per_token": run["bytes_per_token"],
                     "params": run.get("params_nonembedding"),
                     **{k: run.get(k) for k in MODEL_COLUMNS},
                     "data_fingerprint": run.get("data_fingerprint"),
                     "warmup_steps": run.get("warmup_steps"), "branch_of": run.get("branch_of"),
                     "b_noise": run["b_noise"] if online else None,
                     "b_noise_loss": run["b_noise_loss"] if online else None,
                     "noise": run.get("noise"),
                     "beta2": run.get("beta2"), "beta2_scaling": run.get("beta2_scaling"),
                     "scale": run.get("scale"), "schedule": run.get("schedule"),
                     "cooldown_fraction": run.get("cooldown_fraction"),
                     "noise_readings": run.get("noise_readings"),
                     "curve": run["curve"] if any(p.get("b_noise") is not None
                                                  for p in run["curve"]) else None})
    return rows, skipped


def csv_text(columns, rows: list[dict]) -> str:
    """A CSV document with a header row; None (and missing keys) as empty cells."""
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    writer.writerows({k: "" if row.get(k) is None else row.get(k) for k in columns}
                     for row in rows)
    return buffer.getvalue()


def write_table(rows: list[dict], path: str | Path) -> None:
    """Write run rows as CSV or JSON Lines (by the extension); a missing or non-finite number
    is an empty cell (null in JSON); a JSON cell (JSON_CELLS) is JSON text in CSV, the value
    itself in JSON Lines, copied as the run's files hold it."""
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ResultsError(f"{path}: unknown table format {path.suffix or '(no extension)'!r}; "
                           "name the export .csv or .jsonl")

    def cell(v):
        if isinstance(v, list | dict):
            return v if kind == "jsonl" else json.dumps(v)
        return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v

    clean = [{k: cell(row.get(k)) for k in EXPORT_COLUMNS} for row in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        write_text_atomic(path, "".join(json.dumps(row) + "\n" for row in clean))
    else:
        write_text_atomic(path, csv_text(EXPORT_COLUMNS, clean))
