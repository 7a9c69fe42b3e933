"""PlayCanvas ``compressed.ply``: Gaussians quantised in chunks of 256 (SuperSplat, splat-transform).

A binary little-endian ``.ply`` with three elements:

- ``chunk`` (one per 256 Gaussians, float32): ``min_/max_`` of x, y, z, of the three
  log-scales (clamped to [-20, 20]) and, in current files, of the colour r, g, b
  (``0.5 + SH_C0 f_dc``);
- ``vertex`` (uint32 x 4): ``packed_position`` and ``packed_scale`` (11, 10, 11 bits of the
  value normalised to its chunk's range), ``packed_rotation`` (2 bits: the index of the
  largest component of the normalised ``rot_0..rot_3``, made positive; 3 x 10 bits: the other
  three in order, times sqrt(2)/2 plus 0.5) and ``packed_color`` (8 bits each: r, g, b
  normalised to the chunk's range, or absolute in older files, and ``sigmoid(opacity)``);
- ``sh`` (optional, uint8 x 9/24/45): ``f_rest_i / 8 + 0.5`` in 256 steps (byte 0 reads as -4,
  255 as +4, others at their bin's centre).

The writer sorts the Gaussians along splat-transform's Morton curve and quantises exactly as
splat-transform 3.x does (same rounding, same chunk ranges), so both write the same payload
for the same input. Each encode rule sits next to its decode rule below.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np
import torch

from ...common.files import atomic_write_bytes
from ..io import GaussianScene, SceneError
from ..scene_check import check_finite
from ._common import SH_C0, morton_order

logger = logging.getLogger(__name__)

__all__ = ["CHUNK_SIZE", "compressed_ply_bytes", "is_compressed_ply", "read_compressed_ply", "write_compressed_ply"]

CHUNK_SIZE = 256
_CHUNK_PROPS = ["min_x", "min_y", "min_z", "max_x", "max_y", "max_z",
                "min_scale_x", "min_scale_y", "min_scale_z", "max_scale_x", "max_scale_y", "max_scale_z",
                "min_r", "min_g", "min_b", "max_r", "max_g", "max_b"]
_VERTEX_PROPS = ["packed_position", "packed_rotation", "packed_scale", "packed_color"]
_SCALE_CLAMP = 20.0
_OPACITY_EPS = 1e-6  # alpha bytes 0 and 255 decode to finite logits
_MAX_HEADER = 1 << 16
MAX_GAUSSIANS = 1 << 28
_TYPES = {"float": "<f4", "float32": "<f4", "uint": "<u4", "uint32": "<u4", "uchar": "u1", "uint8": "u1",
          "int": "<i4", "int32": "<i4", "double": "<f8", "float64": "<f8", "char": "i1", "int8": "i1",
          "short": "<i2", "int16": "<i2", "ushort": "<u2", "uint16": "<u2"}


# ----------------------------------------------------------------------------- unorm pairs

def _pack_unorm(v: np.ndarray, bits: int) -> np.ndarray:
    t = (1 << bits) - 1
    return np.clip(np.floor(v * t + 0.5), 0, t).astype(np.uint32)


def _unpack_unorm(v: np.ndarray, bits: int) -> np.ndarray:
    t = (1 << bits) - 1
    return (v & np.uint32(t)).astype(np.float64) / t


def _normalize(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Value in its chunk's range -> [0, 1] (splat-transform's rule: flat ranges give 0)."""
    span = hi - lo
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(span < 1e-5, 0.0, (x - lo) / np.where(span == 0, 1.0, span))
    return np.where(x <= lo, 0.0, np.where(x >= hi, 1.0, t))


