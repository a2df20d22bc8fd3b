"""Host-memory allocation for training on a CPU: large per-step tensors reuse freed memory."""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 << 20  # allocations above this still get their own mmap
TRIM_THRESHOLD_BYTES = 1 << 30  # freed heap memory kept for reuse up to this much


def reuse_freed_memory() -> bool:
    """Have glibc serve large allocations from the heap and keep freed memory for reuse.

    By default glibc gives every allocation above a threshold its own mmap and returns it to
    the system when freed; the threshold starts at 128 KiB and only rises as large blocks are
    freed. A training step allocates and frees the same large tensors every step (the logits
    alone are batch x seq_len x vocab floats), so whether they are served from fresh mmaps,
    whose pages are faulted in and zeroed each step, or from reused heap memory depends on
    the process's allocation history, and the step time with it. Fixed thresholds make the
    reuse deterministic (see docs/results/cpu.md for the measured difference). Numbers are
    unchanged: only where memory comes from. Returns False where it does nothing (not glibc).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        ok &= libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    except (OSError, AttributeError):  # another C library (musl has no mallopt)
        return False
    return bool(ok)
