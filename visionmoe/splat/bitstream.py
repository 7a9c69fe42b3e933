"""The .pgms container: magic, version, checksummed sections, entropy-coded integer streams.

Layout (all integers little-endian; the full specification is ``docs/FORMAT.md``)::

    file     = preamble section*
    preamble = magic "\\x89PGMS\\r\\n\\x1a" (8 bytes) | major u16 | minor u16
    section  = tag 4s | level u8 | reserved u8 (0) | reserved u16 (0) | length u32
               | crc32 u32 (over the 12 header bytes before it and the payload) | payload

The first section is ``HEAD`` (global parameters), then global sections (codebooks), then one
``LEVL`` section per pyramid level, coarse to fine, then ``END``. A decoder that stops after
level ``l`` has read a byte prefix of the file: the format is progressive by construction.

A payload holds *streams*: arrays of integers (or raw float16/float32 tables), each coded with
whichever of four coders gave the fewest bytes for that stream when it was written (the
choice is stored, so decoding never guesses): raw little-endian, zstd on byte planes, lzma on
byte planes, or rANS (``constriction``) under a stored static categorical model.

Every check a decoder makes raises :class:`FormatError`, the one error type that escapes
:func:`read_container` and :class:`StreamReader` for any input bytes.
"""

from __future__ import annotations

import hashlib
import lzma
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from . import _frames
from .io import SceneError

MAGIC = b"\x89PGMS\r\n\x1a"
VERSION = (3, 0)
# 1.x (no PALT section) and 2.x (absolute fine-tier shapes, world-axis offsets) decode unchanged
READABLE_MAJORS = (1, 2, 3)
SECTION_HEADER = struct.Struct("<4sBBHI")  # tag, level, reserved, reserved, length
STREAM_HEAD = struct.Struct("<BBBBIQI")  # kind, coder, width, pad, n, alphabet, coded size
GLOBAL_LEVEL = 0xFF
MAX_SECTION_BYTES = 1 << 31
MAX_SYMBOLS = 1 << 30
MAX_ALPHABET = 1 << 16

CODER_RAW, CODER_ZSTD, CODER_LZMA, CODER_RANS = 0, 1, 2, 3
CODER_NAMES = {CODER_RAW: "raw", CODER_ZSTD: "zstd", CODER_LZMA: "lzma", CODER_RANS: "rans"}
KIND_INT, KIND_F16, KIND_F32 = 0, 1, 2
_ZSTD_LEVEL = 19
_SLOW_CODER_LIMIT = 1 << 18  # bytes; larger streams use zstd level 9 and skip lzma


class FormatError(SceneError):
    """A .pgms file (or byte string) is not a valid PGMS bitstream; the message says where and why."""


@dataclass(frozen=True)
class Section:
    tag: str
    level: int  # GLOBAL_LEVEL for global sections
    payload: bytes
    offset: int = 0  # byte offset of the section header in the file


# --------------------------------------------------------------------------- container


def pack_section(tag: str, payload: bytes, level: int = GLOBAL_LEVEL) -> bytes:
    tagb = tag.encode("ascii")
    if len(tagb) != 4:
        raise ValueError(f"section tag must be 4 ASCII characters, got {tag!r}")
    if len(payload) >= MAX_SECTION_BYTES:
        raise ValueError(f"section {tag} payload of {len(payload)} bytes exceeds the {MAX_SECTION_BYTES}-byte limit")
    head = SECTION_HEADER.pack(tagb, level, 0, 0, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(head))
    return head + struct.pack("<I", crc) + payload


def pack_preamble() -> bytes:
    return MAGIC + struct.pack("<HH", *VERSION)


def read_preamble(data: bytes | memoryview) -> tuple[int, int]:
    if len(data) < 12:
        raise FormatError(f"not a .pgms file: {len(data)} bytes, shorter than the 12-byte preamble")
    if bytes(data[:8]) != MAGIC:
        raise FormatError(f"not a .pgms file: magic {bytes(data[:8])!r}, expected {MAGIC!r}")
    major, minor = struct.unpack_from("<HH", data, 8)
    if major not in READABLE_MAJORS:
        raise FormatError(
            f".pgms format version {major}.{minor} is not supported by this decoder (reads "
            f"{', '.join(f'{m}.x' for m in READABLE_MAJORS)}); "
            "upgrade visionmoe or re-encode"
        )
    return major, minor


def iter_sections(data: bytes | memoryview, start: int = 12):
    """Yield sections in file order, verifying lengths and CRCs; stops at ``END``."""
    pos, n = start, len(data)
    while True:
        if pos + 16 > n:
            raise FormatError(f"truncated .pgms: section header at byte {pos} needs 16 bytes, {n - pos} remain")
        tagb, level, r1, r2, length = SECTION_HEADER.unpack_from(data, pos)
        (crc,) = struct.unpack_from("<I", data, pos + 12)
        try:
            tag = tagb.decode("ascii")
        except UnicodeDecodeError:
            raise FormatError(f"corrupt .pgms: section tag {tagb!r} at byte {pos} is not ASCII") from None
        if not tag.isalnum():
            raise FormatError(f"corrupt .pgms: section tag {tagb!r} at byte {pos}")
        if r1 or r2:
            raise FormatError(f"corrupt .pgms: reserved bytes of section {tag} at byte {pos} are not zero")
        if pos + 16 + length > n:
            raise FormatError(
                f"truncated .pgms: section {tag} at byte {pos} declares {length} payload bytes, {n - pos - 16} remain"
            )
        payload = bytes(data[pos + 16: pos + 16 + length])
        if zlib.crc32(payload, zlib.crc32(bytes(data[pos: pos + 12]))) != crc:
            raise FormatError(f"corrupt .pgms: checksum mismatch in section {tag} (level {level}) at byte {pos}")
        yield Section(tag, level, payload, pos)
        pos += 16 + length
        if tag == "END0":
            if pos != n:
                raise FormatError(f"corrupt .pgms: {n - pos} unexpected bytes after the END0 section")
            return


# --------------------------------------------------------------------------- streams


