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

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from .coders import (_SLOW_CODER_LIMIT, ALL_CODERS, CODER_LZMA, CODER_NAMES, CODER_RANS, CODER_RANS4, CODER_RAW, CODER_ZSTD,
                     LEGACY_CODERS, PROBE_CODERS, rans4_decode, rans4_encode,
                     FormatError, byte_width, lzma_compress, planes, rans_encode, unplanes, unzigzag, zigzag,
                     zstd_compress, zstd_decompress, lzma_decompress, rans_decode)
# (Quantizer, ShGrid, Palettes, identity_frames, decorrelate_dc... are re-exported:
# ``bitstream`` stays the one import for the format's types.)
from .stream_memo import memoized_stream, values_key
from .header import (FLAG_COPIES, HEAD, MAX_CHILDREN, MAX_COPIES, MAX_NODES, VERSION, VERSION_COPIES,  # noqa: F401
                     Header, parse_header)
from .file_transform import XFRM, FileTransform  # noqa: F401 (re-exported: section XFRM)
from .quantize import (MAX_ABS_DC_TABLE, MAX_ABS_LOG_SCALE, MAX_PALETTE, PALETTE_CHANNELS, PALETTE_NONE,
                       PALETTE_PREDICTED, DecodedLevel, Palettes, Parents, Quantizer, ShapeTable, ShGrid, Tables, correlate_dc, decorrelate_dc, dequantize_level,
                       identity_frames)  # noqa: F401

MAGIC = b"\x89PGMS\r\n\x1a"
# 1.x (no PALT section) and 2.x (absolute fine-tier shapes, world-axis offsets) decode unchanged;
# 5.x adds the optional XFRM section (the similarity from the coded frame to the scene's)
READABLE_MAJORS = (1, 2, 3, 4, 5)
SECTION_HEADER = struct.Struct("<4sBBHI")  # tag, level, reserved, reserved, length
STREAM_HEAD = struct.Struct("<BBBBIQI")  # kind, coder, width, pad, n, alphabet, coded size
GLOBAL_LEVEL = 0xFF
MAX_SECTION_BYTES = 1 << 31
MAX_SYMBOLS = 1 << 30
MAX_ALPHABET = 1 << 16
KIND_INT, KIND_F16, KIND_F32 = 0, 1, 2


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


def pack_preamble(version: tuple[int, int] = VERSION) -> bytes:
    return MAGIC + struct.pack("<HH", *version)


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
        if (tag == "LEVL") == (level == GLOBAL_LEVEL):
            raise FormatError(f"corrupt .pgms: section {tag} at byte {pos} has level byte {level}"
                              + (", expected 0-254" if tag == "LEVL" else f", expected {GLOBAL_LEVEL} (a global section)"))
        yield Section(tag, level, payload, pos)
        pos += 16 + length
        if tag == "END0":
            if pos != n:
                raise FormatError(f"corrupt .pgms: {n - pos} unexpected bytes after the END0 section")
            return


# --------------------------------------------------------------------------- streams


@memoized_stream  # the searches code unchanged streams again (stream_memo)
def encode_ints(values: np.ndarray, *, coders: tuple[int, ...] = ALL_CODERS) -> bytes:
    """Code a signed integer array with whichever coder is smallest (ties: lowest coder id).

    Stream layout: kind u8 (0) | coder u8 | width u8 | pad u8 | n u32 | alphabet u64 | size u32 | bytes.
    ``alphabet`` is max(zigzag(values)) + 1; ``size`` is the coded byte count.
    """
    v = np.asarray(values).reshape(-1)
    if v.size >= MAX_SYMBOLS:
        raise ValueError(f"stream of {v.size} symbols exceeds the {MAX_SYMBOLS} limit")
    u = zigzag(v)
    alphabet = int(u.max()) + 1 if u.size else 0
    width = byte_width(max(alphabet - 1, 0))
    raw = planes(u, width)
    candidates = {CODER_RAW: raw}
    if u.size:
        if CODER_ZSTD in coders:
            candidates[CODER_ZSTD] = zstd_compress(raw)
        if CODER_LZMA in coders and len(raw) <= _SLOW_CODER_LIMIT:  # lzma: seconds per MB, rarely wins on big streams
            candidates[CODER_LZMA] = lzma_compress(raw)
        if CODER_RANS in coders and alphabet <= MAX_ALPHABET:
            candidates[CODER_RANS] = rans_encode(u, alphabet)
        if CODER_RANS4 in coders and alphabet <= MAX_ALPHABET:
            candidates[CODER_RANS4] = rans4_encode(u, alphabet)
    coder = min(candidates, key=lambda c: (len(candidates[c]), c))
    body = candidates[coder]
    return STREAM_HEAD.pack(KIND_INT, coder, width, 0, v.size, alphabet, len(body)) + body