def _lerp(lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> np.ndarray:
    return lo * (1 - t) + hi * t


def _pack_111011(v: np.ndarray) -> np.ndarray:  # [M, 3] in [0, 1]
    return (_pack_unorm(v[:, 0], 11) << np.uint32(21)) | (_pack_unorm(v[:, 1], 10) << np.uint32(11)) \
        | _pack_unorm(v[:, 2], 11)


def _unpack_111011(p: np.ndarray) -> np.ndarray:
    return np.stack([_unpack_unorm(p >> np.uint32(21), 11), _unpack_unorm(p >> np.uint32(11), 10),
                     _unpack_unorm(p, 11)], axis=1)


_ROT_NORM = math.sqrt(2) * 0.5


def _pack_rotation(q: np.ndarray) -> np.ndarray:  # [M, 4] rot_0..rot_3
    length = np.sqrt(q[:, 0] * q[:, 0] + q[:, 1] * q[:, 1] + q[:, 2] * q[:, 2] + q[:, 3] * q[:, 3])[:, None]
    a = np.where(length > 0, q * (1.0 / np.where(length > 0, length, 1.0)), np.array([0.0, 0, 0, 1]))
    largest = np.argmax(np.abs(a), axis=1)  # first of equal magnitudes, as splat-transform's reduce
    a = np.where(np.take_along_axis(a, largest[:, None], 1) < 0, -a, a)
    out = largest.astype(np.uint32)
    for slot in range(3):  # the three other components, in order
        comp = np.where(np.arange(4)[None, :] != largest[:, None])[1].reshape(-1, 3)[:, slot]
        v = np.take_along_axis(a, comp[:, None], 1)[:, 0]
        out = (out << np.uint32(10)) | _pack_unorm(v * _ROT_NORM + 0.5, 10)
    return out


def _unpack_rotation(p: np.ndarray) -> np.ndarray:
    abc = np.stack([(_unpack_unorm(p >> np.uint32(s), 10) - 0.5) / _ROT_NORM for s in (20, 10, 0)], axis=1)
    m = np.sqrt(np.maximum(0.0, 1.0 - (abc * abc).sum(1)))
    largest = (p >> np.uint32(30)).astype(np.int64)
    q = np.empty((len(p), 4))
    rows = np.arange(len(p))
    q[rows, largest] = m
    others = np.where(np.arange(4)[None, :] != largest[:, None])[1].reshape(-1, 3)
    for slot in range(3):
        q[rows, others[:, slot]] = abc[:, slot]
    return q


def _pack_sh(f_rest: np.ndarray) -> np.ndarray:
    return np.clip(np.trunc((f_rest / 8.0 + 0.5) * 256.0), 0, 255).astype(np.uint8)


def _unpack_sh(b: np.ndarray) -> np.ndarray:
    nrm = np.where(b == 0, 0.0, np.where(b == 255, 1.0, (b.astype(np.float64) + 0.5) / 256.0))
    return (nrm - 0.5) * 8.0


# ----------------------------------------------------------------------------- write

def _chunk_minmax(v: np.ndarray, num_chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-chunk min and max of v [N, ...] (a partial last chunk is padded with its last row)."""
    n = len(v)
    pad = num_chunks * CHUNK_SIZE - n
    full = np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) if pad else v
    full = full.reshape(num_chunks, CHUNK_SIZE, *v.shape[1:])
    return full.min(1), full.max(1)


def compressed_ply_bytes(scene: GaussianScene, comment: str = "Generated by visionmoe") -> bytes:
    """The ``compressed.ply`` encoding of a scene (see the module docstring)."""
    s = scene.to("cpu")
    n = s.num_gaussians
    if n == 0:
        raise SceneError("compressed.ply: the scene holds zero Gaussians")
    f32 = lambda t: t.detach().float().numpy()  # noqa: E731 - splat-transform keeps float32 columns
    means = f32(s.means)
    order = morton_order(means)
    means = means[order].astype(np.float64)
    log_scales = f32(s.log_scales)[order].astype(np.float64)
    quats = f32(s.quats)[order].astype(np.float64)
    opacity = f32(s.opacity_logits)[order].astype(np.float64)
    color = (f32(s.sh_dc)[order].astype(np.float64) * SH_C0 + 0.5).astype(np.float32).astype(np.float64)
    k = s.sh_rest.shape[1]
    f_rest = f32(s.sh_rest)[order].transpose(0, 2, 1).reshape(n, 3 * k)  # file order: channel-major
    num_chunks = -(-n // CHUNK_SIZE)
    chunk_of = np.arange(n) // CHUNK_SIZE

    pmin, pmax = _chunk_minmax(means, num_chunks)
    smin, smax = _chunk_minmax(log_scales, num_chunks)
    clamped = int((np.abs(log_scales) > _SCALE_CLAMP).any(1).sum())
    if clamped:  # the format's scale ranges: splat-transform clamps the same way
        logger.warning("compressed.ply: %d of %d Gaussians have log-scales outside [-%g, %g]; clamped", clamped, n,
                       _SCALE_CLAMP, _SCALE_CLAMP)
    smin, smax = np.clip(smin, -_SCALE_CLAMP, _SCALE_CLAMP), np.clip(smax, -_SCALE_CLAMP, _SCALE_CLAMP)
    cmin, cmax = _chunk_minmax(color, num_chunks)
    chunks = np.concatenate([pmin, pmax, smin, smax, cmin, cmax], axis=1).astype("<f4")

    c = chunk_of
    with np.errstate(over="ignore"):
        alpha = 1.0 / (1.0 + np.exp(-opacity))
    color_t = _normalize(color, cmin[c], cmax[c])
    packed = np.empty((n, 4), "<u4")
    packed[:, 0] = _pack_111011(_normalize(means, pmin[c], pmax[c]))
    packed[:, 1] = _pack_rotation(quats)
    packed[:, 2] = _pack_111011(_normalize(log_scales, smin[c], smax[c]))
    packed[:, 3] = ((_pack_unorm(color_t[:, 0], 8) << np.uint32(24)) | (_pack_unorm(color_t[:, 1], 8) << np.uint32(16))
                    | (_pack_unorm(color_t[:, 2], 8) << np.uint32(8)) | _pack_unorm(alpha, 8))
    header = ["ply", "format binary_little_endian 1.0", f"comment {comment}", f"element chunk {num_chunks}",
              *[f"property float {p}" for p in _CHUNK_PROPS], f"element vertex {n}",
              *[f"property uint {p}" for p in _VERTEX_PROPS]]
    if k:
        header += [f"element sh {n}", *[f"property uchar f_rest_{i}" for i in range(3 * k)]]
    header.append("end_header\n")
    parts = ["\n".join(header).encode("ascii"), chunks.tobytes(), packed.tobytes()]
    if k:
        parts.append(_pack_sh(f_rest.astype(np.float64)).tobytes())
    return b"".join(parts)


def write_compressed_ply(scene: GaussianScene, path: str | os.PathLike) -> Path:
    """Write ``scene`` as a PlayCanvas ``compressed.ply`` (SH degree kept, 8 bits per SH value), atomically."""
    return atomic_write_bytes(path, compressed_ply_bytes(scene))


# ----------------------------------------------------------------------------- read

def _parse_header(path: Path, raw: bytes):
    end = raw.find(b"end_header")
    nl = raw.find(b"\n", end) if end >= 0 else -1
    if not raw.startswith(b"ply") or end < 0 or nl < 0:
        raise SceneError(f"{path}: not a .ply file, or its header is truncated")
    try:
        lines = raw[:end].decode("ascii").splitlines()
    except UnicodeDecodeError:
        raise SceneError(f"{path}: .ply header is not ASCII text") from None
    fmt, elements = None, []
    for line in lines[1:]:
        tok = line.split()
        if not tok or tok[0] in ("comment", "obj_info"):
            continue
        if tok[0] == "format" and len(tok) >= 2:
            fmt = tok[1]
        elif tok[0] == "element" and len(tok) == 3 and tok[2].isdigit():
            elements.append((tok[1], int(tok[2]), []))
        elif tok[0] == "property" and len(tok) == 3 and elements and tok[1] in _TYPES:
            elements[-1][2].append((tok[2], _TYPES[tok[1]]))
        else:
            raise SceneError(f"{path}: unexpected compressed.ply header line {line.strip()!r}")
    if fmt != "binary_little_endian":
        raise SceneError(f"{path}: compressed.ply must be binary_little_endian, got format {fmt!r}")
    return elements, nl + 1


def is_compressed_ply(path: str | os.PathLike) -> bool:
    """Whether a ``.ply`` file is a PlayCanvas compressed one (a ``chunk`` element and packed vertices)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_MAX_HEADER)
    except OSError:
        return False
    end = head.find(b"end_header")
    return head.startswith(b"ply") and end > 0 and b"element chunk" in head[:end] and b"packed_position" in head[:end]


def _check_elements(path: Path, elements) -> tuple[int, int]:
    """The header's elements checked for a compressed.ply: -> (Gaussians, SH bytes per row)."""
    by_name = {e[0]: e for e in elements}
    if "chunk" not in by_name or "vertex" not in by_name:
        raise SceneError(f"{path}: not a compressed.ply (expected 'chunk' and 'vertex' elements)")
    _, num_chunks, chunk_props = by_name["chunk"]
    _, n, vertex_props = by_name["vertex"]
    if n == 0:
        raise SceneError(f"{path}: the scene holds zero Gaussians")
    if n > MAX_GAUSSIANS:
        raise SceneError(f"{path}: header claims {n} Gaussians, more than the {MAX_GAUSSIANS} this reader accepts")
    if num_chunks != -(-n // CHUNK_SIZE):
        raise SceneError(f"{path}: {num_chunks} chunks for {n} Gaussians; expected {-(-n // CHUNK_SIZE)} (256 per chunk)")
    names = {p for p, _ in chunk_props}
    need = set(_CHUNK_PROPS[:12])
    if not need <= names or any(t != "<f4" for _, t in chunk_props):
        raise SceneError(f"{path}: chunk element needs float properties {sorted(need - names) or _CHUNK_PROPS[:12]}")
    vnames = dict(vertex_props)
    if any(vnames.get(p) != "<u4" for p in _VERTEX_PROPS):
        raise SceneError(f"{path}: vertex element needs uint properties {_VERTEX_PROPS}")
    sh = by_name.get("sh")
    k3 = 0
    if sh is not None:
        _, sh_n, sh_props = sh
        k3 = len(sh_props)
        if sh_n != n or k3 not in (9, 24, 45) or [p for p, _ in sh_props] != [f"f_rest_{i}" for i in range(k3)] \
                or any(t != "u1" for _, t in sh_props):
            raise SceneError(f"{path}: sh element must hold {n} rows of uchar f_rest_0..f_rest_K-1 (K = 9, 24 or 45)")
    return n, k3


def read_compressed_ply(path: str | os.PathLike, *, nonfinite: str = "reject") -> GaussianScene:
    """Read a PlayCanvas ``compressed.ply`` (SuperSplat / splat-transform, with or without colour
    ranges and SH) into a :class:`GaussianScene`.

    Raises :class:`SceneError` naming the file on a header that is not a compressed.ply, a
    chunk count that does not match the vertex count, a body shorter than the header
    declares, or non-finite chunk ranges. Finite ranges so large that a decoded value is not
    finite after activation in float32 (colour ranges of +-3.4e38 give infinite colours) break
    :func:`..scene_check.check_finite`'s rule: refused, or with ``nonfinite="drop"`` those
    Gaussians are dropped and counted in the log.
    """
    if nonfinite not in ("reject", "drop"):
        raise ValueError(f"nonfinite must be 'reject' or 'drop', got {nonfinite!r}")
    path = Path(path)
    if not path.is_file():
        raise SceneError(f"{path}: no such file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(_MAX_HEADER)
    elements, offset = _parse_header(path, head)
    n, k3 = _check_elements(path, elements)
    dtypes = {name: np.dtype([(p, t) for p, t in props]) for name, _, props in elements}
    need_bytes = offset + sum(count * dtypes[name].itemsize for name, count, _ in elements)
    if need_bytes > size:
        raise SceneError(f"{path}: truncated compressed.ply: the header declares {need_bytes - offset} bytes of data "
                         f"but {max(size - offset, 0)} follow it")
    data = {}
    with open(path, "rb") as f:
        f.seek(offset)
        for name, count, _ in elements:
            data[name] = np.frombuffer(f.read(count * dtypes[name].itemsize), dtype=dtypes[name], count=count)
    ch = data["chunk"]
    bounds = {p: ch[p].astype(np.float64) for p in ch.dtype.names}
    if not all(np.isfinite(bounds[p]).all() for p in _CHUNK_PROPS[:12]):
        raise SceneError(f"{path}: non-finite chunk ranges")
    v = data["vertex"]
    c = np.arange(n) // CHUNK_SIZE

    def ranged(axis_lo, axis_hi, t):
        return np.stack([_lerp(bounds[lo][c], bounds[hi][c], t[:, i]) for i, (lo, hi) in enumerate(zip(axis_lo, axis_hi))], 1)

    means = ranged(["min_x", "min_y", "min_z"], ["max_x", "max_y", "max_z"], _unpack_111011(v["packed_position"]))
    log_scales = ranged(["min_scale_x", "min_scale_y", "min_scale_z"], ["max_scale_x", "max_scale_y", "max_scale_z"],
                        _unpack_111011(v["packed_scale"]))
    quats = _unpack_rotation(v["packed_rotation"])
    pc = v["packed_color"]
    ct = np.stack([_unpack_unorm(pc >> np.uint32(s), 8) for s in (24, 16, 8)], axis=1)
    if all(p in bounds for p in _CHUNK_PROPS[12:]):
        color = ranged(["min_r", "min_g", "min_b"], ["max_r", "max_g", "max_b"], ct)
    else:  # older files: absolute 8-bit colour
        color = ct
    alpha = np.clip(_unpack_unorm(pc, 8), _OPACITY_EPS, 1 - _OPACITY_EPS)
    opacity = np.log(alpha / (1 - alpha))
    k = k3 // 3
    rest = (_unpack_sh(data["sh"].view(np.uint8).reshape(n, k3)).reshape(n, 3, k).transpose(0, 2, 1)
            if k3 else np.zeros((n, 0, 3)))
    if not np.isfinite(color).all():
        raise SceneError(f"{path}: non-finite colour ranges")
    with np.errstate(over="ignore", invalid="ignore"):  # huge finite ranges overflow float32: check_finite says so
        dc = (color - 0.5) / SH_C0
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
        scene = GaussianScene(means=t(means), quats=t(quats), log_scales=t(log_scales), opacity_logits=t(opacity),
                              sh_dc=t(dc), sh_rest=t(rest))
    return check_finite(scene, str(path), nonfinite=nonfinite)[0]
