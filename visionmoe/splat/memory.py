"""Process-wide malloc setting for encoding (the command line and the benchmarks call it)."""

from __future__ import annotations

import sys

__all__ = ["KEEP_FREED_MEMORY_MAX_GAUSSIANS", "keep_freed_memory"]

# Scenes up to this size are encoded with ``keep_freed_memory``: the 2M-Gaussian SH3 synthetic
# scene at 20x peaked at 7.89 GB with it (budget 8 GB) and 6.81 GB without, in the same time.
KEEP_FREED_MEMORY_MAX_GAUSSIANS = 1_000_000


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to serve large blocks from the heap and keep freed memory for reuse
    (``M_MMAP_MAX`` 0, ``M_TRIM_THRESHOLD`` 2 GB) instead of mapping fresh, zeroed pages for
    every large array: the encoder allocates and frees arrays of the scene's size thousands of
    times. Playbot at 20x in a fresh process: 1.3M page faults -> 0.45M, 27 -> 22 s of encoding
    (peak RSS +10-30%). Process-wide, so the library never calls it: the command line (for
    scenes up to ``KEEP_FREED_MEMORY_MAX_GAUSSIANS``) and the benchmarks (to time what it does)
    do. -> whether it applied."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