def zigzag(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    return ((x << 1) ^ (x >> 63)).astype(np.uint64)


def unzigzag(u: np.ndarray) -> np.ndarray:
    u = np.asarray(u, dtype=np.uint64)
    return ((u >> np.uint64(1)).astype(np.int64)) ^ (-(u & np.uint64(1)).astype(np.int64))


def _width(maxval: int) -> int:
    return 1 if maxval < 1 << 8 else 2 if maxval < 1 << 16 else 4 if maxval < 1 << 32 else 8


def _planes(u: np.ndarray, width: int) -> bytes:
    """Byte-plane shuffle: all low bytes, then all next bytes... (helps zstd/lzma on integers)."""
    b = u.astype(f"<u{width}").view(np.uint8).reshape(-1, width)
    return np.ascontiguousarray(b.T).tobytes()


def _unplanes(raw: bytes, n: int, width: int) -> np.ndarray:
    b = np.frombuffer(raw, dtype=np.uint8).reshape(width, n)
    return np.ascontiguousarray(b.T).view(f"<u{width}").reshape(n).astype(np.uint64)


def _zstd_compress(b: bytes) -> bytes:
    import zstandard

    level = _ZSTD_LEVEL if len(b) <= _SLOW_CODER_LIMIT else 9  # level 19 costs seconds per MB
    return zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=False).compress(b)


def _zstd_decompress(b: bytes, size: int) -> bytes:
    import zstandard

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
    return out


_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": 1 << 20}]


def _lzma_compress(b: bytes) -> bytes:
    return lzma.compress(b, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)


def _lzma_decompress(b: bytes, size: int) -> bytes:
    d = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    try:
        out = d.decompress(b, max_length=size + 1)
    except lzma.LZMAError as exc:
        raise FormatError(f"corrupt lzma stream ({exc})") from None
    if len(out) != size or not d.eof:
        raise FormatError(f"lzma stream decoded to {len(out)} bytes (complete: {d.eof}), expected {size}")
    return out


def _rans_encode(u: np.ndarray, alphabet: int) -> bytes:
    import constriction

    # the model needs two symbols at least (a one-symbol alphabet gets a zero-count second one)
    counts = np.bincount(u.astype(np.int64), minlength=max(alphabet, 2)).astype(np.uint32)
    model = constriction.stream.model.Categorical(counts.astype(np.float64) / counts.sum(), perfect=False)
    coder = constriction.stream.stack.AnsCoder()
    coder.encode_reverse(u.astype(np.int32), model)
    words = coder.get_compressed().astype("<u4").tobytes()
    table = _zstd_compress(counts.astype("<u4").tobytes())
    return struct.pack("<I", len(table)) + table + words


def _rans_decode(b: bytes, n: int, alphabet: int) -> np.ndarray:
    import constriction

    if len(b) < 4:
        raise FormatError("rANS stream shorter than its table length field")
    (tlen,) = struct.unpack_from("<I", b, 0)
    if 4 + tlen > len(b):
        raise FormatError(f"rANS table declares {tlen} bytes, {len(b) - 4} remain")
    counts = np.frombuffer(_zstd_decompress(b[4: 4 + tlen], 4 * max(alphabet, 2)), dtype="<u4").astype(np.float64)
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


def encode_ints(values: np.ndarray, *, coders: tuple[int, ...] = (CODER_RAW, CODER_ZSTD, CODER_LZMA, CODER_RANS)) -> bytes:
    """Code a signed integer array with whichever coder is smallest (ties: lowest coder id).

    Stream layout: kind u8 (0) | coder u8 | width u8 | pad u8 | n u32 | alphabet u64 | size u32 | bytes.
    ``alphabet`` is max(zigzag(values)) + 1; ``size`` is the coded byte count.
    """
    v = np.asarray(values).reshape(-1)
    if v.size >= MAX_SYMBOLS:
        raise ValueError(f"stream of {v.size} symbols exceeds the {MAX_SYMBOLS} limit")
    u = zigzag(v)
    alphabet = int(u.max()) + 1 if u.size else 0
    width = _width(max(alphabet - 1, 0))
    raw = _planes(u, width)
    candidates = {CODER_RAW: raw}
    if u.size:
        if CODER_ZSTD in coders:
            candidates[CODER_ZSTD] = _zstd_compress(raw)
        if CODER_LZMA in coders and len(raw) <= _SLOW_CODER_LIMIT:  # lzma: seconds per MB, rarely wins on big streams
            candidates[CODER_LZMA] = _lzma_compress(raw)
        if CODER_RANS in coders and alphabet <= MAX_ALPHABET:
            candidates[CODER_RANS] = _rans_encode(u, alphabet)
    coder = min(candidates, key=lambda c: (len(candidates[c]), c))
    body = candidates[coder]
    return STREAM_HEAD.pack(KIND_INT, coder, width, 0, v.size, alphabet, len(body)) + body


def encode_floats(values: np.ndarray, *, half: bool = True) -> bytes:
    """A float table (codebooks, origins): float16 or float32, zstd-coded when that is smaller."""
    v = np.asarray(values, dtype=np.float16 if half else np.float32).reshape(-1)
    if not np.isfinite(v).all():
        raise ValueError("float stream holds NaN/Inf (or a value beyond float16 range)")
    width = 2 if half else 4
    raw = _planes(v.view(f"<u{width}"), width)
    z = _zstd_compress(raw) if v.size else raw
    coder, body = (CODER_ZSTD, z) if len(z) < len(raw) else (CODER_RAW, raw)
    kind = KIND_F16 if half else KIND_F32
    return STREAM_HEAD.pack(kind, coder, width, 0, v.size, 0, len(body)) + body


