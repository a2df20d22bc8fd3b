"""Fit the critical batch size from finished runs and write the report.

    critbatch-fit [PATHS...] [--out DIR] [--baseline-batch B|auto]
                  [--from-wandb ENTITY/PROJECT [--group G]]
                  [--table FILE ...] [--export-table FILE] [--resamples N]

(`python analysis/fit_bcrit.py` is the same command.) PATHS are run directories or folders
searched recursively for summary.json (default: the most recently written runs/batch/<scale>
or runs/widths/<scale> folder with finished runs, named in a line printed first; never
runs/single or runs/multirun). --table reads results from elsewhere instead: a CSV or JSON
Lines table of runs (batch_size, seq_len, tokens, loss) or of steps to a target loss
(batch_size, seq_len, target_loss, steps); see `critbatch.analysis.bcrit.tables`. Writes report.md,
plots, fits.json and bcrit.csv to --out (default: <sweep dir>/report/; with --table, beside
the first table: grid.csv's report is grid-report/) and logs them to W&B (offline by
default). --export-table FILE writes the input runs as such a table instead of a report;
read back with --table, it gives the same fits.json, intervals included (what the table
carries: `critbatch.analysis.bcrit.tables`). --resamples N sets the refits behind the
summary's intervals (the answer per optimizer that report.md opens with), as recommend's flag
does. The work is done by `critbatch.analysis.bcrit.report`;
this module only parses arguments.
"""

from __future__ import annotations

import argparse

from critbatch.analysis.bcrit.report import export_table, run_analysis
from critbatch.analysis.render import add_wandb_arguments, check_resamples
from critbatch.results.errors import user_errors

# Where the report goes without --out (`bcrit_report.inputs_of`): a table has no sweep folder,
# and tables of one folder must not share a report, so it goes beside the (first) table.
OUT_DEFAULT = ("<sweep dir>/report; with --table grid.csv, grid-report beside the table; "
               "with --from-wandb E/P, runs/wandb/E_P/<group or all>/report")


def baseline_batch(text: str) -> int | str:
    """A batch size in sequences, or "auto"."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a batch size (sequences) nor "
                                         "'auto'") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="run directories or sweep folders")
    parser.add_argument("--out", help=f"report folder (default: {OUT_DEFAULT})")
    parser.add_argument("--baseline-batch", type=baseline_batch, default=None,
                        help="baseline batch size in sequences, or 'auto' for the most "
                             "token-efficient batch with a loss curve (default: the smallest "
                             "batch with at least three budgets)")
    parser.add_argument("--from-wandb", metavar="ENTITY/PROJECT",
                        help="read the runs from the W&B API instead of local files")
    parser.add_argument("--group", help="with --from-wandb: only this W&B group")
    parser.add_argument("--table", action="append", metavar="FILE",
                        help="read runs or steps-to-target rows from a .csv or .jsonl table "
                             "(repeatable) instead of run directories")
    parser.add_argument("--export-table", metavar="FILE",
                        help="write the input runs as a .csv or .jsonl table of run rows "
                             "(no report)")
    parser.add_argument("--resamples", type=int, metavar="N",
                        help="bootstrap refits behind the summary's intervals (default: 100 "
                             "joint-model refits; 20 at the smoke scale); fewer report sooner, "
                             "with coarser intervals")
    add_wandb_arguments(parser)
    args = parser.parse_args(argv)
    with user_errors():
        check_resamples(parser, "--resamples", args.resamples)
        if args.group and not args.from_wandb:
            parser.error("--group needs --from-wandb")
        if sum(map(bool, (args.paths, args.from_wandb, args.table))) > 1:
            parser.error("pass one of PATHS, --from-wandb or --table")
        if args.export_table:
            export_table(args.export_table, args.paths, args.from_wandb, args.group, args.table)
            return
        run_analysis(args.paths, args.out, args.baseline_batch, args.from_wandb, args.group,
                     args.wandb_mode, args.project, tables=args.table,
                     resamples=args.resamples)
