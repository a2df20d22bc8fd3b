"""The batch size and learning rate for a larger run, predicted from your own sweep.

    critbatch-recommend RUNS_DIR [RUNS_DIR ...] (--width W | --params N) --tokens D
                        [--optimizer adamw|muon] [--overhead EPS | --tolerance T]
                        [--target-loss L] [--json FILE] [--out DIR] [--wandb MODE]
    critbatch-recommend --table FILE ... --params N --tokens D [--resamples N]
    critbatch-recommend RUNS_DIR --validate
    critbatch-recommend --peers steplaw --params N --tokens D [--peers-dir DIR]
    critbatch-recommend --peers steplaw --validate

(`python analysis/recommend.py` is the same command.) For a model of W width (at the
sweep's depth) or N non-embedding parameters trained on D tokens, answers with two batches
and their lrs: the loss-optimal batch, and the largest batch whose loss at D tokens costs at
most EPS more compute than the loss-optimal one (--overhead, default 0.1: 10% more tokens for
the same loss; --tolerance T asks for T nats/token instead). Where the runs have a loss
optimum inside their batches (a dense public grid) the batches come from the measured
profiles and their laws in size and tokens; where loss keeps falling towards the smallest
batch (critbatch's sweeps) from the joint model's B_crit(L); the answer says which, and
whether the law it rests on is resolved. Intervals are 95%, from refits of the whole choice
(--resamples N of them).
--validate holds out each size's largest budget (and, with three sizes, the largest model)
in turn and scores the answer on the held-out runs. Writes recommend.md, recommend.json and
recommend.png to --out (default: <sweep dir>/report; beside a --table; for --peers
runs/peers/recommend-<grid>) and logs them to W&B (offline by
default). --peers steplaw answers from Step Law's public grid alone (Li et al. 2025), the
same engine on its runs, for users with no sweep of their own: its file is read from
--peers-dir (or $PEERS_DIR) or downloaded at a pinned commit and checked by sha256. The work
is done by `critbatch.analysis.recommend.report`; this module
only parses arguments.
"""

from __future__ import annotations

import argparse
import os

from critbatch.analysis.recommend.report import run
from critbatch.analysis.render import add_wandb_arguments, check_resamples
from critbatch.peers import recommend as peers
from critbatch.peers.recommend import GRIDS
from critbatch.results.errors import user_errors
from critbatch.science.answer import DEFAULT_OVERHEAD, Promise


def count(text: str) -> float:
    """A positive count such as 3e6 or 3000000."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 3e6)") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be positive and finite")
    return value


# the Makefile's variable for each flag: through `make recommend` errors speak them
MAKE_VARIABLES = (("--width W", "WIDTH=W"), ("--params N", "PARAMS=N"),
                  ("--tokens D", "TOKENS=D"), ("--validate", "VALIDATE=1"),
                  ("--target-loss", "TARGET_LOSS="), ("--optimizer", "OPT="),
                  ("--peers", "PEERS="), ("--width", "WIDTH="), ("--params", "PARAMS="),
                  ("--tokens", "TOKENS="))


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors, under `make recommend` (its recipe sets
    CRITBATCH_VIA_MAKE=recommend), name the make variables the user typed rather than the
    flags."""

    def error(self, message: str):
        if os.environ.get("CRITBATCH_VIA_MAKE") == "recommend":
            for flag, variable in MAKE_VARIABLES:
                message = message.replace(flag, variable)
            self.exit(2, f"make recommend: {message} (make help lists the variables)\n")
        super().error(message)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="sweep folders or run directories")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--width", type=int, help="the target model's width (at the sweep's depth)")
    size.add_argument("--params", type=count, help="the target's non-embedding parameters")
    parser.add_argument("--tokens", type=count, help="the target run's training tokens")
    parser.add_argument("--optimizer", help="only this optimizer (default: every one in the "
                                            "sweep, the best first)")
    promise = parser.add_mutually_exclusive_group()
    promise.add_argument("--overhead", type=count,
                         help="the compute the fastest batch may cost beyond the loss-optimal "
                              f"one, a fraction (default {DEFAULT_OVERHEAD}: 10%% more tokens "
                              "for the same loss)")
    promise.add_argument("--tolerance", type=count,
                         help="instead of --overhead: nats/token of loss the fastest batch may "
                              "give up at the target's tokens")
    parser.add_argument("--target-loss", type=count, help="also: steps and tokens of each "
                        "batch to reach this loss (nats/token)")
    parser.add_argument("--json", dest="json_file", help="also write the answer to this file")
    parser.add_argument("--out", help="report folder (default: <sweep dir>/report; with "
                                      "--table grid.csv, grid-report beside the table; with "
                                      "--from-wandb E/P, runs/wandb/E_P/<group or all>/report; "
                                      "with --peers G, runs/peers/recommend-G)")
    parser.add_argument("--table", action="append", metavar="FILE",
                        help="read runs from a .csv or .jsonl table (with a params column "
                             "for several model sizes) instead of run directories")
    parser.add_argument("--from-wandb", metavar="ENTITY/PROJECT",
                        help="read the runs from the W&B API instead of local files")
    parser.add_argument("--group", help="with --from-wandb: only this W&B group")
    parser.add_argument("--validate", action="store_true",
                        help="hold out the largest model (or budget) and check the "
                             "recommendation against its runs")
    parser.add_argument("--peers", metavar="GRID", choices=GRIDS,
                        help="answer from a public grid instead of your runs: "
                             + ", ".join(GRIDS))
    parser.add_argument("--peers-dir", default=os.environ.get("PEERS_DIR") or None,
                        help="with --peers: a folder holding the grid's files (default "
                             "$PEERS_DIR, else download them into the cache)")
    parser.add_argument("--resamples", type=int, metavar="N",
                        help="bootstrap resamples behind the answer's intervals (default: "
                             "300 for a grid's optimum, 100 joint-model refits; 20 at the "
                             "smoke scale); fewer answer sooner, with coarser intervals")
    add_wandb_arguments(parser)
    args = parser.parse_args(argv)
    with user_errors():
        if sum(map(bool, (args.paths, args.from_wandb, args.table, args.peers))) > 1:
            parser.error("pass one of RUNS_DIR, --from-wandb, --table or --peers")
        if args.peers and args.width:
            parser.error("--peers: give the target's size as --params N (a public grid has "
                         "no depth of yours to turn a width into parameters)")
        if args.peers and (args.target_loss or args.optimizer):
            parser.error("--peers answers for a budget with the grid's optimizer: drop "
                         "--target-loss and --optimizer")
        if args.validate and (args.params or args.width or args.tokens):
            parser.error("--validate picks its own targets (the held-out cells): drop "
                         "--width, --params and --tokens")
        if not args.validate and (args.tokens is None or not (args.width or args.params)):
            parser.error("say the target: --width W or --params N, and --tokens D "
                         "(or --validate)")
        check_resamples(parser, "--resamples", args.resamples)
        promise = (Promise(overhead=None, tolerance=args.tolerance) if args.tolerance
                   else Promise(overhead=args.overhead or DEFAULT_OVERHEAD))
        if args.peers:
            peers.run(args.peers, args.params, args.tokens, promise, args.peers_dir,
                      None, args.out, args.json_file, args.validate, args.resamples)
            return
        run(args.paths, args.table, args.from_wandb, args.group, width=args.width,
            params=args.params, tokens=args.tokens, optimizer=args.optimizer,
            promise=promise, target_loss=args.target_loss, json_file=args.json_file,
            out=args.out, do_validate=args.validate, wandb_mode=args.wandb_mode,
            project=args.project, resamples=args.resamples)