class StreamWriter:
    """Concatenates streams into one section payload."""

    def __init__(self):
        self.parts: list[bytes] = []
        self.stats: list[tuple[str, int, str]] = []  # (name, bytes, coder) for reports

    def ints(self, name: str, values: np.ndarray) -> None:
        b = encode_ints(values)
        self.parts.append(b)
        self.stats.append((name, len(b), CODER_NAMES[b[1]]))

    def floats(self, name: str, values: np.ndarray, *, half: bool = True) -> None:
        b = encode_floats(values, half=half)
        self.parts.append(b)
        self.stats.append((name, len(b), CODER_NAMES[b[1]]))

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class StreamReader:
    """Reads the streams of one section payload in order, validating every field."""

    def __init__(self, payload: bytes, where: str):
        self.b, self.pos, self.where = payload, 0, where

    def _head(self, name: str):
        if self.pos + STREAM_HEAD.size > len(self.b):
            raise FormatError(f"{self.where}: stream {name!r} truncated (needs {STREAM_HEAD.size} header bytes, "
                              f"{len(self.b) - self.pos} remain)")
        kind, coder, width, pad, n, alphabet, size = STREAM_HEAD.unpack_from(self.b, self.pos)
        self.pos += STREAM_HEAD.size
        if pad or coder not in CODER_NAMES or width not in (1, 2, 4, 8) or n >= MAX_SYMBOLS:
            raise FormatError(f"{self.where}: stream {name!r} has an invalid header (coder {coder}, width {width}, n {n})")
        if self.pos + size > len(self.b):
            raise FormatError(f"{self.where}: stream {name!r} declares {size} bytes, {len(self.b) - self.pos} remain")
        body = self.b[self.pos: self.pos + size]
        self.pos += size
        return kind, coder, width, n, alphabet, body

    def _peek_head(self, name: str):
        pos = self.pos
        try:
            return self._head(name)
        finally:
            self.pos = pos

    def ints(self, name: str, n_expected: int | None = None, lo: int | None = None, hi: int | None = None) -> np.ndarray:
        kind, coder, width, n, alphabet, body = self._head(name)
        if kind != KIND_INT:
            raise FormatError(f"{self.where}: stream {name!r} is not an integer stream")
        if n_expected is not None and n != n_expected:
            raise FormatError(f"{self.where}: stream {name!r} holds {n} values, expected {n_expected}")
        if alphabet > (1 << (8 * width)) or (n and alphabet == 0):
            raise FormatError(f"{self.where}: stream {name!r} alphabet {alphabet} does not fit width {width}")
        size = n * width
        if coder == CODER_RAW:
            if len(body) != size:
                raise FormatError(f"{self.where}: raw stream {name!r} has {len(body)} bytes, expected {size}")
            u = _unplanes(body, n, width)
        elif coder == CODER_ZSTD:
            u = _unplanes(_zstd_decompress(body, size), n, width)
        elif coder == CODER_LZMA:
            u = _unplanes(_lzma_decompress(body, size), n, width)
        else:
            if alphabet > MAX_ALPHABET:
                raise FormatError(f"{self.where}: rANS stream {name!r} alphabet {alphabet} exceeds {MAX_ALPHABET}")
            u = _rans_decode(body, n, alphabet)
        if n and int(u.max()) >= alphabet:
            raise FormatError(f"{self.where}: stream {name!r} holds a symbol outside its declared alphabet")
        v = unzigzag(u)
        if n and ((lo is not None and int(v.min()) < lo) or (hi is not None and int(v.max()) > hi)):
            raise FormatError(f"{self.where}: stream {name!r} values [{int(v.min())}, {int(v.max())}] outside [{lo}, {hi}]")
        return v

    def floats(self, name: str, n_expected: int | None = None) -> np.ndarray:
        kind, coder, width, n, _alphabet, body = self._head(name)
        if kind not in (KIND_F16, KIND_F32) or width != (2 if kind == KIND_F16 else 4) or coder not in (CODER_RAW, CODER_ZSTD):
            raise FormatError(f"{self.where}: stream {name!r} is not a float stream")
        if n_expected is not None and n != n_expected:
            raise FormatError(f"{self.where}: stream {name!r} holds {n} values, expected {n_expected}")
        size = n * width
        raw = body if coder == CODER_RAW else _zstd_decompress(body, size)
        if len(raw) != size:
            raise FormatError(f"{self.where}: float stream {name!r} has {len(raw)} bytes, expected {size}")
        v = _unplanes(raw, n, width).astype(f"<u{width}").view(np.float16 if width == 2 else np.float32)
        if not np.isfinite(v).all():
            raise FormatError(f"{self.where}: float stream {name!r} holds NaN/Inf")
        return v.astype(np.float32)

    def done(self) -> None:
        if self.pos != len(self.b):
            raise FormatError(f"{self.where}: {len(self.b) - self.pos} unexpected bytes after the last stream")


# --------------------------------------------------------------------------- PGMS layout (v1)
#
# Everything below maps a coded pyramid (levels of Gaussians, child counts, codebooks and
# quantiser settings) to sections and back. docs/FORMAT.md is the normative description.

HEAD = struct.Struct("<BBBBIIIIffffBBHIIfffQ")
MAX_NODES = 1 << 28
MAX_CHILDREN = 255


@dataclass(frozen=True)
class Quantizer:
    """Quantiser settings of one encoding (stored in HEAD)."""

    pos_rel: float  # position step as a fraction of a node's geometric-mean scale
    dc_step: float  # SH DC step
    ls_step: float  # log-scale step (fine tier)
    min_step: float  # smallest position step (scene units)
    op_bits: int  # opacity bits (uniform in alpha)
    rot_bits: int  # bits per smallest-three quaternion component (fine tier)

    def __post_init__(self):
        for name in ("pos_rel", "dc_step", "ls_step", "min_step"):
            v = getattr(self, name)
            if not (np.isfinite(v) and 0 < v < 1e6):
                raise FormatError(f"quantiser {name}={v} outside (0, 1e6)")
        if not 1 <= self.op_bits <= 16 or not 2 <= self.rot_bits <= 16:
            raise FormatError(f"quantiser bits out of range (opacity {self.op_bits}, rotation {self.rot_bits})")


@dataclass(frozen=True)
class ShGrid:
    """Per-primitive view-dependent SH (section SHQP): the first ``(degree+1)^2 - 1`` bands of
    each fine-tier node with ``sh_flag`` coded as integers ``round(coefficient / step)``."""

    degree: int
    step: float

    def __post_init__(self):
        if not 1 <= self.degree <= 3 or not (np.isfinite(self.step) and 1e-6 < self.step < 1e3):
            raise FormatError(f"SHQP: degree {self.degree} / step {self.step} out of range (1-3, (1e-6, 1e3))")

    @property
    def coefficients(self) -> int:
        return (self.degree + 1) ** 2 - 1


SHQP = struct.Struct("<BBHf")  # degree, reserved, reserved, step


PALETTE_CHANNELS = ("dc0", "dc1", "dc2", "op", "ls0", "ls1", "ls2")
PALETTE_NONE, PALETTE_ABSOLUTE, PALETTE_PREDICTED = 0, 1, 2
MAX_PALETTE = 4096


