"""The compiled loops of the .pgms format's interleaved rANS (coder 4), on numpy arrays.

``visionmoe.splat.pgms.rans`` owns the format (tables, headers, checks) and keeps numpy loops as
the reference and as the fallback where the extension is not built; these are the same loops
in C++ (``csrc/codec/rans_cpu.cpp``), byte for byte, several times faster (docs/OPS.md,
``scripts/bench_rans.py``).
"""

from __future__ import annotations

import numpy as np
import torch

from ._backend import _load, extension, warn_fallback

# status codes of rans_decode
DECODED, WORDS_EXHAUSTED, WORDS_UNUSED, BAD_FINAL_STATE = 0, 1, 2, 3


def available() -> bool:
    """Whether the compiled coder is there (the extension is built and has it); when the extension
    cannot load, the caller's numpy loops take over after the one warning of ``warn_fallback``."""
    module, _ = _load()
    if module is None:
        warn_fallback()
        return False
    return hasattr(module.cpu, "rans_encode")


def rans_encode(symbols: np.ndarray, freqs: np.ndarray, precision: int, lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """Code ``symbols`` [n] (each with ``freqs[s] > 0``; ``freqs`` sums to ``2^precision``) on
    ``lanes`` lanes -> (final lane states [lanes] uint32, words [W] uint16 in decoder order)."""
    u = torch.from_numpy(np.ascontiguousarray(symbols, dtype=np.int64))
    f = torch.from_numpy(np.ascontiguousarray(freqs, dtype=np.int64))
    states, words = extension().cpu.rans_encode(u, f, int(precision), int(lanes))
    return states.numpy().astype(np.uint32), words.numpy().astype(np.uint16)


def rans_decode(states: np.ndarray, words: np.ndarray, freqs: np.ndarray, precision: int,
                n: int) -> tuple[np.ndarray, int, int]:
    """Decode ``n`` symbols from lane ``states`` (each in [2^16, 2^32)) and ``words`` ->
    (symbols [n] uint64, status, detail): status DECODED, or WORDS_EXHAUSTED (detail: the
    symbol), WORDS_UNUSED (detail: how many) or BAD_FINAL_STATE (detail: the lane)."""
    x = torch.from_numpy(np.ascontiguousarray(states, dtype=np.int64))
    w = torch.from_numpy(np.ascontiguousarray(words, dtype=np.int32))
    f = torch.from_numpy(np.ascontiguousarray(freqs, dtype=np.int64))
    symbols, status = extension().cpu.rans_decode(x, w, f, int(precision), int(n))
    code, detail = (int(v) for v in status)
    return symbols.numpy().astype(np.uint64), code, detail


def has_table_writer() -> bool:
    """Whether the extension has the compiled frequency-table writer (one built before it lacks it)."""
    module, _ = _load()
    return module is not None and hasattr(module.cpu, "rans_table_varints")


def table_varints(freqs: np.ndarray) -> bytes:
    """The format's frequency table before its optional zstd (zero runs as ``0, run - 1``, other
    frequencies as themselves, unsigned LEB128): the bytes of the numpy writer, without its
    dozen array passes (the encoder's precision choice writes one per candidate precision)."""
    f = torch.from_numpy(np.ascontiguousarray(freqs, dtype=np.int64).reshape(-1))
    return extension().cpu.rans_table_varints(f).numpy().tobytes()