def encode_floats(values: np.ndarray, *, half: bool = True) -> bytes:
    """A float table (codebooks, origins): float16 or float32, zstd-coded when that is smaller."""
    v = np.asarray(values, dtype=np.float16 if half else np.float32).reshape(-1)
    if not np.isfinite(v).all():
        raise ValueError("float stream holds NaN/Inf (or a value beyond float16 range)")
    width = 2 if half else 4
    raw = planes(v.view(f"<u{width}"), width)
    z = zstd_compress(raw) if v.size else raw
    coder, body = (CODER_ZSTD, z) if len(z) < len(raw) else (CODER_RAW, raw)
    kind = KIND_F16 if half else KIND_F32
    return STREAM_HEAD.pack(kind, coder, width, 0, v.size, 0, len(body)) + body


class StreamWriter:
    """Concatenates streams into one section payload."""

    def __init__(self, coders: tuple[int, ...] = ALL_CODERS, cache: dict | None = None):
        self.coders = coders  # integer streams: the coders tried (the smallest wins)
        self.cache = cache  # (coders, values digest) -> coded stream, kept by the caller across files
        self.parts: list[bytes] = []
        self.stats: list[tuple[str, int, str]] = []  # (name, bytes, coder) for reports

    def ints(self, name: str, values: np.ndarray) -> None:
        if self.cache is None:
            b = encode_ints(values, coders=self.coders)
        else:  # a stream is a function of its values and the coders tried: code equal ones once
            v = np.ascontiguousarray(values).reshape(-1)
            key = values_key(v)
            b = self.cache.get((self.coders, key))
            if b is None:
                b = self.cache[(self.coders, key)] = encode_ints(v, coders=self.coders, key=key)
        self.parts.append(b)
        self.stats.append((name, len(b), CODER_NAMES[b[1]]))

    def floats(self, name: str, values: np.ndarray, *, half: bool = True) -> None:
        b = encode_floats(values, half=half)
        self.parts.append(b)
        self.stats.append((name, len(b), CODER_NAMES[b[1]]))

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class StreamReader:
    """Reads the streams of one section payload in order, validating every field. ``major``: the
    file's format version (coders 2 and 3 are refused from 4.x on); None for a stream read on its
    own (every coder)."""

    def __init__(self, payload: bytes, where: str, major: int | None = None):
        self.b, self.pos, self.where, self.major = payload, 0, where, major

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
        if alphabet > (1 << (8 * width)) or (n and alphabet == 0) or (n and width != byte_width(alphabet - 1)):
            raise FormatError(f"{self.where}: stream {name!r} alphabet {alphabet} does not fit width {width}")
        if self.major is not None and self.major >= 4 and coder in LEGACY_CODERS:
            raise FormatError(f"{self.where}: stream {name!r} uses coder {coder} ({CODER_NAMES[coder]}), which format "
                              f"{self.major}.x does not allow (raw, zstd and rANS coder 4 only)")
        size = n * width
        if coder == CODER_RAW:
            if len(body) != size:
                raise FormatError(f"{self.where}: raw stream {name!r} has {len(body)} bytes, expected {size}")
            u = unplanes(body, n, width)
        elif coder == CODER_ZSTD:
            u = unplanes(zstd_decompress(body, size), n, width)
        elif coder == CODER_LZMA:
            u = unplanes(lzma_decompress(body, size), n, width)
        else:
            if alphabet > MAX_ALPHABET:
                raise FormatError(f"{self.where}: rANS stream {name!r} alphabet {alphabet} exceeds {MAX_ALPHABET}")
            u = (rans4_decode if coder == CODER_RANS4 else rans_decode)(body, n, alphabet)
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
        raw = body if coder == CODER_RAW else zstd_decompress(body, size)
        if len(raw) != size:
            raise FormatError(f"{self.where}: float stream {name!r} has {len(raw)} bytes, expected {size}")
        v = unplanes(raw, n, width).astype(f"<u{width}").view(np.float16 if width == 2 else np.float32)
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


SHQP = struct.Struct("<BBHf")  # degree, reserved, reserved, step