@dataclass
class Palettes:
    """Value tables of fine-tier attribute channels that sit on a small set of values (section PALT).

    Scenes decoded from lossy formats (8-bit colour and opacity, codebook scales) hold few
    distinct values per channel; coding the index into the sorted table of those values is
    lossless and cheaper than a uniform step fine enough to keep them. Channels (see
    :data:`PALETTE_CHANNELS`): SH DC per colour (the value), opacity (the logit), log-scale per
    axis. ``mode[ch]``: PALETTE_ABSOLUTE codes the index, PALETTE_PREDICTED (DC only) codes the
    index minus the index nearest the decoded parent's DC value.
    """

    values: dict  # channel -> float32 [K] strictly increasing
    mode: dict  # channel -> PALETTE_ABSOLUTE | PALETTE_PREDICTED

    def subset(self, channels) -> "Palettes | None":
        keep = [c for c in PALETTE_CHANNELS if c in channels and c in self.values]
        if not keep:
            return None
        return Palettes({c: self.values[c] for c in keep}, {c: self.mode[c] for c in keep})

    def gap(self, ch: str, domain=None) -> float:
        """Median spacing of a channel's table (in ``domain(values)`` when given)."""
        v = self.values[ch].astype(np.float64)
        v = domain(v) if domain is not None else v
        return float(np.median(np.diff(v))) if len(v) > 1 else float("inf")


