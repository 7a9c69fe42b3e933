"""Byte coders of the .pgms integer and float streams: zigzag, byte planes, zstd, lzma, rANS.

Each ``*_compress``/``*_encode`` sits next to its inverse. Decoders raise :class:`FormatError`
(the one error type a .pgms decoder lets escape) for any corrupt input.
"""

from __future__ import annotations

import lzma
import struct

import numpy as np

from ..io import SceneError
from ._zstd import zstd_compressor

CODER_RAW, CODER_ZSTD, CODER_LZMA, CODER_RANS, CODER_RANS4 = 0, 1, 2, 3, 4
CODER_NAMES = {CODER_RAW: "raw", CODER_ZSTD: "zstd", CODER_LZMA: "lzma", CODER_RANS: "rans", CODER_RANS4: "rans4"}
# Format 4 writes raw, zstd and the portable interleaved rANS (``rans.py``); LZMA and
# constriction's rANS (coders 2 and 3) are read in format 1-3 files only.
ALL_CODERS = (CODER_RAW, CODER_ZSTD, CODER_RANS4)
LEGACY_CODERS = (CODER_LZMA, CODER_RANS)
# The allocator's rate probe: raw and rANS only (4-20x cheaper than trying every coder); a full
# encode picks the smallest of a superset, so a probe's size bounds the full encode's from above.
PROBE_CODERS = (CODER_RAW, CODER_RANS4)
_ZSTD_LEVEL = 19
_SLOW_CODER_LIMIT = 1 << 18  # bytes; larger streams use zstd level 9 and skip lzma


class FormatError(SceneError):
    """A .pgms file (or byte string) is not a valid PGMS bitstream; the message says where and why."""


