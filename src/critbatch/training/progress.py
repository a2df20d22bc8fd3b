"""Progress of the slow data steps (streaming a corpus, BPE training, encoding): a tqdm bar on a
terminal, else a line every `PROGRESS_EVERY_S` seconds, on stderr."""

from __future__ import annotations

import sys
import time

PROGRESS_EVERY_S = 5.0  # off a terminal, long steps print a progress line this often


def say(message: str) -> None:
    """One progress line on stderr (beside tqdm's bars, away from the results on stdout)."""
    print(message, file=sys.stderr, flush=True)


class Progress:
    """A count of items done: a tqdm bar on a terminal, else a line every `PROGRESS_EVERY_S`.

    Logs and batch jobs get `<what>: 12,000/100,000 documents (1.3 MB/s, 10 s, ETA 73 s)` lines
    instead of a bar redrawn in place; `close()` prints the total and the time taken.
    """

    def __init__(self, what: str, total: int | None = None, unit: str = "documents") -> None:
        self.what, self.total, self.unit = what, total, unit
        self.count, self.bytes = 0, 0
        self.start = self.last = time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=what, unit=f" {unit}")

    def update(self, n: int = 1, n_bytes: int = 0) -> None:
        self.count += n
        self.bytes += n_bytes
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            elapsed = max(now - self.start, 1e-9)
            of = f"/{self.total:,}" if self.total else ""
            rate = f"{self.bytes / 1e6 / elapsed:.1f} MB/s, " if self.bytes else ""
            eta = (f", ETA {elapsed * (self.total - self.count) / self.count:.0f} s"
                   if self.total and 0 < self.count < self.total else "")
            say(f"{self.what}: {self.count:,}{of} {self.unit} ({rate}{elapsed:.0f} s{eta})")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        size = f" ({self.bytes / 1e6:.1f} MB)" if self.bytes else ""
        say(f"{self.what}: {self.count:,} {self.unit}{size} in "
            f"{time.monotonic() - self.start:.1f} s")
