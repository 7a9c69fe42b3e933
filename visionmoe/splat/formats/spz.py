"""Niantic ``.spz``: quantised attribute streams, gzip-wrapped (versions 2-3) or zstd per stream (4).

Layout (nianticlabs/spz ``load-spz.cc`` and its format specification):

- versions 2 and 3: one gzip stream holding a 16-byte header (``"NGSP"``, version, count,
  SH degree, fractional bits, flags, reserved) and the attribute arrays one after the other;
- version 4 (splat-transform's default): the 16 header bytes plus the stream count (byte 15),
  the table-of-contents offset (u32) and 12 reserved bytes in plaintext, then one
  ``(compressed, uncompressed)`` u64 pair per stream, then one zstd frame per stream.

The arrays, per Gaussian, in this order, each encode rule beside its decode rule below:
positions (3 x signed 24-bit fixed point, ``fractional_bits``), alpha (``sigmoid(opacity)``
in 8 bits), colour (``f_dc * 0.15 + 0.5`` in 8 bits: SPZ's own colour scale, not SH_C0),
log-scales (``(s + 10) * 16``), rotation (v2: x, y, z in 8 bits each with w >= 0 implied; v3+:
smallest three, 2-bit index and 3 x (sign + 9 bits)) and the SH bands above 0
(coefficient-major, RGB inner, ``x * 128 + 128``; the writer keeps 5 bits for degree 1 and 4 for
degrees 2-3, as Niantic's packer and splat-transform do).

Axes: the specification stores RUB (OpenGL) axes, but splat-transform 3.x, the tool most users
convert with, writes and reads the values as they are (its ``CoordinateSystem.UNSPECIFIED``), so
``axes="raw"`` (the default) matches it both ways. ``axes="rub"`` converts: the INRIA ``.ply``
frame (RDF) to RUB on writing and back on reading, a half turn about x.
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...common.files import atomic_write_bytes
from ..io import GaussianScene, SceneError

logger = logging.getLogger(__name__)

__all__ = ["AXES", "MAX_GAUSSIANS", "read_spz", "spz_bytes", "write_spz"]

MAGIC = 0x5053474E  # "NGSP" little-endian
VERSIONS = (2, 3, 4)
HEADER_V3 = struct.Struct("<IIIBBBB")  # magic, version, count, sh degree, fractional bits, flags, reserved
HEADER_V4 = struct.Struct("<IIIBBBBI12x")  # ... flags, stream count, TOC offset, reserved
FLAG_ANTIALIASED = 0x1
COLOR_SCALE = 0.15
SH_REST = (0, 3, 8, 15)  # SH coefficients above degree 0, per degree
SH1_BITS, SH_REST_BITS = 5, 4
MAX_FRACTIONAL_BITS = 12  # Niantic's default; lowered by the writer when positions need the range
MAX_GAUSSIANS = 1 << 28
AXES = ("raw", "rub")
_OPACITY_EPS = 1e-6


@dataclass
class PackedSpz:
    """The attribute arrays of one ``.spz``, as stored (uint8 unless said)."""

    sh_degree: int
    fractional_bits: int
    antialiased: bool
    positions: np.ndarray  # [N, 3, 3] little-endian 24-bit fixed point
    alphas: np.ndarray  # [N]
    colors: np.ndarray  # [N, 3]
    scales: np.ndarray  # [N, 3]
    rotations: np.ndarray  # [N, 3] (v2) or [N, 4] (v3+: one little-endian u32)
    sh: np.ndarray  # [N, K-1, 3]

    def streams(self) -> list[bytes]:
        out = [self.positions, self.alphas, self.colors, self.scales, self.rotations]
        if self.sh_degree:
            out.append(self.sh)
        return [np.ascontiguousarray(a).tobytes() for a in out]


def _round(x: np.ndarray) -> np.ndarray:
    """C's ``std::round`` (halves away from zero), exact for float32 values."""
    x = np.asarray(x, np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _u8(x: np.ndarray) -> np.ndarray:
    return np.clip(_round(x), 0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------- positions

def _pack_positions(means: np.ndarray, fractional_bits: int) -> np.ndarray:
    fixed = _round(means * np.float32(1 << fractional_bits)).astype(np.int64)
    fixed = np.clip(fixed, -(1 << 23), (1 << 23) - 1) & 0xFFFFFF
    return np.stack([(fixed >> s) & 0xFF for s in (0, 8, 16)], axis=-1).astype(np.uint8)


def _unpack_positions(b: np.ndarray, fractional_bits: int) -> np.ndarray:
    b = b.astype(np.int32)
    v = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    v = np.where(v & 0x800000, v - (1 << 24), v)
    return (v.astype(np.float64) / float(1 << fractional_bits)).astype(np.float32)


def _fractional_bits_for(means: np.ndarray) -> int:
    """The most fractional bits (at most 12) that keep every position inside 24 bits."""
    reach = float(np.abs(means).max()) if means.size else 0.0
    bits = MAX_FRACTIONAL_BITS
    while bits > 0 and reach * (1 << bits) >= (1 << 23) - 1:
        bits -= 1
    if reach * (1 << bits) >= (1 << 23):
        raise SceneError(f"positions reach {reach:g}, beyond the {1 << 23:d} units a .spz file can hold")
    return bits


# ----------------------------------------------------------------------------- alpha, colour, scale

def _pack_alpha(opacity_logits: np.ndarray) -> np.ndarray:
    one = np.float32(1.0)
    return _u8(one / (one + np.exp(-opacity_logits)) * np.float32(255.0))


def _unpack_alpha(a: np.ndarray) -> np.ndarray:
    p = np.clip(a.astype(np.float64) / 255.0, _OPACITY_EPS, 1 - _OPACITY_EPS)
    return np.log(p / (1 - p)).astype(np.float32)


def _pack_color(dc: np.ndarray) -> np.ndarray:
    return _u8(dc * (np.float32(COLOR_SCALE) * np.float32(255.0)) + np.float32(0.5 * 255.0))


def _unpack_color(c: np.ndarray) -> np.ndarray:
    return ((c.astype(np.float64) / 255.0 - 0.5) / COLOR_SCALE).astype(np.float32)


def _pack_scales(log_scales: np.ndarray) -> np.ndarray:
    return _u8((log_scales + np.float32(10.0)) * np.float32(16.0))


def _unpack_scales(s: np.ndarray) -> np.ndarray:
    return (s.astype(np.float32) / 16.0 - 10.0).astype(np.float32)


# ----------------------------------------------------------------------------- rotations

def _pack_rotations(quats_wxyz: np.ndarray) -> np.ndarray:
    """Smallest three (v3+): the index of the largest |component| of (x, y, z, w), made
    positive, in the top 2 bits; the other three as sign + 9-bit magnitude / sqrt(1/2), the
    lowest index in the highest bits."""
    q = np.roll(quats_wxyz, -1, axis=1)  # x, y, z, w
    norm = np.sqrt((q * q).sum(1, keepdims=True, dtype=np.float32))
    q = np.where(norm > 0, q / np.where(norm > 0, norm, np.float32(1.0)), np.float32([0, 0, 0, 1])).astype(np.float32)
    largest = np.argmax(np.abs(q), axis=1)
    q = q * np.where(q[np.arange(len(q)), largest] < 0, np.float32(-1.0), np.float32(1.0))[:, None]
    mask = (1 << 9) - 1
    packed = np.zeros(len(q), dtype=np.uint32)
    for j in range(4):
        keep = largest != j
        mag = np.clip(_round(np.float32(mask) * (np.abs(q[:, j]) / np.float32(np.sqrt(0.5)))), 0, mask).astype(np.uint32)
        comp = (packed << np.uint32(10)) | ((q[:, j] < 0).astype(np.uint32) << np.uint32(9)) | mag
        packed = np.where(keep, comp, packed)
    packed |= largest.astype(np.uint32) << np.uint32(30)
    return packed.astype("<u4").view(np.uint8).reshape(-1, 4)


def _unpack_rotations(r: np.ndarray, version: int) -> np.ndarray:
    """[N, 4] w, x, y, z (unit)."""
    if version == 2:
        xyz = r.astype(np.float64) / 127.5 - 1.0
        w = np.sqrt(np.maximum(0.0, 1.0 - (xyz * xyz).sum(1)))
        return np.concatenate([w[:, None], xyz], axis=1).astype(np.float32)
    packed = np.ascontiguousarray(r).view("<u4").reshape(-1).astype(np.uint32)
    largest = (packed >> np.uint32(30)).astype(np.int64)
    mask = (1 << 9) - 1
    q = np.zeros((len(packed), 4))
    for j in (3, 2, 1, 0):
        take = largest != j
        mag = (packed & np.uint32(mask)).astype(np.float64)
        neg = ((packed >> np.uint32(9)) & np.uint32(1)).astype(bool)
        v = np.sqrt(0.5) * mag / mask
        q[:, j] = np.where(take, np.where(neg, -v, v), 0.0)
        packed = np.where(take, packed >> np.uint32(10), packed)
    rows = np.arange(len(q))
    q[rows, largest] = np.sqrt(np.maximum(0.0, 1.0 - (q * q).sum(1)))
    return np.roll(q, 1, axis=1).astype(np.float32)  # x, y, z, w -> w, x, y, z


# ----------------------------------------------------------------------------- spherical harmonics

def _pack_sh(rest: np.ndarray) -> np.ndarray:
    """[N, K-1, 3] -> uint8, degree 1 on a grid of 2^5 steps and degrees 2-3 of 2^4."""
    q = _round(rest * np.float32(128.0)) + 128.0
    bucket = np.full(rest.shape[1], 1 << (8 - SH_REST_BITS), dtype=np.float64)
    bucket[:3] = 1 << (8 - SH1_BITS)
    bucket = bucket[None, :, None]
    q = np.floor((q + bucket / 2) / bucket) * bucket
    return np.clip(q, 0, 255).astype(np.uint8)


def _unpack_sh(sh: np.ndarray) -> np.ndarray:
    return ((sh.astype(np.float32) - 128.0) / 128.0).astype(np.float32)


# ----------------------------------------------------------------------------- axes

def _convert_axes(scene: GaussianScene, axes: str) -> GaussianScene:
    if axes not in AXES:
        raise ValueError(f"axes must be one of {AXES}, got {axes!r}")
    if axes == "raw":
        return scene
    from ..similarity import rotation_matrix, transform_scene

    return transform_scene(scene, rotation=rotation_matrix([1.0, 0.0, 0.0], 180.0))  # RDF <-> RUB


# ----------------------------------------------------------------------------- scene <-> packed

def pack(scene: GaussianScene, *, antialiased: bool = False) -> PackedSpz:
    """Quantise a scene into ``.spz`` arrays (v3+ rotations)."""
    s = scene.to("cpu")
    f32 = lambda t: t.detach().to(torch.float32).numpy()  # noqa: E731  (the reference packer's float32 arithmetic)
    means = f32(s.means)
    bits = _fractional_bits_for(means)
    if bits < MAX_FRACTIONAL_BITS:
        logger.info(".spz: positions reach %.4g; %d fractional bits (step %.3g)",
                    float(np.abs(means).max()), bits, 2.0 ** -bits)
    return PackedSpz(
        sh_degree=s.sh_degree, fractional_bits=bits, antialiased=antialiased,
        positions=_pack_positions(means, bits), alphas=_pack_alpha(f32(s.opacity_logits)),
        colors=_pack_color(f32(s.sh_dc)), scales=_pack_scales(f32(s.log_scales)),
        rotations=_pack_rotations(f32(s.quats)), sh=_pack_sh(f32(s.sh_rest)),
    )


def unpack(p: PackedSpz, version: int) -> GaussianScene:
    """Decode ``.spz`` arrays into a scene (splat-transform's decoding, value for value)."""
    t = torch.from_numpy
    return GaussianScene(
        means=t(_unpack_positions(p.positions, p.fractional_bits)),
        quats=t(np.ascontiguousarray(_unpack_rotations(p.rotations, version))),
        log_scales=t(_unpack_scales(p.scales)), opacity_logits=t(_unpack_alpha(p.alphas)),
        sh_dc=t(_unpack_color(p.colors)), sh_rest=t(_unpack_sh(p.sh)),
    )


# ----------------------------------------------------------------------------- containers

def _stream_sizes(n: int, sh_degree: int, version: int) -> list[int]:
    sizes = [9 * n, n, 3 * n, 3 * n, (3 if version == 2 else 4) * n]
    if sh_degree:
        sizes.append(3 * SH_REST[sh_degree] * n)
    return sizes


def _arrays(streams: list[bytes], n: int, sh_degree: int, fractional_bits: int, flags: int,
            version: int) -> PackedSpz:
    a = [np.frombuffer(b, dtype=np.uint8) for b in streams]
    return PackedSpz(
        sh_degree=sh_degree, fractional_bits=fractional_bits, antialiased=bool(flags & FLAG_ANTIALIASED),
        positions=a[0].reshape(n, 3, 3), alphas=a[1], colors=a[2].reshape(n, 3), scales=a[3].reshape(n, 3),
        rotations=a[4].reshape(n, 3 if version == 2 else 4),
        sh=(a[5] if sh_degree else np.zeros(0, np.uint8)).reshape(n, SH_REST[sh_degree], 3),
    )


def _check_header(name: str, magic: int, version: int, n: int, sh_degree: int, fractional_bits: int) -> None:
    if magic != MAGIC:
        raise SceneError(f"{name}: not a .spz file (expected the magic 'NGSP', found {struct.pack('<I', magic)!r})")
    if version not in VERSIONS:
        raise SceneError(f"{name}: .spz version {version} is not supported (expected one of {VERSIONS})")
    if sh_degree > 3:
        raise SceneError(f"{name}: SH degree {sh_degree}; this reader supports degrees 0-3")
    if n > MAX_GAUSSIANS:
        raise SceneError(f"{name}: {n} Gaussians, more than the {MAX_GAUSSIANS} this reader accepts")
    if n == 0:
        raise SceneError(f"{name}: empty .spz file (no Gaussians)")
    if fractional_bits > 24:
        raise SceneError(f"{name}: {fractional_bits} fractional bits for 24-bit positions; corrupt header")


def _gunzip(raw: bytes, name: str) -> bytes:
    """The whole gzip payload, bounded by the size its header announces (no decompression bomb)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        head = d.decompress(raw, HEADER_V3.size)
        if len(head) < HEADER_V3.size:
            raise SceneError(f"{name}: truncated .spz (gzip stream ends inside the header)")
        magic, version, n, deg, bits, _, _ = HEADER_V3.unpack(head)
        _check_header(name, magic, version, n, deg, bits)
        need = sum(_stream_sizes(n, deg, version))
        body = d.decompress(d.unconsumed_tail, need)
    except zlib.error as exc:
        raise SceneError(f"{name}: corrupt .spz gzip stream ({exc})") from None
    if len(body) < need:
        raise SceneError(f"{name}: truncated .spz: {len(body)} of {need} payload bytes")
    return head + body[:need]


def _decode_v3(raw: bytes, name: str) -> tuple[PackedSpz, int]:
    data = _gunzip(raw, name)
    magic, version, n, deg, bits, flags, _ = HEADER_V3.unpack_from(data)
    sizes = _stream_sizes(n, deg, version)
    offsets = np.cumsum([HEADER_V3.size] + sizes)
    streams = [data[offsets[i]:offsets[i + 1]] for i in range(len(sizes))]
    return _arrays(streams, n, deg, bits, flags, version), version


def _decode_v4(raw: bytes, name: str) -> tuple[PackedSpz, int]:
    import zstandard

    if len(raw) < HEADER_V4.size:
        raise SceneError(f"{name}: truncated .spz ({len(raw)} bytes, the header alone is {HEADER_V4.size})")
    magic, version, n, deg, bits, flags, count, toc = HEADER_V4.unpack_from(raw)
    _check_header(name, magic, version, n, deg, bits)
    if version < 4:
        raise SceneError(f"{name}: a version {version} .spz must be gzip-compressed; corrupt file")
    sizes = _stream_sizes(n, deg, version)
    if count != len(sizes):
        raise SceneError(f"{name}: {count} streams for SH degree {deg}, expected {len(sizes)}")
    if toc < HEADER_V4.size or toc + 16 * count > len(raw):
        raise SceneError(f"{name}: truncated .spz (table of contents at byte {toc} of {len(raw)})")
    offset, streams = toc + 16 * count, []
    for i, want in enumerate(sizes):
        packed, plain = struct.unpack_from("<QQ", raw, toc + 16 * i)
        if plain != want:
            raise SceneError(f"{name}: stream {i} holds {plain} bytes, expected {want} for {n} Gaussians")
        if offset + packed > len(raw):
            raise SceneError(f"{name}: truncated .spz: stream {i} ends at byte {offset + packed} of {len(raw)}")
        try:
            data = zstandard.ZstdDecompressor().decompress(raw[offset:offset + packed], max_output_size=want)
        except zstandard.ZstdError as exc:
            raise SceneError(f"{name}: corrupt .spz stream {i} ({exc})") from None
        if len(data) != want:
            raise SceneError(f"{name}: stream {i} decodes to {len(data)} bytes, expected {want}")
        streams.append(data)
        offset += packed
    return _arrays(streams, n, deg, bits, flags, version), version


def read_spz(path: str | os.PathLike, *, axes: str = "raw") -> GaussianScene:
    """Read a Niantic ``.spz`` file (versions 2-4, SH degree 0-3) into a :class:`GaussianScene`.

    Raises :class:`SceneError` on a wrong magic, an unsupported version or SH degree, a
    truncated or corrupt stream. ``axes`` (see the module docstring) must match the writer's.
    """
    if axes not in AXES:
        raise ValueError(f"axes must be one of {AXES}, got {axes!r}")
    path = Path(path)
    if not path.is_file():
        raise SceneError(f"{path}: no such file")
    raw = path.read_bytes()
    if len(raw) < 4:
        raise SceneError(f"{path}: truncated .spz ({len(raw)} bytes)")
    decode = _decode_v3 if raw[:2] == b"\x1f\x8b" else _decode_v4
    packed, version = decode(raw, str(path))
    if packed.antialiased:
        logger.info("%s: trained with antialiasing (its flag is not kept: scenes render without the filter)", path)
    return _convert_axes(unpack(packed, version), axes)


def spz_bytes(scene: GaussianScene, *, version: int = 4, axes: str = "raw", level: int = 12) -> bytes:
    """The ``.spz`` encoding of a scene: ``version`` 4 (zstd streams, as splat-transform 3.x
    writes by default) or 3 (one gzip stream, what older readers expect)."""
    if version not in (3, 4):
        raise ValueError(f"version must be 3 or 4, got {version!r}")
    p = pack(_convert_axes(scene, axes))
    n = scene.num_gaussians
    flags = FLAG_ANTIALIASED if p.antialiased else 0
    streams = p.streams()
    if version == 3:
        head = HEADER_V3.pack(MAGIC, 3, n, p.sh_degree, p.fractional_bits, flags, 0)
        return gzip.compress(head + b"".join(streams), compresslevel=9, mtime=0)
    import zstandard

    cctx = zstandard.ZstdCompressor(level=level)
    frames = [cctx.compress(s) for s in streams]
    head = HEADER_V4.pack(MAGIC, 4, n, p.sh_degree, p.fractional_bits, flags, len(frames), HEADER_V4.size)
    toc = b"".join(struct.pack("<QQ", len(f), len(s)) for f, s in zip(frames, streams))
    return head + toc + b"".join(frames)


def write_spz(scene: GaussianScene, path: str | os.PathLike, *, version: int = 4, axes: str = "raw") -> Path:
    """Write ``scene`` as a Niantic ``.spz`` file, atomically (:func:`spz_bytes`)."""
    return atomic_write_bytes(path, spz_bytes(scene, version=version, axes=axes))
