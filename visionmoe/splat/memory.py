"""Encoder memory: the peak it needs for a scene (checked against a limit before encoding), and the
process-wide malloc setting for encoding (the command line and the benchmarks call it).

Standard library only: the command line imports it before torch.
"""

from __future__ import annotations

import os
import sys

__all__ = ["ENCODE_BASE_BYTES", "ENCODE_BYTES_PER_GAUSSIAN", "ENCODE_LARGE_BASE_BYTES", "ENCODE_LARGE_BYTES_PER_GAUSSIAN",
           "EncodeMemoryError", "KEEP_FREED_MEMORY_MAX_GAUSSIANS",
           "check_encode_memory", "encode_memory_needed", "keep_freed_memory", "physical_memory"]

# Scenes up to this size are encoded with ``keep_freed_memory``: the 2M-Gaussian SH3 synthetic
# scene at 20x peaked at 7.89 GB with it (budget 8 GB) and 6.81 GB without, in the same time.
KEEP_FREED_MEMORY_MAX_GAUSSIANS = 1_000_000

# Peak RSS of one CPU encode at 20x from ``scripts/bench_scaling.py`` on tiled shared scenes
# (docs/SCALING.md), as two lines that meet at 1M Gaussians, where the command line stops keeping
# freed memory (``KEEP_FREED_MEMORY_MAX_GAUSSIANS``) and the pruning search stops running two
# variants at once: up to 1M, 2.00 GB (the 100k SH3 peak) + 4280 B per Gaussian (through the 1M
# SH3 peak, 6.28 GB); above, through the 1M peak and a 6M SH3 peak of 15.74 GB. Those peaks were
# sampled with a stack walk that itself kept arrays alive (upper bounds); the encoder's own
# peaks, sampled without it, lie below both lines at every size and degree measured (SH0 and
# SH3, 100k-6M; 1.3-2.2x below; tests/splat/encoder/test_memory_limit.py), so the
# estimate errs on the side of refusing, and one line serves every degree.
ENCODE_BASE_BYTES = 2_000_000_000
ENCODE_BYTES_PER_GAUSSIAN = 4280
ENCODE_LARGE_BASE_BYTES = 4_390_000_000  # the line above 1M Gaussians
ENCODE_LARGE_BYTES_PER_GAUSSIAN = 1892


class EncodeMemoryError(ValueError):
    """The encoder's estimated peak memory for a scene is above the allowed limit (one line)."""


def encode_memory_needed(num_gaussians: int, sh_degree: int) -> int:
    """Estimated peak resident memory (bytes) of encoding a scene of ``num_gaussians`` at SH
    ``sh_degree`` on the CPU at 20x (the bound above)."""
    if not 0 <= sh_degree <= 3:
        raise ValueError(f"sh_degree must be 0-3, got {sh_degree}")
    n = max(int(num_gaussians), 0)
    if n <= KEEP_FREED_MEMORY_MAX_GAUSSIANS:
        return ENCODE_BASE_BYTES + ENCODE_BYTES_PER_GAUSSIAN * n
    return ENCODE_LARGE_BASE_BYTES + ENCODE_LARGE_BYTES_PER_GAUSSIAN * n


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def check_encode_memory(num_gaussians: int, sh_degree: int, max_memory: int | None = None) -> int:
    """Refuse, before any work, a scene whose encode would not fit: -> the estimate (bytes).

    ``max_memory``: the limit in bytes (the command line's ``--max-memory``); None: this machine's
    physical memory. Raises :class:`EncodeMemoryError` naming the estimate and the limit."""
    if max_memory is not None and not (isinstance(max_memory, int) and max_memory >= 1):
        raise ValueError(f"max_memory must be a positive number of bytes, got {max_memory!r}")
    need = encode_memory_needed(num_gaussians, sh_degree)
    limit = physical_memory() if max_memory is None else max_memory
    if limit is not None and need > limit:
        what = "--max-memory" if max_memory is not None else "this machine's memory"
        raise EncodeMemoryError(
            f"encoding {num_gaussians} Gaussians at SH degree {sh_degree} needs about {_gb(need)} of memory "
            f"(estimate), above {what} of {_gb(limit)}: raise the limit, or split or prune the scene")
    return need


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
