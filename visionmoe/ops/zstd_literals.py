"""Strict check of a zstd frame's Huffman-coded literals (RFC 8878 4.2.2): every Huffman literal
stream must decode exactly its regenerated size and end exactly at its first bit.

libzstd's fast Huffman loops (64-bit little-endian hosts: Python's ``zstandard`` there) do not
check where a stream ends, and decode some corrupt frames that its portable path (32-bit,
WebAssembly) and fzstd refuse. A caller that must refuse exactly what the RFC refuses runs this
after libzstd. The loops are in C++ (``csrc/codec/zstd_check_cpu.cpp``); where the extension
cannot load, or was built before it had them, the pure-Python reference
(:mod:`visionmoe.ops._zstd_literals_ref`, same results, about a microsecond per literal) runs
after the one warning of ``warn_fallback``.
"""

from __future__ import annotations

import numpy as np
import torch

from . import _zstd_literals_ref as _ref
from ._backend import _load, has_cpu_op, use_cpu_op

VALID = _ref.VALID
PROBLEMS = {
    _ref.BAD_FRAME_HEADER: "no zstd frame header",
    _ref.BAD_BLOCK: "a block runs past the end of the data or has the reserved type",
    _ref.BAD_LITERALS_HEADER: "a literals section does not fit its block",
    _ref.BAD_HUFFMAN_TABLE: "invalid Huffman tree description",
    _ref.NO_HUFFMAN_TABLE: "treeless literals with no earlier Huffman table",
    _ref.BAD_JUMP_TABLE: "invalid Huffman jump table",
    _ref.NO_END_MARK: "a Huffman literal stream has no end mark",
    _ref.INEXACT_STREAM: "a Huffman literal stream does not end exactly at its last bit",
}


class ZstdLiteralsError(ValueError):
    """A zstd frame's Huffman-coded literals are not exactly what RFC 8878 allows."""


def compiled_available() -> bool:
    """Whether the compiled check is there (the extension loads and has it)."""
    return has_cpu_op("zstd_literals_check")


def zstd_literals_status(frame: bytes, compiled: bool | None = None) -> tuple[int, int]:
    """(code, byte offset) of the first problem of the frame at the start of ``frame``'s Huffman
    literals, ``(VALID, 0)`` if none: by the C++ loops, or by the pure-Python reference when
    ``compiled`` is False or (None) when the extension cannot provide them."""
    if not use_cpu_op("zstd_literals_check", compiled):
        return _ref.zstd_literals_check(bytes(frame))
    data = torch.from_numpy(np.frombuffer(frame, dtype=np.uint8).copy())
    code, at = _load()[0].cpu.zstd_literals_check(data)
    return int(code), int(at)


def zstd_literals_check(frame: bytes) -> None:
    """Raise :class:`ZstdLiteralsError` (what and where) unless every Huffman literal stream of
    the zstd frame at the start of ``frame`` decodes exactly its size and ends at its last bit.
    Only the literals sections are read: run it on a frame libzstd decoded, for the one rule its
    fast path skips."""
    code, at = zstd_literals_status(frame)
    if code != VALID:
        raise ZstdLiteralsError(f"{PROBLEMS.get(code, f'problem {code}')} at byte {at}")