def _nearest_index(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index [N] of the nearest entry of a sorted table to each x."""
    t = table.astype(np.float64)
    x = np.asarray(x, np.float64)
    j = np.clip(np.searchsorted(t, x), 1, max(len(t) - 1, 1))
    if len(t) == 1:
        return np.zeros(len(x), np.int64)
    left = t[j - 1]
    right = t[j]
    return np.where(np.abs(x - left) <= np.abs(right - x), j - 1, j).astype(np.int64)


def _entropy(v: np.ndarray) -> float:
    _, c = np.unique(v, return_counts=True)
    p = c / c.sum()
    return float(-(p * np.log2(p)).sum())


def detect_palettes(leaves, parent_dc: np.ndarray | None = None, max_size: int = MAX_PALETTE) -> Palettes | None:
    """Find the channels of the fine tier (``leaves``, a GaussianScene) that take at most
    ``max_size`` (and at most N/4) distinct values; DC channels get PALETTE_PREDICTED when
    the index residual against the parent's DC (``parent_dc`` [N, 3]) has lower entropy."""
    n = leaves.num_gaussians
    cols = {"op": leaves.opacity_logits.numpy().reshape(-1)}
    for c in range(3):
        cols[f"dc{c}"] = leaves.sh_dc.numpy()[:, c]
        cols[f"ls{c}"] = leaves.log_scales.numpy()[:, c]
    values, mode = {}, {}
    for ch in PALETTE_CHANNELS:
        x = np.asarray(cols[ch], np.float32)
        if n < 64 or not np.isfinite(x).all():
            continue
        u = np.unique(x)
        if len(u) > min(max_size, n // 4):
            continue
        values[ch] = u
        mode[ch] = PALETTE_ABSOLUTE
        if ch.startswith("dc") and parent_dc is not None and len(u) > 1:
            idx = _nearest_index(u, x)
            pidx = _nearest_index(u, parent_dc[:, int(ch[2])])
            if _entropy(idx - pidx) < _entropy(idx):
                mode[ch] = PALETTE_PREDICTED
    return Palettes(values, mode) if values else None


def write_palettes(w: "StreamWriter", pal: Palettes) -> None:
    w.ints("palette_mode", np.array([pal.mode.get(c, PALETTE_NONE) if c in pal.values else PALETTE_NONE
                                     for c in PALETTE_CHANNELS], np.int64))
    for c in PALETTE_CHANNELS:
        if c in pal.values:
            w.floats(f"palette_{c}", pal.values[c], half=False)


def read_palettes(payload: bytes) -> Palettes:
    r = StreamReader(payload, "PALT")
    modes = r.ints("palette_mode", len(PALETTE_CHANNELS), 0, 2)
    values, mode = {}, {}
    for c, m in zip(PALETTE_CHANNELS, modes.tolist()):
        if m == PALETTE_NONE:
            continue
        if m == PALETTE_PREDICTED and not c.startswith("dc"):
            raise FormatError(f"PALT: channel {c} cannot be parent-predicted (only dc0-dc2)")
        kind, coder, width, n, _a, _b = r._peek_head(f"palette_{c}")
        if not 1 <= n <= MAX_PALETTE:
            raise FormatError(f"PALT: palette {c} has {n} entries, expected 1-{MAX_PALETTE}")
        v = r.floats(f"palette_{c}", n)
        if kind != KIND_F32 or (n > 1 and not (np.diff(v.astype(np.float64)) > 0).all()):
            raise FormatError(f"PALT: palette {c} is not a strictly increasing float32 table")
        if c.startswith("ls") and np.abs(v).max() > 80:
            raise FormatError(f"PALT: palette {c} holds log-scales out of range")
        values[c], mode[c] = v.astype(np.float32), m
    r.done()
    if not values:
        raise FormatError("PALT: section present but no channel has a palette")
    return Palettes(values, mode)


def _q_rot(quats: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    q = quats / np.maximum(np.linalg.norm(quats, axis=1, keepdims=True), 1e-12)
    big = np.argmax(np.abs(q), axis=1)
    q = q * np.where(q[np.arange(len(q)), big] < 0, -1.0, 1.0)[:, None]
    others = _drop_col(q, big)
    s = 1 / np.sqrt(2)
    levels = (1 << bits) - 1
    u = np.clip(np.round((others + s) / (2 * s) * levels), 0, levels).astype(np.int64)
    return big.astype(np.int64), u


def _drop_col(q: np.ndarray, big: np.ndarray) -> np.ndarray:
    idx = np.arange(4)[None, :].repeat(len(q), 0)
    keep = idx != big[:, None]
    return q[keep].reshape(len(q), 3)


def _dq_rot(big: np.ndarray, u: np.ndarray, bits: int) -> np.ndarray:
    s = 1 / np.sqrt(2)
    others = u.astype(np.float64) / ((1 << bits) - 1) * 2 * s - s
    largest = np.sqrt(np.clip(1 - (others**2).sum(1), 0, 1))
    q = np.zeros((len(u), 4))
    idx = np.arange(4)[None, :].repeat(len(u), 0)
    keep = idx != big[:, None]
    q[keep] = others.reshape(-1)
    q[np.arange(len(u)), big] = largest
    return q.astype(np.float32)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _pos_step(log_scales: np.ndarray, quant: Quantizer) -> np.ndarray:
    return np.maximum(quant.pos_rel * np.exp(log_scales.astype(np.float64).mean(1)), quant.min_step)[:, None]


def identity_frames(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rotation and log-scales of the level-0 nodes' virtual parent (format 3)."""
    q = np.zeros((n, 4), np.float32)
    q[:, 0] = 1
    return q, np.zeros((n, 3), np.float32)


def _relative_log_scales(parent_ls: np.ndarray, lsq: np.ndarray, step: float) -> np.ndarray:
    return (parent_ls.astype(np.float64) + lsq * step).astype(np.float32)


def _child_means(parent_means: np.ndarray, parent_quats: np.ndarray, off: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Format 3: position offsets are quantised along the decoded parent's axes."""
    return parent_means + _frames.from_parent_frame(parent_quats, off * step)


def quantize_level(nodes, parent_means, parent_dcq, fine: bool, quant: Quantizer, shape_codebook,
                   sh_keep=None, sh_codebook=None, palettes: Palettes | None = None,
                   parent_quats: np.ndarray | None = None, parent_ls: np.ndarray | None = None,
                   memo: dict | None = None):
    """Quantise one level's nodes (closed loop on the decoded parents): -> (symbol dict, decoded arrays).

    ``palettes`` (fine tier only): channels coded as indices into value tables (lossless).
    ``parent_quats`` / ``parent_ls``: the decoded parents' rotations and log-scales (identity
    and zeros, the level-0 default): fine-tier shapes and every position offset are coded in
    the parent's frame (:mod:`._frames`).
    ``memo``: a dict kept by the caller for these same ``nodes``; the preset-independent steps
    (nearest-prototype search, relabelling to the parents' axes) are reused from it when their
    inputs are equal (the rungs an allocator tries share codebooks and decoded parents)."""
    import torch

    from .prototypes import assign, shape_features, shape_from_features

    means = nodes.means.numpy().astype(np.float64)
    n = nodes.num_gaussians
    if parent_quats is None or parent_ls is None:
        parent_quats, parent_ls = identity_frames(n)
    sym = {}
    if fine:
        ls_palette = palettes is not None and any(f"ls{a}" in palettes.values for a in range(3))
        # scale tables are per axis: keep the axis order when one is used
        rel_q, ls_in = _memoised(
            memo, ("relabel", _digest(parent_quats), not ls_palette),
            lambda: _frames.relabel_to_parent(parent_quats, nodes.quats.numpy(), nodes.log_scales.numpy(),
                                              allow_permute=not ls_palette), last_only=True)
        lsq = np.round((ls_in - parent_ls) / quant.ls_step).astype(np.int64)
        log_scales = _relative_log_scales(parent_ls, lsq, quant.ls_step)
        for a in range(3):
            if palettes is not None and f"ls{a}" in palettes.values:
                tab = palettes.values[f"ls{a}"]
                lsq[:, a] = _nearest_index(tab, ls_in[:, a])
                log_scales[:, a] = tab[lsq[:, a]]
        big, u = _q_rot(rel_q, quant.rot_bits)
        sym["ls"], sym["rot_i"], sym["rot_q"] = lsq, big, u
        quats = _frames.compose(parent_quats, _dq_rot(big, u, quant.rot_bits)).astype(np.float32)
    else:
        idx = _memoised(memo, ("shape", _digest(shape_codebook)),
                        lambda: assign(shape_features(nodes.log_scales, nodes.quats),
                                       torch.from_numpy(shape_codebook)).numpy())
        sym["shape"] = idx
        ls_t, q_t = shape_from_features(torch.from_numpy(shape_codebook).float())  # decode the table once
        log_scales, quats = ls_t.numpy()[idx], q_t.numpy()[idx]
    step = _pos_step(log_scales, quant)
    off = np.round(_frames.to_parent_frame(parent_quats, means - parent_means) / step).astype(np.int64)
    sym["pos"] = off
    dec_means = _child_means(parent_means, parent_quats, off, step).astype(np.float32)
    dc_in = nodes.sh_dc.numpy()
    dcq = np.round(dc_in / quant.dc_step).astype(np.int64)
    sym["dc"] = dcq - parent_dcq
    dc = (dcq * quant.dc_step).astype(np.float32)
    pal = palettes if fine else None
    for c in range(3):
        if pal is not None and f"dc{c}" in pal.values:
            tab = pal.values[f"dc{c}"]
            idx = _nearest_index(tab, dc_in[:, c])
            dc[:, c] = tab[idx]
            pred = _nearest_index(tab, parent_dcq[:, c] * quant.dc_step) if pal.mode[f"dc{c}"] == PALETTE_PREDICTED else 0
            sym["dc"][:, c] = idx - pred
    if not (pal is not None and any(f"dc{c}" in pal.values for c in range(3))):
        sym["dc"] = decorrelate_dc(sym["dc"])
    levels_op = (1 << quant.op_bits) - 1
    logit_in = nodes.opacity_logits.numpy().astype(np.float64)
    opq = np.clip(np.round(_sigmoid(logit_in) * levels_op), 0, levels_op).astype(np.int64)
    op_logit = None
    if pal is not None and "op" in pal.values:
        opq = _nearest_index(pal.values["op"], logit_in)
        op_logit = pal.values["op"][opq]
    sym["op"] = opq
    n = nodes.num_gaussians
    rest = np.zeros((n, nodes.sh_rest.shape[1], 3), np.float32)
    if fine and isinstance(sh_codebook, ShGrid) and sh_keep is not None:
        k_cb = sh_codebook.coefficients
        sym["sh_flag"] = sh_keep.astype(np.int64)
        shq = np.round(nodes.sh_rest[:, :k_cb].numpy().astype(np.float64) / sh_codebook.step).astype(np.int64)
        shq[~sh_keep] = 0
        sym["sh_q"] = shq
        rest[sh_keep, :k_cb] = (shq[sh_keep] * sh_codebook.step).astype(np.float32)
    elif fine and sh_codebook is not None and sh_keep is not None:
        k_cb = sh_codebook.shape[1]
        sym["sh_flag"] = sh_keep.astype(np.int64)
        sym["sh_idx"] = np.zeros(n, np.int64)
        if sh_keep.any():
            sidx = _memoised(memo, ("sh", _digest(sh_codebook), _digest(sh_keep)), lambda: assign(
                nodes.sh_rest[torch.from_numpy(sh_keep), :k_cb].reshape(int(sh_keep.sum()), -1),
                torch.from_numpy(sh_codebook.reshape(len(sh_codebook), -1))).numpy())
            sym["sh_idx"][sh_keep] = sidx
            rest[sh_keep, :k_cb] = sh_codebook[sidx]
    if op_logit is not None:
        alpha = _sigmoid(op_logit.astype(np.float64)).astype(np.float32)
    else:
        alpha = _alpha_from_q(opq, quant.op_bits)
    decoded = dict(means=dec_means, log_scales=log_scales, quats=quats, dcq=dcq, dc=dc, alpha=alpha, rest=rest)
    if op_logit is not None:
        decoded["op_logit"] = op_logit
    return sym, decoded


def _digest(a: np.ndarray) -> tuple:
    a = np.ascontiguousarray(a)
    return a.dtype.str, a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).digest()


def _memoised(memo: dict | None, key, compute, last_only: bool = False):
    """``compute()`` through ``memo``; ``last_only``: keep one entry of the key's kind (key[0]),
    for results as large as the level (seven floats per node for the relabelling)."""
    if memo is None:
        return compute()
    value = memo.get(key)
    if value is None:  # (the encoder may quantise two rungs on two threads: no step assumes
        value = compute()  # the entry it stored is still there)
        if last_only:
            for k in [k for k in list(memo) if k[0] == key[0]]:
                memo.pop(k, None)
        memo[key] = value
    return value


def decorrelate_dc(r: np.ndarray) -> np.ndarray:
    """Colour-decorrelate integer DC residuals (format 2): (g, r - g, b - g); exact and invertible."""
    r = np.asarray(r, np.int64)
    return np.stack([r[:, 1], r[:, 0] - r[:, 1], r[:, 2] - r[:, 1]], 1)


def correlate_dc(d: np.ndarray) -> np.ndarray:
    """Inverse of :func:`decorrelate_dc`."""
    d = np.asarray(d, np.int64)
    return np.stack([d[:, 1] + d[:, 0], d[:, 0], d[:, 2] + d[:, 0]], 1)


def _alpha_from_q(opq: np.ndarray, bits: int) -> np.ndarray:
    levels_op = (1 << bits) - 1
    return np.clip(opq.astype(np.float64) / levels_op, 0.25 / levels_op, 0.995).astype(np.float32)


def _scene_from(decoded: dict):
    import torch

    from .io import GaussianScene

    a = decoded["alpha"].astype(np.float64)
    t = torch.from_numpy
    logit = decoded.get("op_logit")
    if logit is None:
        logit = np.log(a / (1 - a))
    return GaussianScene(
        means=t(np.ascontiguousarray(decoded["means"], np.float32)),
        quats=t(np.ascontiguousarray(decoded["quats"], np.float32)),
        log_scales=t(np.ascontiguousarray(decoded["log_scales"], np.float32)),
        opacity_logits=t(np.ascontiguousarray(logit, np.float32)),
        sh_dc=t(np.ascontiguousarray(decoded["dc"], np.float32)),
        sh_rest=t(np.ascontiguousarray(decoded["rest"], np.float32)),
    )


@dataclass
class FileMeta:
    """Global fields of one encoding, written to HEAD."""

    sh_degree: int
    origin: np.ndarray  # [3] position of level-0 parents
    quant: Quantizer
    source_gaussians: int = 0
    reference_bytes: int = 0  # native-degree float32 .ply size of the source
    palettes: Palettes | None = None  # fine-tier value tables (section PALT)


def write_pgms(meta: FileMeta, shape_codebook: np.ndarray, sh_codebook: np.ndarray | None,
               level_symbols: list[dict], child_counts: list[np.ndarray], *, fast: bool = False,
               stats: list | None = None) -> bytes:
    """Serialise quantised levels (coarse to fine; the last is the fine tier) to .pgms bytes.

    ``level_symbols[l]`` holds the symbol arrays of the coded nodes of level l (from
    :func:`quantize_level`, rows selected); ``child_counts[l]`` their coded children. ``fast``
    tries only raw and rANS per stream (the allocator's rate probe); otherwise every coder is
    measured and the smallest kept. Deterministic: equal inputs give equal bytes.
    """
    global _PROBE
    _PROBE = fast
    try:
        q = meta.quant
        n_levels = len(level_symbols)
        counts = [len(sym["op"]) for sym in level_symbols]
        total = sum(counts)
        if total == 0 or counts[0] == 0:
            raise ValueError("a coded pyramid needs at least one node at level 0")
        shq = sh_codebook if isinstance(sh_codebook, ShGrid) else None
        if shq is not None:
            if not 1 <= shq.degree <= meta.sh_degree:
                raise ValueError(f"per-primitive SH degree {shq.degree} exceeds the scene's {meta.sh_degree}")
            sh_codebook = None
        has_sh = sh_codebook is not None and meta.sh_degree > 0 and len(sh_codebook) > 0
        head = HEAD.pack(
            n_levels, meta.sh_degree, q.op_bits, q.rot_bits, counts[0], total, meta.source_gaussians,
            len(shape_codebook), q.pos_rel, q.dc_step, q.ls_step, q.min_step,
            1 if has_sh else 0, _sh_cb_degree(sh_codebook) if has_sh else 0, 0, len(sh_codebook) if has_sh else 0, 0,
            *[float(v) for v in meta.origin], meta.reference_bytes,
        )
        out = [pack_preamble(), pack_section("HEAD", head)]
        w = StreamWriter()
        w.floats("shape_codebook", shape_codebook)
        out.append(pack_section("CBSR", w.getvalue()))
        if has_sh:
            w = StreamWriter()
            w.floats("sh_codebook", sh_codebook)
            out.append(pack_section("CBSH", w.getvalue()))
        if shq is not None:
            out.append(pack_section("SHQP", SHQP.pack(shq.degree, 0, 0, shq.step)))
        if meta.palettes is not None and meta.palettes.values:
            w = StreamWriter()
            write_palettes(w, meta.palettes)
            if stats is not None:
                stats.extend((GLOBAL_LEVEL, *st) for st in w.stats)
            out.append(pack_section("PALT", w.getvalue()))
        for lv in range(n_levels):
            w = StreamWriter()
            _write_level(w, level_symbols[lv], child_counts[lv], lv == n_levels - 1, has_sh, shq)
            if stats is not None:
                stats.extend((lv, *st) for st in w.stats)
            out.append(pack_section("LEVL", w.getvalue(), level=lv))
        out.append(pack_section("END0", b""))
        return b"".join(out)
    finally:
        _PROBE = False


_PROBE = False


def _sh_cb_degree(cb: np.ndarray) -> int:
    return {3: 1, 8: 2, 15: 3}[cb.shape[1]]


def _coders():
    return (CODER_RAW, CODER_RANS) if _PROBE else (CODER_RAW, CODER_ZSTD, CODER_LZMA, CODER_RANS)


def _write_level(w: StreamWriter, sym: dict, child_count, fine: bool, has_sh: bool, shq: ShGrid | None = None) -> None:
    cod = _coders()

    def ints(name, v):
        b = encode_ints(v, coders=cod)
        w.parts.append(b)
        w.stats.append((name, len(b), CODER_NAMES[b[1]]))

    if fine:
        for a in range(3):
            ints(f"ls{a}", sym["ls"][:, a])
        ints("rot_i", sym["rot_i"])
        for a in range(3):
            ints(f"rot{a}", sym["rot_q"][:, a])
    else:
        ints("shape", sym["shape"])
    for a in range(3):
        ints(f"pos{a}", sym["pos"][:, a])
    for a in range(3):
        ints(f"dc{a}", sym["dc"][:, a])
    ints("op", sym["op"])
    if fine and has_sh:
        ints("sh_flag", sym["sh_flag"])
        ints("sh_idx", sym["sh_idx"][sym["sh_flag"].astype(bool)])
    if fine and shq is not None:
        ints("sh_flag", sym["sh_flag"])
        rows = sym["sh_q"][sym["sh_flag"].astype(bool)].reshape(-1, 3 * shq.coefficients)
        for j in range(rows.shape[1]):
            ints(f"sh{j}", rows[:, j])
    if not fine:
        ints("child_count", np.asarray(child_count, np.int64))


@dataclass
class Header:
    num_levels: int
    sh_degree: int
    level0: int
    total_nodes: int
    source_gaussians: int
    shape_codebook_size: int
    sh_codebook_size: int
    has_sh_codebook: bool
    sh_codebook_degree: int
    origin: np.ndarray
    quant: Quantizer
    reference_bytes: int


def parse_header(payload: bytes, file_size: int) -> Header:
    if len(payload) != HEAD.size:
        raise FormatError(f"HEAD section has {len(payload)} bytes, expected {HEAD.size}")
    (n_levels, sh_degree, op_bits, rot_bits, level0, total, source, k_shape, pos_rel, dc_step, ls_step, min_step,
     has_sh, cb_degree, r2, k_sh, r3, ox, oy, oz, ref) = HEAD.unpack(payload)
    if r2 or r3:
        raise FormatError("HEAD reserved fields are not zero")
    if not 1 <= n_levels <= 32:
        raise FormatError(f"HEAD declares {n_levels} levels, expected 1-32")
    if sh_degree > 3:
        raise FormatError(f"HEAD declares SH degree {sh_degree}, expected 0-3")
    if not 0 < level0 <= total <= min(MAX_NODES, 64 * file_size):
        raise FormatError(f"HEAD node counts (level 0: {level0}, total: {total}) are impossible for a {file_size}-byte file")
    if not 1 <= k_shape <= 1 << 16 or k_sh > 1 << 16 or has_sh not in (0, 1) or (has_sh and (k_sh == 0 or sh_degree == 0)):
        raise FormatError(f"HEAD codebook sizes invalid (shape {k_shape}, SH {k_sh}, flag {has_sh})")
    if (has_sh and not 1 <= cb_degree <= sh_degree) or (not has_sh and (cb_degree or k_sh)):
        raise FormatError(f"HEAD SH codebook degree {cb_degree} invalid for SH degree {sh_degree}")
    origin = np.array([ox, oy, oz], np.float64)
    if not np.isfinite(origin).all():
        raise FormatError("HEAD origin is not finite")
    quant = Quantizer(pos_rel, dc_step, ls_step, min_step, op_bits, rot_bits)
    return Header(n_levels, sh_degree, level0, total, source, k_shape, k_sh, bool(has_sh), cb_degree, origin, quant, ref)


def read_container(data: bytes | memoryview, max_level: int | None = None):
    """Parse preamble, HEAD and the sections up to ``max_level`` -> (header, codebooks, level payloads).

    With ``max_level`` set, sections after that level are not read (a truncated tail is fine)."""
    read_preamble(data)
    it = iter_sections(data)
    first = next(it)
    if first.tag != "HEAD":
        raise FormatError(f"corrupt .pgms: first section is {first.tag!r}, expected 'HEAD'")
    header = parse_header(first.payload, len(data))
    books, levels = {}, []
    for sec in it:
        if sec.tag in ("CBSR", "CBSH", "SHQP", "PALT"):
            order = ("CBSR", "CBSH", "SHQP", "PALT")
            if levels or sec.tag in books or any(order.index(t) > order.index(sec.tag) for t in books):
                raise FormatError(f"corrupt .pgms: codebook section {sec.tag} out of order")
            books[sec.tag] = sec.payload
        elif sec.tag == "LEVL":
            if sec.level != len(levels):
                raise FormatError(f"corrupt .pgms: level section {sec.level} where level {len(levels)} was expected")
            if len(levels) >= header.num_levels:
                raise FormatError(f"corrupt .pgms: more level sections than the {header.num_levels} HEAD declares")
            levels.append(sec.payload)
            if max_level is not None and len(levels) > max_level:
                return header, books, levels
        elif sec.tag == "END0":
            continue  # the iterator then checks that nothing follows
        else:
            raise FormatError(f"corrupt .pgms: unknown section {sec.tag!r}")
    if len(levels) != header.num_levels:
        raise FormatError(f"corrupt .pgms: {len(levels)} level sections, HEAD declares {header.num_levels}")
    return header, books, levels


def decode_tree(data: bytes | memoryview, level: int | None = None):
    """Decode .pgms bytes -> (list of per-level decoded scenes, per-level terminal masks, header).

    ``level``: stop after that pyramid level (progressive decoding); None decodes all."""
    import torch

    from .prototypes import shape_from_features

    header, books, payloads = read_container(data, level)
    major, _minor = read_preamble(data)
    if "CBSR" not in books:
        raise FormatError("corrupt .pgms: missing the scale-rotation codebook section CBSR")
    r = StreamReader(books["CBSR"], "CBSR")
    shape_cb = r.floats("shape_codebook", header.shape_codebook_size * 9).reshape(-1, 9)
    r.done()
    ls_t, q_t = shape_from_features(torch.from_numpy(shape_cb).float())
    shape_ls, shape_q = ls_t.numpy(), q_t.numpy()
    k_rest = (header.sh_degree + 1) ** 2 - 1
    sh_cb = None
    if header.has_sh_codebook:
        if "CBSH" not in books:
            raise FormatError("corrupt .pgms: HEAD declares an SH codebook but section CBSH is missing")
        r = StreamReader(books["CBSH"], "CBSH")
        k_cb = (header.sh_codebook_degree + 1) ** 2 - 1
        sh_cb = r.floats("sh_codebook", header.sh_codebook_size * k_cb * 3).reshape(-1, k_cb, 3)
        r.done()
    pal = read_palettes(books["PALT"]) if "PALT" in books else None
    shq = None
    if "SHQP" in books:
        if sh_cb is not None or len(books["SHQP"]) != SHQP.size:
            raise FormatError("SHQP: section has the wrong size or comes with an SH codebook")
        d, r1, r2, step = SHQP.unpack(books["SHQP"])
        if r1 or r2 or not 1 <= d <= header.sh_degree:
            raise FormatError(f"SHQP: degree {d} invalid for SH degree {header.sh_degree} (or reserved bytes set)")
        shq = ShGrid(d, step)
    q = header.quant
    fine_level = header.num_levels - 1
    n = header.level0
    parent_means = np.tile(header.origin, (n, 1))
    parent_dcq = np.zeros((n, 3), np.int64)
    framed = major >= 3  # parent-frame shapes and offsets
    parent_quats, parent_ls = identity_frames(n)
    decoded_levels, terminal, seen = [], [], 0
    stop = len(payloads) - 1 if level is None else min(level, len(payloads) - 1)
    for lv in range(stop + 1):
        seen += n
        if seen > header.total_nodes:
            raise FormatError(f"corrupt .pgms: level {lv} exceeds the {header.total_nodes} nodes HEAD declares")
        where = f"level {lv}"
        r = StreamReader(payloads[lv], where)
        fine = lv == fine_level
        big_bound = 1 << 40
        fpal = pal.values if (fine and pal is not None) else {}
        if fine:
            log_scales = np.zeros((n, 3), np.float32)
            for a in range(3):
                tab = fpal.get(f"ls{a}")
                if tab is not None:
                    log_scales[:, a] = tab[r.ints(f"ls{a}", n, 0, len(tab) - 1)]
                elif framed:
                    lsq = r.ints(f"ls{a}", n, -big_bound, big_bound)
                    log_scales[:, a] = _relative_log_scales(parent_ls[:, a], lsq, q.ls_step)
                else:
                    log_scales[:, a] = r.ints(f"ls{a}", n, -big_bound, big_bound) * q.ls_step
            big = r.ints("rot_i", n, 0, 3)
            u = np.stack([r.ints(f"rot{a}", n, 0, (1 << q.rot_bits) - 1) for a in range(3)], 1)
            quats = _dq_rot(big, u, q.rot_bits)
            if framed:
                quats = _frames.compose(parent_quats, quats).astype(np.float32)
        else:
            idx = r.ints("shape", n, 0, header.shape_codebook_size - 1)
            log_scales, quats = shape_ls[idx], shape_q[idx]
        if not np.isfinite(log_scales).all() or np.abs(log_scales).max(initial=0) > 80:
            raise FormatError(f"{where}: decoded log-scales out of range")
        off = np.stack([r.ints(f"pos{a}", n, -big_bound, big_bound) for a in range(3)], 1)
        if framed:
            means = _child_means(parent_means, parent_quats, off, _pos_step(log_scales, q))
        else:
            means = parent_means + off * _pos_step(log_scales, q)
        dc_res = np.stack([r.ints(f"dc{a}", n, -big_bound, big_bound) for a in range(3)], 1)
        if major >= 2 and not any(f"dc{c}" in fpal for c in range(3)):
            dc_res = correlate_dc(dc_res)
        dcq = parent_dcq + dc_res
        dc = (dcq * q.dc_step).astype(np.float32)
        for c in range(3):
            tab = fpal.get(f"dc{c}")
            if tab is not None:
                idx = dc_res[:, c].copy()
                if pal.mode[f"dc{c}"] == PALETTE_PREDICTED:
                    idx += _nearest_index(tab, parent_dcq[:, c] * q.dc_step)
                if n and (idx.min() < 0 or idx.max() >= len(tab)):
                    raise FormatError(f"{where}: stream 'dc{c}' indexes outside its {len(tab)}-entry palette")
                dc[:, c] = tab[idx]
        op_tab = fpal.get("op")
        opq = r.ints("op", n, 0, (len(op_tab) if op_tab is not None else 1 << q.op_bits) - 1)
        rest = np.zeros((n, k_rest, 3), np.float32)
        if fine and sh_cb is not None:
            flag = r.ints("sh_flag", n, 0, 1).astype(bool)
            sidx = r.ints("sh_idx", int(flag.sum()), 0, len(sh_cb) - 1)
            rest[flag, : sh_cb.shape[1]] = sh_cb[sidx]
        if fine and shq is not None:
            flag = r.ints("sh_flag", n, 0, 1).astype(bool)
            m, kq = int(flag.sum()), shq.coefficients
            cols = [r.ints(f"sh{j}", m, -(1 << 20), 1 << 20) for j in range(3 * kq)]
            if m:
                rest[flag, :kq] = (np.stack(cols, 1).reshape(m, kq, 3) * shq.step).astype(np.float32)
        if fine:
            cc = np.zeros(n, np.int64)
        else:
            cc = r.ints("child_count", n, 0, MAX_CHILDREN)
        r.done()
        dec = dict(means=means.astype(np.float32), log_scales=log_scales, quats=quats, dcq=dcq, dc=dc,
                   alpha=_alpha_from_q(opq, q.op_bits), rest=rest)
        if op_tab is not None:
            dec["op_logit"] = op_tab[opq]
        if not np.isfinite(dec["means"]).all() or not np.isfinite(dec["dc"]).all():
            raise FormatError(f"{where}: decoded positions or colours are not finite")
        decoded_levels.append(_scene_from(dec))
        terminal.append(cc == 0)
        n_next = int(cc.sum())
        if lv == fine_level and n_next:
            raise FormatError(f"{where}: the finest level declares children")
        # the encoder's closed loop sees float32 parents
        parent_means = np.repeat(dec["means"].astype(np.float64) if framed else means, cc, axis=0)
        parent_dcq = np.repeat(dcq, cc, axis=0)
        if framed:
            parent_quats = np.repeat(quats, cc, axis=0)
            parent_ls = np.repeat(log_scales, cc, axis=0)
        n = n_next
    return decoded_levels, terminal, header