def write_palettes(w: "StreamWriter", pal: Palettes) -> None:
    w.ints("palette_mode", np.array([pal.mode.get(c, PALETTE_NONE) if c in pal.values else PALETTE_NONE
                                     for c in PALETTE_CHANNELS], np.int64))
    for c in PALETTE_CHANNELS:
        if c in pal.values:
            w.floats(f"palette_{c}", pal.values[c], half=False)


def read_palettes(payload: bytes, major: int | None = None) -> Palettes:
    r = StreamReader(payload, "PALT", major)
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
        if c.startswith("ls") and np.abs(v).max() > MAX_ABS_LOG_SCALE:
            raise FormatError(f"PALT: palette {c} holds log-scales out of range")
        if c.startswith("dc") and np.abs(v.astype(np.float64)).max() > MAX_ABS_DC_TABLE:
            raise FormatError(f"PALT: palette {c} holds colours out of range (beyond +-{MAX_ABS_DC_TABLE:g})")
        values[c], mode[c] = v.astype(np.float32), m
    r.done()
    if not values:
        raise FormatError("PALT: section present but no channel has a palette")
    return Palettes(values, mode)


@dataclass
class FileMeta:
    """Global fields of one encoding, written to HEAD."""

    sh_degree: int
    origin: np.ndarray  # [3] position of level-0 parents
    quant: Quantizer
    source_gaussians: int = 0
    reference_bytes: int = 0  # native-degree float32 .ply size of the source
    palettes: Palettes | None = None  # fine-tier value tables (section PALT)
    transform: FileTransform | None = None  # coded frame -> the scene's (section XFRM)


def write_pgms(meta: FileMeta, shape_codebook: np.ndarray, sh_codebook: np.ndarray | ShGrid | None,
               level_symbols: list[dict], child_counts: list[np.ndarray], *, fast: bool = False,
               stats: list | None = None, stream_cache: dict | None = None) -> bytes:
    """Serialise quantised levels (coarse to fine; the last is the fine tier) to .pgms bytes.

    ``level_symbols[l]`` holds the symbol arrays of the coded nodes of level l (from
    :func:`.quantize.quantize_level`, rows selected); ``child_counts[l]`` their coded children.
    ``fast`` tries only raw and rANS per stream (the allocator's rate probe); otherwise every
    coder is measured and the smallest kept. Deterministic: equal inputs give equal bytes, on
    any thread (the coders travel as an argument).
    ``stream_cache``: a dict the caller keeps across files of the same levels (the cut tuner's
    encodes at several cuts): a level stream equal to one coded before is not coded again.
    """
    coders = PROBE_CODERS if fast else ALL_CODERS
    n_levels = len(level_symbols)
    counts = [len(sym["op"]) for sym in level_symbols]
    if sum(counts) == 0 or counts[0] == 0:
        raise ValueError("a coded pyramid needs at least one node at level 0")
    shq = sh_codebook if isinstance(sh_codebook, ShGrid) else None
    if shq is not None:
        if not 1 <= shq.degree <= meta.sh_degree:
            raise ValueError(f"per-primitive SH degree {shq.degree} exceeds the scene's {meta.sh_degree}")
        sh_codebook = None
    has_sh = sh_codebook is not None and meta.sh_degree > 0 and len(sh_codebook) > 0
    copies = "copies" in level_symbols[-1]
    out = [pack_preamble(VERSION_COPIES if copies else VERSION),
           pack_section("HEAD", _pack_head(meta, counts, shape_codebook, sh_codebook if has_sh else None, copies))]
    if meta.transform is not None:
        out.append(pack_section("XFRM", meta.transform.pack()))
    out += _global_sections(meta, shape_codebook, sh_codebook if has_sh else None, shq, stats)
    for lv in range(n_levels):
        w = StreamWriter(coders, stream_cache)
        write_level(w, level_symbols[lv], child_counts[lv], lv == n_levels - 1, has_sh, shq)
        if stats is not None:
            stats.extend((lv, *st) for st in w.stats)
        out.append(pack_section("LEVL", w.getvalue(), level=lv))
    out.append(pack_section("END0", b""))
    return b"".join(out)