def zigzag(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    return ((x << 1) ^ (x >> 63)).astype(np.uint64)


def unzigzag(u: np.ndarray) -> np.ndarray:
    u = np.asarray(u, dtype=np.uint64)
    return ((u >> np.uint64(1)).astype(np.int64)) ^ (-(u & np.uint64(1)).astype(np.int64))


def byte_width(maxval: int) -> int:
    return 1 if maxval < 1 << 8 else 2 if maxval < 1 << 16 else 4 if maxval < 1 << 32 else 8


def planes(u: np.ndarray, width: int) -> bytes:
    """Byte-plane shuffle: all low bytes, then all next bytes... (helps zstd/lzma on integers)."""
    b = u.astype(f"<u{width}").view(np.uint8).reshape(-1, width)
    return np.ascontiguousarray(b.T).tobytes()


def unplanes(raw: bytes, n: int, width: int) -> np.ndarray:
    b = np.frombuffer(raw, dtype=np.uint8).reshape(width, n)
    return np.ascontiguousarray(b.T).view(f"<u{width}").reshape(n).astype(np.uint64)


def zstd_compress(b: bytes) -> bytes:
    level = _ZSTD_LEVEL if len(b) <= _SLOW_CODER_LIMIT else 9  # level 19 costs seconds per MB
    return zstd_compressor(level).compress(b)


# A zstd block expands to at most 128 KiB and costs at least 4 bytes (an RLE block), so a frame
# of B bytes decodes to at most 32768 B bytes: a stream that claims more is refused before
# zstandard allocates its output buffer.
_ZSTD_MAX_EXPANSION = 1 << 15
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _zstd_frame_length(b: bytes) -> int:
    """Bytes of the one zstd frame at the start of ``b`` (walks the block headers; nothing decoded)."""
    import zstandard

    if b[:4] != _ZSTD_MAGIC:
        raise FormatError("corrupt zstd stream (no zstd frame magic)")
    try:
        pos = zstandard.frame_header_size(b)
    except zstandard.ZstdError as exc:
        raise FormatError(f"corrupt zstd stream ({exc})") from None
    checksum = bool(b[4] & 0x04)
    while True:
        if pos + 3 > len(b):
            raise FormatError("corrupt zstd stream (truncated block header)")
        h = b[pos] | b[pos + 1] << 8 | b[pos + 2] << 16
        last, btype, bsize = h & 1, (h >> 1) & 3, h >> 3
        if btype == 3:
            raise FormatError("corrupt zstd stream (reserved block type)")
        pos += 3 + (1 if btype == 1 else bsize)
        if last:
            return pos + (4 if checksum else 0)


def zstd_decompress(b: bytes, size: int) -> bytes:
    import zstandard

    from ...ops.zstd_literals import ZstdLiteralsError, zstd_literals_check

    if size > _ZSTD_MAX_EXPANSION * len(b) + 64:
        raise FormatError(f"zstd stream of {len(b)} bytes cannot hold the {size} bytes it claims")
    end = _zstd_frame_length(b) if size else len(b)
    if end != len(b):
        raise FormatError(f"zstd stream of {len(b)} bytes: {len(b) - end} bytes follow its frame")
    try:
        # The encoder writes no content size; a frame header that declares one other than the
        # stream's is corrupt, and zstandard would allocate what it declares (a flipped header
        # byte asked for petabytes: MemoryError) before ``max_output_size`` applies.
        declared = zstandard.frame_content_size(b)
        if declared not in (-1, size):
            raise FormatError(f"corrupt zstd stream (its frame declares {declared} bytes, expected {size})")
        out = zstandard.ZstdDecompressor().decompress(b, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise FormatError(f"corrupt zstd stream ({exc})") from None
    if len(out) != size:
        raise FormatError(f"zstd stream decoded to {len(out)} bytes, expected {size}")
    # libzstd's fast Huffman path (64-bit hosts) decodes literal streams that do not end exactly
    # at their last bit; RFC 8878, its portable path and fzstd refuse them: so does this decoder
    try:
        zstd_literals_check(b)
    except ZstdLiteralsError as exc:
        raise FormatError(f"corrupt zstd stream ({exc})") from None
    return out


_LZMA_FILTERS = ({"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": 1 << 20},)


def lzma_compress(b: bytes) -> bytes:
    return lzma.compress(b, format=lzma.FORMAT_RAW, filters=list(_LZMA_FILTERS))


def lzma_decompress(b: bytes, size: int) -> bytes:
    d = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=list(_LZMA_FILTERS))
    try:
        out = d.decompress(b, max_length=size + 1)
    except lzma.LZMAError as exc:
        raise FormatError(f"corrupt lzma stream ({exc})") from None
    if len(out) != size or not d.eof:
        raise FormatError(f"lzma stream decoded to {len(out)} bytes (complete: {d.eof}), expected {size}")
    if d.unused_data:
        raise FormatError(f"lzma stream: {len(d.unused_data)} bytes follow its end")
    return out


def rans4_encode(u: np.ndarray, alphabet: int) -> bytes:
    """Coder 4 (format 4): the portable interleaved rANS of :mod:`.rans`."""
    from . import rans

    return rans.encode(u, alphabet)


def rans4_decode(b: bytes, n: int, alphabet: int) -> np.ndarray:
    from . import rans

    try:
        return rans.decode(b, n, alphabet)
    except rans.RansError as exc:
        raise FormatError(f"corrupt rANS stream ({exc})") from None


def rans_encode(u: np.ndarray, alphabet: int) -> bytes:
    """Coder 3 (formats 1-3): constriction's rANS under its float-probability model."""
    import constriction

    # the model needs two symbols at least (a one-symbol alphabet gets a zero-count second one)
    counts = np.bincount(u.astype(np.int64), minlength=max(alphabet, 2)).astype(np.uint32)
    model = constriction.stream.model.Categorical(counts.astype(np.float64) / counts.sum(), perfect=False)
    coder = constriction.stream.stack.AnsCoder()
    coder.encode_reverse(u.astype(np.int32), model)
    words = coder.get_compressed().astype("<u4").tobytes()
    table = zstd_compress(counts.astype("<u4").tobytes())
    return struct.pack("<I", len(table)) + table + words


def rans_decode(b: bytes, n: int, alphabet: int) -> np.ndarray:
    import constriction

    if len(b) < 4:
        raise FormatError("rANS stream shorter than its table length field")
    (tlen,) = struct.unpack_from("<I", b, 0)
    if 4 + tlen > len(b):
        raise FormatError(f"rANS table declares {tlen} bytes, {len(b) - 4} remain")
    counts = np.frombuffer(zstd_decompress(b[4: 4 + tlen], 4 * max(alphabet, 2)), dtype="<u4").astype(np.float64)
    total = counts.sum()
    if total <= 0:
        raise FormatError("rANS model has no nonzero counts")
    words = b[4 + tlen:]
    if len(words) % 4:
        raise FormatError(f"rANS payload of {len(words)} bytes is not a whole number of 32-bit words")
    try:
        model = constriction.stream.model.Categorical(counts / total, perfect=False)
        coder = constriction.stream.stack.AnsCoder(np.frombuffer(words, dtype="<u4").astype(np.uint32))
        out = coder.decode(model, n)
    except Exception as exc:  # constriction reports bad data as ValueError/AssertionError
        raise FormatError(f"corrupt rANS stream ({type(exc).__name__}: {exc})") from None
    return np.asarray(out, dtype=np.int64).astype(np.uint64)

