"""Builders of hostile .pgms files and scenes for the robustness tests (issue 31).

Everything here is written from ``docs/FORMAT.md`` alone, not from the reference decoder, so
the tests do not share the decoder's assumptions: a container/stream packer and parser, two
memory bombs (built here, never stored), a seeded mutation fuzzer, and a runner that decodes in
a child process under ``RLIMIT_AS`` and a wall-clock limit.

The memory rule (docs/ROBUSTNESS.md): the child imports the decoder and decodes a small valid
file first (so every lazy import and first-call allocation is done), reads its own ``VmSize``
(the interpreter + torch + decoder baseline, measured, not guessed), then limits its address
space to ``VmSize + decode_budget(file size)`` (max(64 MiB, 256 x file size)) before it decodes the file under test.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from visionmoe.splat.pgms.decode import decode_budget

MAGIC = b"\x89PGMS\r\n\x1a"
SECTION = struct.Struct("<4sBBHI")  # tag, level, reserved, reserved, length (then crc32 u32)
STREAM = struct.Struct("<BBBBIQI")  # kind, coder, width, pad, n, alphabet, size
HEAD = struct.Struct("<BBBBIIIIffffBBHIIfffQ")
GLOBAL = 255
RAW, ZSTD = 0, 1
KIND_INT, KIND_F16, KIND_F32 = 0, 1, 2
MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]


def memory_budget(file_size: int) -> int:
    """Bytes a decode of a ``file_size``-byte .pgms may add above the warmed-up baseline."""
    return decode_budget(file_size)


# --------------------------------------------------------------------------- container


@dataclass
class Sec:
    tag: str
    level: int
    payload: bytes
    reserved: tuple[int, int] = (0, 0)
    length: int | None = None  # None: len(payload)
    crc: int | None = None  # None: the correct CRC


def pack_section(s: Sec) -> bytes:
    length = len(s.payload) if s.length is None else s.length
    head = SECTION.pack(s.tag.encode("latin1")[:4].ljust(4, b" "), s.level, s.reserved[0], s.reserved[1], length)
    crc = zlib.crc32(s.payload, zlib.crc32(head)) if s.crc is None else s.crc
    return head + struct.pack("<I", crc) + s.payload


def pack(secs: list[Sec], version: tuple[int, int] = (3, 0)) -> bytes:
    return MAGIC + struct.pack("<HH", *version) + b"".join(pack_section(s) for s in secs)


def parse(data: bytes) -> tuple[tuple[int, int], list[Sec]]:
    """Split a well-formed file into (version, sections); trusts its input (a file we wrote)."""
    assert data[:8] == MAGIC
    version = struct.unpack_from("<HH", data, 8)
    pos, secs = 12, []
    while pos < len(data):
        tag, level, r1, r2, length = SECTION.unpack_from(data, pos)
        secs.append(Sec(tag.decode("latin1"), level, data[pos + 16: pos + 16 + length], (r1, r2)))
        pos += 16 + length
    return version, secs


def section_bounds(data: bytes) -> list[tuple[int, int]]:
    """(start, end) byte offsets of each section (header included) of a well-formed file."""
    pos, out = 12, []
    while pos + 16 <= len(data):
        length = SECTION.unpack_from(data, pos)[4]
        out.append((pos, pos + 16 + length))
        pos += 16 + length
    return out


# --------------------------------------------------------------------------- streams


@dataclass
class Stream:
    kind: int
    coder: int
    width: int
    n: int
    alphabet: int
    body: bytes
    pad: int = 0
    size: int | None = None  # None: len(body)

    def pack(self) -> bytes:
        size = len(self.body) if self.size is None else self.size
        return STREAM.pack(self.kind, self.coder, self.width, self.pad, self.n, self.alphabet, size) + self.body


def parse_streams(payload: bytes) -> list[Stream] | None:
    """The streams of a section payload, or None when it is not a sequence of streams."""
    pos, out = 0, []
    while pos < len(payload):
        if pos + STREAM.size > len(payload):
            return None
        kind, coder, width, pad, n, alphabet, size = STREAM.unpack_from(payload, pos)
        pos += STREAM.size
        if pos + size > len(payload):
            return None
        out.append(Stream(kind, coder, width, n, alphabet, payload[pos: pos + size], pad))
        pos += size
    return out


def pack_streams(streams: list[Stream]) -> bytes:
    return b"".join(s.pack() for s in streams)


def _zigzag(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.int64)
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)


def int_stream(values, coder: int = RAW) -> Stream:
    """An integer stream as FORMAT.md defines it (zigzag, byte planes, raw or zstd)."""
    u = _zigzag(np.asarray(values).reshape(-1))
    alphabet = int(u.max()) + 1 if u.size else 0
    width = next(w for w in (1, 2, 4, 8) if max(alphabet - 1, 0) < 1 << (8 * w))
    planes = np.ascontiguousarray(u.astype(f"<u{width}").view(np.uint8).reshape(-1, width).T).tobytes()
    if coder == ZSTD:
        import zstandard

        planes = zstandard.ZstdCompressor(level=19, write_content_size=False).compress(planes)
    return Stream(KIND_INT, coder, width, u.size, alphabet, planes)


def f16_stream(values) -> Stream:
    v = np.asarray(values, np.float16).reshape(-1)
    planes = np.ascontiguousarray(v.view("<u2").view(np.uint8).reshape(-1, 2).T).tobytes()
    return Stream(KIND_F16, RAW, 2, v.size, 0, planes)


def head(num_levels=1, sh_degree=0, op_bits=8, rot_bits=8, level0=1, total=1, source=1, shape_codebook=1,
         pos_rel=0.5, dc_step=0.02, ls_step=0.05, min_step=1e-3, has_sh=0, sh_cb_degree=0, sh_codebook=0,
         origin=(0.0, 0.0, 0.0), reference_bytes=1000) -> bytes:
    return HEAD.pack(num_levels, sh_degree, op_bits, rot_bits, level0, total, source, shape_codebook, pos_rel, dc_step,
                     ls_step, min_step, has_sh, sh_cb_degree, 0, sh_codebook, 0, *origin, reference_bytes)


SHAPE_ROW = [-3.0, -3.0, -3.0, 1, 0, 0, 0, 1, 0]  # one scale-rotation prototype: identity, exp(-3)


def coarse_level(n: int, child: int, coder: int = RAW) -> bytes:
    """A coarse LEVL payload of ``n`` zero nodes with ``child`` children each."""
    z = np.zeros(n, np.int64)
    streams = [int_stream(z, coder)]  # shape
    streams += [int_stream(z, coder) for _ in range(3)]  # pos
    streams += [int_stream(z, coder) for _ in range(3)]  # dc
    streams += [int_stream(np.full(n, 128), coder)]  # op
    streams += [int_stream(np.full(n, child), coder)]  # child_count
    return pack_streams(streams)


def fine_level(n: int, coder: int = RAW) -> bytes:
    """A fine-tier LEVL payload of ``n`` nodes (SH degree 0: no SH streams)."""
    z = np.zeros(n, np.int64)
    streams = [int_stream(z, coder) for _ in range(3)]  # ls0..2
    streams += [int_stream(z, coder)]  # rot_i
    streams += [int_stream(np.full(n, 127), coder) for _ in range(3)]  # rot0..2 (the identity)
    streams += [int_stream(z, coder) for _ in range(6)]  # pos, dc
    streams += [int_stream(np.full(n, 128), coder)]  # op
    return pack_streams(streams)


def valid_two_level(n0: int = 4, child: int = 2) -> bytes:
    """A small valid two-level file written from FORMAT.md (n0 coarse nodes, n0*child leaves)."""
    secs = [Sec("HEAD", GLOBAL, head(num_levels=2, level0=n0, total=n0 + n0 * child, source=n0 * child)),
            Sec("CBSR", GLOBAL, f16_stream(SHAPE_ROW).pack()),
            Sec("LEVL", 0, coarse_level(n0, child)), Sec("LEVL", 1, fine_level(n0 * child)), Sec("END0", GLOBAL, b"")]
    return pack(secs)


def child_count_bomb(n0: int = 40_000) -> bytes:
    """Issue 31 item 1: a CRC-valid two-level file whose ``n0`` coarse nodes each claim 255
    children, while HEAD declares ``total = 2 n0`` nodes and level 1 holds ``n0`` leaves.
    Raw streams keep the file at ~10 bytes per node, so HEAD's ``total <= 64 x file size``
    rule passes; a decoder that expands the 255 x n0 children before checking them against
    HEAD allocates hundreds of bytes per child."""
    secs = [Sec("HEAD", GLOBAL, head(num_levels=2, level0=n0, total=2 * n0, source=n0)),
            Sec("CBSR", GLOBAL, f16_stream(SHAPE_ROW).pack()),
            Sec("LEVL", 0, coarse_level(n0, 255)), Sec("LEVL", 1, fine_level(n0)), Sec("END0", GLOBAL, b"")]
    return pack(secs)


def lying_header_bomb(claim: int = 1 << 28, real: int = 8) -> bytes:
    """Issue 31 item 2: HEAD claims ``claim`` level-0 nodes of a one-level file that holds
    ``real``; a degree-3 appearance codebook of 65536 entries (5.9 MB of float16) makes the
    file large enough that ``claim <= 64 x file size`` passes. A decoder that sizes buffers
    by HEAD before it reads the first stream's count allocates gigabytes."""
    k = 1 << 16
    cb = np.zeros(k * 15 * 3, np.float16)
    secs = [Sec("HEAD", GLOBAL, head(num_levels=1, sh_degree=3, level0=claim, total=claim, source=claim,
                                     has_sh=1, sh_cb_degree=3, sh_codebook=k)),
            Sec("CBSR", GLOBAL, f16_stream(SHAPE_ROW).pack()),
            Sec("CBSH", GLOBAL, f16_stream(cb).pack())]
    fine = fine_level(real)
    z = np.zeros(real, np.int64)
    fine += pack_streams([int_stream(z), int_stream(np.zeros(0, np.int64))])  # sh_flag, sh_idx (none flagged)
    secs += [Sec("LEVL", 0, fine), Sec("END0", GLOBAL, b"")]
    return pack(secs)