def _pack_head(meta: FileMeta, counts: list[int], shape_codebook: np.ndarray, sh_codebook: np.ndarray | None,
               copies: bool = False) -> bytes:
    q = meta.quant
    has_sh = sh_codebook is not None
    return HEAD.pack(
        len(counts), meta.sh_degree, q.op_bits, q.rot_bits, counts[0], sum(counts), meta.source_gaussians,
        len(shape_codebook), q.pos_rel, q.dc_step, q.ls_step, q.min_step,
        1 if has_sh else 0, _SH_CB_DEGREE[sh_codebook.shape[1]] if has_sh else 0, FLAG_COPIES if copies else 0, len(sh_codebook) if has_sh else 0, 0,
        *[float(v) for v in meta.origin], meta.reference_bytes,
    )


def _global_sections(meta: FileMeta, shape_codebook: np.ndarray, sh_codebook: np.ndarray | None,
                     shq: ShGrid | None, stats: list | None) -> list[bytes]:
    """CBSR (shape prototypes), CBSH (SH prototypes), SHQP (per-primitive SH grid), PALT (value tables)."""
    w = StreamWriter()
    w.floats("shape_codebook", shape_codebook)
    out = [pack_section("CBSR", w.getvalue())]
    if sh_codebook is not None:
        w = StreamWriter()
        w.floats("sh_codebook", sh_codebook)
        out.append(pack_section("CBSH", w.getvalue()))
    if shq is not None:
        out.append(pack_section("SHQP", SHQP.pack(shq.degree, 0, 0, shq.step)))
    if meta.palettes is not None and meta.palettes.values:
        w = StreamWriter()  # every coder, probe or not (as before the coders became an argument)
        write_palettes(w, meta.palettes)
        if stats is not None:
            stats.extend((GLOBAL_LEVEL, *st) for st in w.stats)
        out.append(pack_section("PALT", w.getvalue()))
    return out


_SH_CB_DEGREE = {3: 1, 8: 2, 15: 3}  # SH codebook rows' coefficients -> their degree


def write_level(w: StreamWriter, sym: dict, child_count, fine: bool, has_sh: bool, shq: ShGrid | None = None) -> None:
    """One level's streams, in file order (:func:`read_level` reads them back)."""
    if fine:
        for a in range(3):
            w.ints(f"ls{a}", sym["ls"][:, a])
        w.ints("rot_i", sym["rot_i"])
        for a in range(3):
            w.ints(f"rot{a}", sym["rot_q"][:, a])
    else:
        w.ints("shape", sym["shape"])
    for a in range(3):
        w.ints(f"pos{a}", sym["pos"][:, a])
    for a in range(3):
        w.ints(f"dc{a}", sym["dc"][:, a])
    w.ints("op", sym["op"])
    if fine and has_sh:
        w.ints("sh_flag", sym["sh_flag"])
        w.ints("sh_idx", sym["sh_idx"][sym["sh_flag"].astype(bool)])
    if fine and shq is not None:
        w.ints("sh_flag", sym["sh_flag"])
        rows = sym["sh_q"][sym["sh_flag"].astype(bool)].reshape(-1, 3 * shq.coefficients)
        for j in range(rows.shape[1]):
            w.ints(f"sh{j}", rows[:, j])
    if not fine:
        w.ints("child_count", np.asarray(child_count, np.int64))
    elif "copies" in sym:  # format 5.1: each fine node stands for 1 + copies[i] source rows
        w.ints("copies", sym["copies"])


_BIG = 1 << 40  # bound of a decoded position, log-scale or DC residual


