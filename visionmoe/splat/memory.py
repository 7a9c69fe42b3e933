"""Encoder memory: the peak it needs for a scene (checked against a limit before encoding), and the
process-wide malloc setting for encoding (the command line and the benchmarks call it).

Standard library only: the command line imports it before torch.
"""

from __future__ import annotations

import os
import sys

__all__ = ["ENCODE_BASE_BYTES", "ENCODE_BYTES_PER_GAUSSIAN", "EncodeMemoryError", "KEEP_FREED_MEMORY_MAX_GAUSSIANS",
           "check_encode_memory", "encode_memory_needed", "keep_freed_memory", "physical_memory"]

# Scenes up to this size are encoded with ``keep_freed_memory``: the 2M-Gaussian SH3 synthetic
# scene at 20x peaked at 7.89 GB with it (budget 8 GB) and 6.81 GB without, in the same time.
KEEP_FREED_MEMORY_MAX_GAUSSIANS = 1_000_000

# Peak RSS of one CPU encode at 20x, bounded as ``a + b(SH) x N`` from ``scripts/bench_scaling.py``
# on tiled shared scenes (docs/SCALING.md). ``a``: the 100k-Gaussian SH3 peak (2.00 GB, held by
# the refinement, which only runs on cuts of at most 150k primitives); ``b``: the marginal bytes
# per Gaussian between the two largest completed SH3 runs (tiled ertz_couch_sh3, 300k: 2.37 GB,
# 1M: 6.28 GB, both peaking in the pruning search), so every measured run lies under the
# estimate. SH0 takes the SH3 slope (an upper bound) until measured; degrees 1 and 2 are
# interpolated on the floats a Gaussian carries (14 + 3 (SH+1)^2).
ENCODE_BASE_BYTES = 2_000_000_000
ENCODE_BYTES_PER_GAUSSIAN = {0: 5586, 3: 5586}


class EncodeMemoryError(ValueError):
    """The encoder's estimated peak memory for a scene is above the allowed limit (one line)."""


def _floats(sh_degree: int) -> int:
    return 14 + 3 * (sh_degree + 1) ** 2


def encode_memory_needed(num_gaussians: int, sh_degree: int) -> int:
    """Estimated peak resident memory (bytes) of encoding a scene of ``num_gaussians`` at SH
    ``sh_degree`` on the CPU (the fitted ``a + b N``)."""
    if not 0 <= sh_degree <= 3:
        raise ValueError(f"sh_degree must be 0-3, got {sh_degree}")
    lo, hi = ENCODE_BYTES_PER_GAUSSIAN[0], ENCODE_BYTES_PER_GAUSSIAN[3]
    t = (_floats(sh_degree) - _floats(0)) / (_floats(3) - _floats(0))
    return int(ENCODE_BASE_BYTES + (lo + t * (hi - lo)) * max(int(num_gaussians), 0))


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