def constant_stream_bomb(n0: int = 80_000, child: int = 64) -> bytes:
    """A *valid* zip bomb: ``n0`` coarse nodes with ``child`` children each, every stream a
    zstd frame of one repeated symbol (a few dozen bytes whatever the count), the file padded
    with scale-rotation prototypes to the size at which HEAD's ``total <= 64 x file size``
    passes. Each node it declares costs a decoder hundreds of bytes: 5M nodes from ~80 KB."""
    total = n0 + n0 * child
    secs = [Sec("HEAD", GLOBAL, b""), Sec("CBSR", GLOBAL, b""),
            Sec("LEVL", 0, coarse_level(n0, child, ZSTD)), Sec("LEVL", 1, fine_level(n0 * child, ZSTD)),
            Sec("END0", GLOBAL, b"")]
    k = 1
    while True:  # prototypes until the file is large enough for HEAD's node rule
        secs[0].payload = head(num_levels=2, level0=n0, total=total, source=n0 * child, shape_codebook=k)
        secs[1].payload = f16_stream(SHAPE_ROW * k).pack()
        data = pack(secs)
        if 64 * len(data) >= total or k >= 1 << 16:
            return data
        k = min(1 << 16, k + (total // 64 - len(data)) // 18 + 1)


# --------------------------------------------------------------------------- decoding under limits

_CHILD = r"""
import json, os, resource, sys, time
from visionmoe.splat import FormatError, decompress
warm, path, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
decompress(warm)  # lazy imports and first-call allocations happen here, before the baseline

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

base = status("VmSize")
if budget > 0:
    resource.setrlimit(resource.RLIMIT_AS, (base + budget, resource.RLIM_INFINITY))
t = time.perf_counter()
try:
    scene = decompress(path)
    outcome, message = "ok", str(scene.num_gaussians)
except FormatError as exc:
    outcome, message = "FormatError", str(exc)
except BaseException as exc:  # noqa: BLE001 - the test reports what escaped
    outcome, message = type(exc).__name__, str(exc)[:300]
print(json.dumps({"outcome": outcome, "message": message, "baseline": base, "peak": status("VmPeak") - base,
                  "seconds": time.perf_counter() - t}))
"""


def decode_limited(path: Path, warm: Path, budget: int | None = None, timeout: float = 120.0) -> dict:
    """Decode ``path`` in a child process under RLIMIT_AS = warmed baseline + ``budget`` bytes
    (default :func:`memory_budget` of the file size; 0: no limit, to measure) and a wall-clock
    limit. -> {"outcome": "ok" | "FormatError" | what else escaped, "message", "baseline",
    "peak" (VmPeak above the baseline), "seconds"}."""
    if budget is None:
        budget = memory_budget(Path(path).stat().st_size)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(warm), str(path), str(budget)], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"outcome": "timeout", "message": f"no result within {timeout} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"outcome": f"exit {proc.returncode}", "message": proc.stderr[-2000:]}
    return json.loads(lines[-1])


# --------------------------------------------------------------------------- mutation fuzzer

_U8 = [0, 1, 2, 3, 4, 15, 16, 31, 32, 33, 127, 128, 254, 255]
_U16 = [0, 1, 255, 256, 0x7FFF, 0x8000, 0xFFFF]
_U32 = [0, 1, 2, 7, 255, 256, 65535, 65536, 65537, (1 << 28) - 1, 1 << 28, (1 << 28) + 1, (1 << 30) - 1, 1 << 30,
        (1 << 31) - 1, 1 << 31, (1 << 32) - 1]
_U64 = _U32 + [1 << 32, (1 << 40), (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
_F32 = [0.0, -0.0, 1e-45, 1e-38, 1e-30, 1e-7, 1e-6, 0.5, 1.0, 1e6, 1e30, 3.4e38, float("inf"), float("-inf"),
        float("nan"), -1.0, -1e-30, -3.4e38]
_EXTREMES = {"B": _U8, "H": _U16, "I": _U32, "Q": _U64, "f": _F32}


def _field_offsets(fmt: str) -> list[tuple[int, str]]:
    """(offset, code) of each field of a little-endian struct format like '<BBHI'."""
    out, off = [], 0
    for code in fmt.lstrip("<"):
        out.append((off, code))
        off += struct.calcsize("<" + code)
    return out


_HEAD_FIELDS = _field_offsets(HEAD.format)
_STREAM_FIELDS = _field_offsets(STREAM.format)


def _set_field(buf: bytearray, off: int, code: str, value) -> None:
    struct.pack_into("<" + code, buf, off, value)


def _stream_offsets(payload: bytes) -> list[tuple[int, int]]:
    """(header offset, body end) of each stream in a payload (those that parse)."""
    pos, out = 0, []
    while pos + STREAM.size <= len(payload):
        size = STREAM.unpack_from(payload, pos)[6]
        end = pos + STREAM.size + size
        if end > len(payload):
            break
        out.append((pos, end))
        pos = end
    return out


def _boundaries(data: bytes) -> list[int]:
    """Every section and stream boundary (header start, header end, body end) in the file."""
    out = {0, 8, 12, len(data)}
    for start, end in section_bounds(data):
        out.update((start, start + 12, start + 16, end))
        for s, e in _stream_offsets(data[start + 16: end]):
            out.update((start + 16 + s, start + 16 + s + STREAM.size, start + 16 + e))
    return sorted(out)


def _resealed(version, secs) -> bytes:
    return pack([replace(s, crc=None, length=None) for s in secs], version)


def mutate(data: bytes, rng: random.Random, donors: list[bytes]) -> tuple[str, bytes]:
    """One mutant of the valid file ``data`` -> (what was done, bytes). Most mutations keep the
    CRCs valid (recomputed) so that they reach the decoder's semantic checks."""
    version, secs = parse(data)
    kind = rng.choice(["truncate", "truncate", "head", "head", "stream", "stream", "stream", "section",
                       "flip", "flip", "splice", "children", "body"])
    if kind == "truncate":
        b = rng.choice(_boundaries(data))
        cut = max(0, min(len(data) - 1, b + rng.choice([-3, -2, -1, 0, 0, 1, 2, 3])))
        return f"truncate at {cut} of {len(data)}", data[:cut]
    if kind == "head":
        h = next(s for s in secs if s.tag == "HEAD")
        buf = bytearray(h.payload)
        for _ in range(rng.choice([1, 1, 2])):
            off, code = rng.choice(_HEAD_FIELDS)
            value = rng.choice(_EXTREMES[code])
            _set_field(buf, off, code, value)
        h.payload = bytes(buf)
        return f"HEAD field at {off} = {value}", _resealed(version, secs)
    if kind == "stream":
        cands = [(i, o) for i, s in enumerate(secs) for o in _stream_offsets(s.payload) if s.tag != "HEAD"]
        if not cands:
            return "unchanged", data
        i, (o, _e) = rng.choice(cands)
        buf = bytearray(secs[i].payload)
        off, code = rng.choice(_STREAM_FIELDS)
        cur = struct.unpack_from("<" + code, buf, o + off)[0]
        value = rng.choice(_EXTREMES[code] + [max(cur - 1, 0), cur + 1 if cur + 1 < 256 ** struct.calcsize(code) else cur])
        _set_field(buf, o + off, code, value)
        secs[i].payload = bytes(buf)
        return f"{secs[i].tag}{secs[i].level} stream at {o} field {off} = {value}", _resealed(version, secs)
    if kind == "section":
        i = rng.randrange(len(secs))
        what = rng.choice(["level", "reserved", "tag", "length"])
        s = secs[i]
        if what == "level":
            s.level = rng.choice(_U8)
        elif what == "reserved":
            s.reserved = (rng.choice(_U8), rng.choice(_U16))
        elif what == "tag":
            s.tag = rng.choice(["HEAD", "CBSR", "CBSH", "SHQP", "PALT", "LEVL", "END0", "XXXX", "levl"])
        else:
            s.length = rng.choice(_U32)
            return f"section {i} length = {s.length}", pack(secs, version)
        return f"section {i} {what}", pack([replace(x, crc=None) for x in secs], version)
    if kind == "flip":
        i = rng.randrange(len(secs))
        if not secs[i].payload:
            return "unchanged", data
        buf = bytearray(secs[i].payload)
        for _ in range(rng.choice([1, 1, 2, 8])):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        secs[i].payload = bytes(buf)
        if rng.random() < 0.1:  # a few with the old CRC: the checksum must catch them
            return f"flip in section {i}, CRC kept", _with_old_crc(data, secs, i, version)
        return f"flip in section {i}", _resealed(version, secs)
    if kind == "splice":
        donor_version, dsecs = parse(rng.choice(donors))
        how = rng.choice(["swap_payload", "duplicate", "drop", "swap_order", "foreign", "prefix_suffix",
                          "foreign_stream"])
        i = rng.randrange(len(secs))
        if how == "swap_payload":
            j = rng.randrange(len(secs))
            secs[i].payload, secs[j].payload = secs[j].payload, secs[i].payload
        elif how == "duplicate":
            secs.insert(i, replace(secs[i]))
        elif how == "drop" and len(secs) > 1:
            secs.pop(i)
        elif how == "swap_order":
            j = rng.randrange(len(secs))
            secs[i], secs[j] = secs[j], secs[i]
        elif how == "foreign":
            d = rng.choice(dsecs)
            secs[i] = replace(d)
        elif how == "prefix_suffix":
            other = rng.choice(donors)
            cut_a, cut_b = rng.choice(_boundaries(data)), rng.choice(_boundaries(other))
            return f"splice prefix {cut_a} + donor suffix {cut_b}", data[:cut_a] + other[cut_b:]
        else:
            d = rng.choice([s for s in dsecs if s.tag == "LEVL"] or dsecs)
            ds, ts = _stream_offsets(d.payload), _stream_offsets(secs[i].payload)
            if ds and ts:
                a, b = rng.choice(ds)
                c, e = rng.choice(ts)
                secs[i].payload = secs[i].payload[:c] + d.payload[a:b] + secs[i].payload[e:]
        return f"splice {how} at section {i}", _resealed(version, secs)
    if kind == "children":
        lv = [i for i, s in enumerate(secs) if s.tag == "LEVL"]
        if not lv:
            return "unchanged", data
        i = rng.choice(lv)
        streams = parse_streams(secs[i].payload)
        if not streams:
            return "unchanged", data
        n = streams[-1].n
        values = rng.choice([np.full(n, 255), np.zeros(n, np.int64), np.full(n, rng.randrange(256)),
                             np.random.default_rng(rng.randrange(1 << 30)).integers(0, 256, n)])
        streams[-1] = int_stream(values, rng.choice([RAW, ZSTD]))
        secs[i].payload = pack_streams(streams)
        return f"LEVL {secs[i].level}: last stream replaced by {values[:1]}...", _resealed(version, secs)
    # body: overwrite a run of a stream body with zeros, 0xFF or random bytes (CRC recomputed)
    cands = [(i, o, e) for i, s in enumerate(secs) for o, e in _stream_offsets(s.payload) if e > o + STREAM.size]
    if not cands:
        return "unchanged", data
    i, o, e = rng.choice(cands)
    buf = bytearray(secs[i].payload)
    a = rng.randrange(o + STREAM.size, e)
    b = min(e, a + rng.choice([1, 4, 16, 1 << 20]))
    fill = rng.choice([b"\x00", b"\xff", None])
    buf[a:b] = bytes(rng.randrange(256) for _ in range(b - a)) if fill is None else fill * (b - a)
    secs[i].payload = bytes(buf)
    return f"body bytes {a}:{b} of section {i}", _resealed(version, secs)


def _with_old_crc(data: bytes, secs: list[Sec], i: int, version) -> bytes:
    _v, orig = parse(data)
    old_crc = struct.unpack_from("<I", pack_section(orig[i]), 12)[0]
    out = [replace(s, crc=None) for s in secs]
    out[i] = replace(secs[i], crc=old_crc)
    return pack(out, version)


def mutants(sources: list[bytes], count: int, seed: int):
    """``count`` mutants of the valid files ``sources`` (seeded) -> iterator of (what, bytes)."""
    rng = random.Random(seed)
    for k in range(count):
        src = sources[k % len(sources)]
        yield mutate(src, rng, sources)


_FUZZ_CHILD = r"""
import collections, json, resource, signal, sys, time
sys.path.insert(0, sys.argv[1])
import hostile
from visionmoe.splat import FormatError, decompress
sources = [open(p, "rb").read() for p in sys.argv[2].split(",")]
count, seed, budget = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
for s in sources:
    decompress(s)  # warm-up: every lazy import and first-call allocation before the baseline

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

class Hang(Exception):
    pass

def alarm(*_):
    raise Hang()

signal.signal(signal.SIGALRM, alarm)
base = status("VmSize")
resource.setrlimit(resource.RLIMIT_AS, (base + budget, resource.RLIM_INFINITY))
outcomes, escaped, slowest, t0 = collections.Counter(), [], (0.0, ""), time.perf_counter()
for what, data in hostile.mutants(sources, count, seed):
    t = time.perf_counter()
    signal.alarm(10)
    try:
        scene = decompress(data)
        ok = all(bool(getattr(scene, k).isfinite().all()) for k in
                 ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest"))
        outcomes["decoded" if ok else "non-finite"] += 1
        if not ok:
            escaped.append(f"{what}: decoded non-finite values")
    except FormatError:
        outcomes["FormatError"] += 1
    except Hang:
        outcomes["hang"] += 1
        escaped.append(f"{what}: no result within 10 s")
    except BaseException as exc:  # noqa: BLE001
        outcomes[type(exc).__name__] += 1
        escaped.append(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")
    finally:
        signal.alarm(0)
    dt = time.perf_counter() - t
    if dt > slowest[0]:
        slowest = (dt, what)
print(json.dumps({"outcomes": outcomes, "escaped": escaped[:20], "slowest_s": slowest[0], "slowest": slowest[1],
                  "seconds": time.perf_counter() - t0, "baseline": base, "peak": status("VmPeak") - base}))
"""


def fuzz_limited(sources: list[Path], count: int, seed: int, timeout: float) -> dict:
    """Decode ``count`` seeded mutants of ``sources`` in one child process under RLIMIT_AS
    (warmed baseline + the budget of the largest source) with a 10 s alarm per mutant."""
    budget = max(memory_budget(Path(p).stat().st_size) for p in sources)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", _FUZZ_CHILD, str(Path(__file__).parent), ",".join(map(str, sources)),
                           str(count), str(seed), str(budget)], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"fuzz child failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(lines[-1])