def read_level(r: StreamReader, n: int, fine: bool, header: Header, tables: Tables) -> dict:
    """Inverse of :func:`write_level`: the level's symbols (SH rows expanded to every node, zeros
    where a leaf has none) and ``child_count``, each stream checked against its range."""
    q = header.quant
    pal = tables.palettes.values if (fine and tables.palettes is not None) else {}
    sym = {}
    if fine:
        sym["ls"] = np.stack([r.ints(f"ls{a}", n, 0, len(pal[f"ls{a}"]) - 1) if f"ls{a}" in pal
                              else r.ints(f"ls{a}", n, -_BIG, _BIG) for a in range(3)], 1)
        sym["rot_i"] = r.ints("rot_i", n, 0, 3)
        sym["rot_q"] = np.stack([r.ints(f"rot{a}", n, 0, (1 << q.rot_bits) - 1) for a in range(3)], 1)
    else:
        sym["shape"] = r.ints("shape", n, 0, header.shape_codebook_size - 1)
    sym["pos"] = np.stack([r.ints(f"pos{a}", n, -_BIG, _BIG) for a in range(3)], 1)
    sym["dc"] = np.stack([r.ints(f"dc{a}", n, -_BIG, _BIG) for a in range(3)], 1)
    sym["op"] = r.ints("op", n, 0, (len(pal["op"]) if "op" in pal else 1 << q.op_bits) - 1)
    cb = tables.sh_codebook
    if fine and cb is not None:
        flag = r.ints("sh_flag", n, 0, 1)
        m = int(flag.sum())
        sym["sh_flag"] = flag
        if isinstance(cb, ShGrid):
            # int32 (|value| <= 2^20), filled a column at a time: K x 3 int64 columns per node
            # would dominate a decode's memory
            rows = np.flatnonzero(flag)
            sym["sh_q"] = np.zeros((n, cb.coefficients, 3), np.int32)
            for j in range(3 * cb.coefficients):
                sym["sh_q"][rows, j // 3, j % 3] = r.ints(f"sh{j}", m, -(1 << 20), 1 << 20)
        else:
            sym["sh_idx"] = np.zeros(n, np.int64)
            sym["sh_idx"][flag.astype(bool)] = r.ints("sh_idx", m, 0, len(cb) - 1)
    sym["child_count"] = np.zeros(n, np.int64) if fine else r.ints("child_count", n, 0, MAX_CHILDREN)
    if fine and header.copies:
        sym["copies"] = r.ints("copies", n, 0, MAX_COPIES - 1)
    r.done()
    return sym


GLOBAL_SECTIONS = ("XFRM", "CBSR", "CBSH", "SHQP", "PALT")  # in file order, after HEAD


def read_transform(header: Header, books: dict) -> FileTransform | None:
    """Section XFRM (format 5+), validated; None where the coded frame is the scene's."""
    return FileTransform.unpack(books["XFRM"], header.sh_degree) if "XFRM" in books else None


def read_container(data: bytes | memoryview, max_level: int | None = None):
    """Parse preamble, HEAD and the sections up to ``max_level`` -> (header, codebooks, level payloads).

    With ``max_level`` set, sections after that level are not read (a truncated tail is fine)."""
    version = read_preamble(data)
    it = iter_sections(data)
    first = next(it)
    if first.tag != "HEAD":
        raise FormatError(f"corrupt .pgms: first section is {first.tag!r}, expected 'HEAD'")
    header, major = parse_header(first.payload, len(data), version), version[0]
    books, levels = {}, []
    for sec in it:
        if sec.tag in GLOBAL_SECTIONS and (sec.tag != "XFRM" or major >= 5):
            order = GLOBAL_SECTIONS
            if levels or sec.tag in books or any(order.index(t) > order.index(sec.tag) for t in books):
                raise FormatError(f"corrupt .pgms: global section {sec.tag} out of order")
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



def read_tables(header: Header, books: dict, major: int = VERSION[0]) -> tuple[Tables, ShapeTable]:
    """The global sections' tables: -> (shape/SH codebooks and palettes, the decoded shape table)."""
    if "CBSR" not in books:
        raise FormatError("corrupt .pgms: missing the scale-rotation codebook section CBSR")
    r = StreamReader(books["CBSR"], "CBSR")
    shape_cb = r.floats("shape_codebook", header.shape_codebook_size * 9).reshape(-1, 9)
    r.done()
    sh_cb = None
    if header.has_sh_codebook:
        if "CBSH" not in books:
            raise FormatError("corrupt .pgms: HEAD declares an SH codebook but section CBSH is missing")
        r = StreamReader(books["CBSH"], "CBSH")
        k_cb = (header.sh_codebook_degree + 1) ** 2 - 1
        sh_cb = r.floats("sh_codebook", header.sh_codebook_size * k_cb * 3).reshape(-1, k_cb, 3)
        r.done()
    pal = read_palettes(books["PALT"], major) if "PALT" in books else None
    if "SHQP" in books:
        if sh_cb is not None or len(books["SHQP"]) != SHQP.size:
            raise FormatError("SHQP: section has the wrong size or comes with an SH codebook")
        d, r1, r2, step = SHQP.unpack(books["SHQP"])
        if r1 or r2 or not 1 <= d <= header.sh_degree:
            raise FormatError(f"SHQP: degree {d} invalid for SH degree {header.sh_degree} (or reserved bytes set)")
        sh_cb = ShGrid(d, step)
    return Tables(shape_cb, sh_cb, None, pal), ShapeTable.from_codebook(shape_cb, portable=major >= 4)
