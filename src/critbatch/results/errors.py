"""User-facing errors: one sentence, a non-zero exit, no traceback."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

EXIT_USER_ERROR = 2


class CritbatchError(Exception):
    """An error caused by the user's input (config, data, results), with a fix in its message."""


class ConfigError(CritbatchError):
    """A config value is unknown, mistyped or inconsistent."""


class DataError(CritbatchError):
    """A corpus or token cache cannot be read or built."""


class ResultsError(CritbatchError):
    """A run directory or results file is missing or malformed."""


def fail(message: str, code: int = EXIT_USER_ERROR) -> None:
    """Print `critbatch: error: <message>` as one line on stderr and exit with status `code`
    (2, a user error, unless told otherwise)."""
    one_line = " ".join(str(message).split())
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 alone says it
        ranks = int(os.environ.get("WORLD_SIZE", "1"))
        after = f" (torchrun's report on its {ranks} ranks follows)" if ranks > 1 else ""
        print(f"critbatch: error: {one_line}{after}", file=sys.stderr, flush=True)
    raise SystemExit(code)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn a `CritbatchError` raised inside the block into a one-line message and exit 2."""
    try:
        yield
    except CritbatchError as err:
        fail(str(err))
