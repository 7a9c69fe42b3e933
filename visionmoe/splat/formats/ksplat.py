"""mkkellogg GaussianSplats3D ``.ksplat`` (read only): sections of bucketed, optionally half-float Gaussians.

Layout (GaussianSplats3D's ``SplatBuffer``, version 0.1, little-endian), as splat-transform reads it:

- a 4096-byte header: version (u8 major 0, u8 minor >= 1), section count (u32 @4), Gaussian
  count (u32 @16), compression level (u16 @20: 0 float32, 1 float16, 2 float16 + 8-bit SH),
  the SH range of level 2 (f32 @36, @40; 0 means -1.5 / 1.5);
- one 1024-byte header per section: its Gaussian count (u32 @0) and capacity (@4), bucket
  capacity (@8) and count (@12), bucket block size (f32 @16), bucket storage bytes (u16 @20),
  position quantisation range (u32 @24; 0 means 32767), full and partial bucket counts (@32,
  @36), SH degree (u16 @40);
- per section: the partial buckets' sizes (u32 each), the bucket centres (3 x f32 each), then
  ``capacity`` records: position (3 x f32, or 3 x u16 offsets from the bucket centre), linear
  scale (3 x f32/f16), rotation w, x, y, z (4 x f32/f16), colour r, g, b, alpha (u8:
  ``0.5 + SH_C0 f_dc`` and ``sigmoid(opacity)``), and the SH bands above 0 grouped by degree,
  channel-major inside each degree (f32, f16 or u8 over the header's range).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import torch

from ..io import GaussianScene, SceneError
from ._common import SH_C0

__all__ = ["MAX_GAUSSIANS", "read_ksplat"]

MAIN_HEADER, SECTION_HEADER = 4096, 1024
MAX_GAUSSIANS = 1 << 28
_SH_REST = (0, 3, 8, 15)
_FLOAT = {0: "<f4", 1: "<f2", 2: "<f2"}
_SH_TYPE = {0: "<f4", 1: "<f2", 2: "u1"}
_DEFAULT_QUANT_RANGE = 32767
_OPACITY_EPS = 1e-6
_MIN_LOG_SCALE = -10.0  # GaussianSplats3D / splat-transform: a zero scale reads as log-scale -10


def _sh_layout(degree: int) -> tuple[np.ndarray, np.ndarray]:
    """For each stored SH value of a section of ``degree``: its coefficient (0-based, above
    the DC term) and its channel (degree 1: 3 per channel; 2: 5; 3: 7, channel-major)."""
    coeff, channel, first = [], [], 0
    for d in range(1, degree + 1):
        per = 2 * d + 1
        for i in range(3 * per):
            channel.append(i // per)
            coeff.append(first + i % per)
        first += per
    return np.array(coeff, dtype=np.int64), np.array(channel, dtype=np.int64)


def _record_dtype(level: int, sh_degree: int) -> np.dtype:
    pos = "<f4" if level == 0 else "<u2"
    fields = [("position", pos, 3), ("scale", _FLOAT[level], 3), ("rotation", _FLOAT[level], 4), ("rgba", "u1", 4)]
    k = 3 * _SH_REST[sh_degree]
    if k:
        fields.append(("sh", _SH_TYPE[level], k))
    return np.dtype(fields)


def _bucket_of(count: int, capacity: int, full: int, partial_sizes: np.ndarray, name: str) -> np.ndarray:
    in_full = min(count, full * capacity)
    idx = np.arange(in_full, dtype=np.int64) // max(capacity, 1)
    rest = count - in_full
    if rest:
        tail = np.repeat(np.arange(full, full + len(partial_sizes), dtype=np.int64), partial_sizes.astype(np.int64))
        if len(tail) < rest:
            raise SceneError(f"{name}: partial buckets hold {len(tail)} Gaussians, the section has {rest} outside full buckets")
        idx = np.concatenate([idx, tail[:rest]])
    return idx


def _read_section(raw: bytes, offset: int, header: tuple, level: int, sh_range: tuple[float, float],
                  name: str) -> tuple[dict, int]:
    count, capacity, bucket_cap, bucket_count, block, storage, qrange, full, partial, sh_degree = header
    if sh_degree > 3:
        raise SceneError(f"{name}: section SH degree {sh_degree}; this reader supports degrees 0-3")
    if count > capacity:
        raise SceneError(f"{name}: a section holds {count} Gaussians but has room for {capacity}")
    qrange = qrange or _DEFAULT_QUANT_RANGE
    rec = _record_dtype(level, sh_degree)
    bucket_bytes = storage * bucket_count + 4 * partial
    end = offset + bucket_bytes + rec.itemsize * capacity
    if end > len(raw) or 4 * partial + 12 * bucket_count > bucket_bytes:
        raise SceneError(f"{name}: truncated .ksplat: a section needs bytes up to {end}, the file has {len(raw)}")
    sizes = np.frombuffer(raw, "<u4", partial, offset)
    centres = np.frombuffer(raw, "<f4", 3 * bucket_count, offset + 4 * partial).reshape(-1, 3).astype(np.float64)
    r = np.frombuffer(raw, rec, count, offset + bucket_bytes)
    if level == 0:
        means = r["position"].astype(np.float32)
    else:
        bucket = _bucket_of(count, bucket_cap, full, sizes, name)
        if count and (bucket.max() >= bucket_count):
            raise SceneError(f"{name}: Gaussians refer to bucket {int(bucket.max())} of {bucket_count}")
        step = float(np.float32(block)) / 2.0 / qrange
        means = ((r["position"].astype(np.float64) - qrange) * step + centres[bucket]).astype(np.float32)
    scales = r["scale"].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_scales = np.where(scales > 0, np.log(np.where(scales > 0, scales, 1.0)), _MIN_LOG_SCALE)
    rgba = r["rgba"].astype(np.float64) / 255.0
    alpha = np.clip(rgba[:, 3], _OPACITY_EPS, 1 - _OPACITY_EPS)
    rest = np.zeros((count, _SH_REST[sh_degree], 3), np.float32)
    if sh_degree:
        vals = r["sh"].astype(np.float64)
        if level == 2:
            lo, hi = sh_range
            vals = lo + vals / 255.0 * (hi - lo)
        coeff, channel = _sh_layout(sh_degree)
        rest[:, coeff, channel] = vals.astype(np.float32)
    attrs = {
        "means": means, "quats": r["rotation"].astype(np.float32), "log_scales": log_scales.astype(np.float32),
        "opacity_logits": np.log(alpha / (1 - alpha)).astype(np.float32),
        "sh_dc": ((rgba[:, :3] - 0.5) / SH_C0).astype(np.float32), "sh_rest": rest,
    }
    return attrs, end


def read_ksplat(path: str | os.PathLike) -> GaussianScene:
    """Read a GaussianSplats3D ``.ksplat`` file (compression levels 0-2, SH degree 0-3).

    Values decode as splat-transform decodes them (a zero scale reads as log-scale -10, alpha
    0 and 255 clamped 1e-6 from 0 and 1). Raises :class:`SceneError` on a wrong version,
    compression level or SH degree, counts that disagree, or a truncated file.
    """
    path = Path(path)
    if not path.is_file():
        raise SceneError(f"{path}: no such file")
    raw = path.read_bytes()
    name = str(path)
    if len(raw) < MAIN_HEADER:
        raise SceneError(f"{name}: truncated .ksplat ({len(raw)} bytes, the header alone is {MAIN_HEADER})")
    major, minor = raw[0], raw[1]
    if major != 0 or minor < 1:
        raise SceneError(f"{name}: .ksplat version {major}.{minor} is not supported (expected 0.1 or later); "
                         "not a .ksplat file?")
    sections, n = struct.unpack_from("<I", raw, 4)[0], struct.unpack_from("<I", raw, 16)[0]
    level = struct.unpack_from("<H", raw, 20)[0]
    lo, hi = struct.unpack_from("<ff", raw, 36)
    if level > 2:
        raise SceneError(f"{name}: .ksplat compression level {level} is not supported (expected 0, 1 or 2)")
    if n == 0:
        raise SceneError(f"{name}: empty .ksplat file (no Gaussians)")
    if n > MAX_GAUSSIANS:
        raise SceneError(f"{name}: {n} Gaussians, more than the {MAX_GAUSSIANS} this reader accepts")
    offset = MAIN_HEADER + SECTION_HEADER * sections
    if offset > len(raw):
        raise SceneError(f"{name}: truncated .ksplat: {sections} section headers need {offset} bytes, "
                         f"the file has {len(raw)}")
    headers = [struct.unpack_from("<IIIIfHxxIxxxxIIH", raw, MAIN_HEADER + SECTION_HEADER * i) for i in range(sections)]
    degree = max((h[9] for h in headers if h[0]), default=0)
    parts = []
    for h in headers:
        attrs, offset = _read_section(raw, offset, h, level, (lo or -1.5, hi or 1.5), name)
        if degree <= 3 and attrs["sh_rest"].shape[1] < _SH_REST[degree]:  # a lower-degree section: zero bands
            pad = np.zeros((len(attrs["means"]), _SH_REST[degree] - attrs["sh_rest"].shape[1], 3), np.float32)
            attrs["sh_rest"] = np.concatenate([attrs["sh_rest"], pad], axis=1)
        parts.append(attrs)
    total = sum(len(p["means"]) for p in parts)
    if total != n:
        raise SceneError(f"{name}: the header announces {n} Gaussians, the sections hold {total}")
    return GaussianScene(**{k: torch.from_numpy(np.ascontiguousarray(np.concatenate([p[k] for p in parts])))
                            for k in parts[0]})
