"""`python -m critbatch.data prepare NAME [overrides]`: build a corpus's token cache once, online,
so that training on it runs offline (critbatch/training/token_cache.py; `make data DATA=NAME`)."""

from __future__ import annotations

import argparse

from critbatch.results.errors import fail, user_errors
from critbatch.training.cli import check_overrides
from critbatch.training.token_cache import build_token_cache


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every critbatch error
        fail(f"{message} (see python -m critbatch.data --help)")


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog="python -m critbatch.data",
                     description="Build the tokenizer and token-id cache of a corpus.")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser(
        "prepare", help="stream the corpus, train the BPE and cache the token ids")
    prepare.add_argument("name", help="the data config: tinystories, fineweb_edu, hub, ...")
    prepare.add_argument("overrides", nargs="*",
                         help="Hydra overrides as for training, e.g. data.max_documents=1000 "
                              "scale=gpu")
    args = parser.parse_args(argv)
    with user_errors():
        cfg = check_overrides([f"data={args.name}", *args.overrides])
        build_token_cache(cfg.data)


if __name__ == "__main__":
    main()
