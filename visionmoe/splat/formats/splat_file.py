"""antimatter15 ``.splat``: 32 bytes per Gaussian, no header, no view-dependent colour.

Layout of one record (little-endian), as written by antimatter15/splat's ``convert.py`` and
read by its WebGL viewer, PlayCanvas splat-transform and most web viewers:

| bytes | field | encoding |
|---|---|---|
| 0-11 | position x, y, z | float32 |
| 12-23 | scale x, y, z | float32, linear (``exp`` of the INRIA log-scales) |
| 24-27 | colour r, g, b, alpha | uint8: ``(0.5 + SH_C0 f_dc) * 255`` and ``sigmoid(opacity) * 255`` |
| 28-31 | rotation w, x, y, z | uint8: ``q / |q| * 128 + 128`` |

Records are sorted by decreasing ``exp(sum of log-scales) * opacity`` (the viewer streams the
largest first). Writing drops the SH bands above degree 0; reading gives SH degree 0.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch

from ...common.files import atomic_write_bytes
from ..io import GaussianScene, SceneError
from ..scene_check import check_finite
from ._common import SH_C0

logger = logging.getLogger(__name__)

__all__ = ["SPLAT_DTYPE", "read_splat", "splat_bytes", "write_splat"]

RECORD_BYTES = 32
SPLAT_DTYPE = np.dtype([("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)])
_OPACITY_EPS = 1e-6  # alpha 0 and 255 decode to finite logits (as splat-transform does)
_MIN_SCALE = 1e-30  # a zero scale decodes to log(1e-30), not -inf
MAX_GAUSSIANS = 1 << 28


def _u8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x), 0, 255).astype(np.uint8)


def splat_bytes(scene: GaussianScene) -> bytes:
    """The ``.splat`` encoding of a scene (see the module docstring)."""
    s = scene.to("cpu")
    n = s.num_gaussians
    means = s.means.detach().double().numpy()
    log_scales = s.log_scales.detach().double().numpy()
    alpha = 1.0 / (1.0 + np.exp(-s.opacity_logits.detach().double().numpy()))
    q = s.quats.detach().double().numpy()
    norm = np.linalg.norm(q, axis=1, keepdims=True)
    q = np.where(norm > 0, q / np.where(norm > 0, norm, 1.0), np.array([1.0, 0, 0, 0]))
    rec = np.zeros(n, SPLAT_DTYPE)
    rec["position"] = means.astype(np.float32)
    with np.errstate(over="ignore"):
        rec["scale"] = np.exp(log_scales).astype(np.float32)
    rec["rgba"][:, :3] = _u8((0.5 + SH_C0 * s.sh_dc.detach().double().numpy()) * 255.0)
    rec["rgba"][:, 3] = _u8(alpha * 255.0)
    rec["rot"] = _u8(q * 128.0 + 128.0)
    importance = -np.exp(log_scales.sum(1)) * alpha
    order = np.argsort(importance, kind="stable")
    return rec[order].tobytes()


def write_splat(scene: GaussianScene, path: str | os.PathLike) -> Path:
    """Write ``scene`` as an antimatter15 ``.splat`` file, atomically; SH bands above 0 are dropped."""
    if scene.sh_degree > 0:
        logger.info("%s: .splat keeps only the base colour (SH degree %d -> 0)", path, scene.sh_degree)
    return atomic_write_bytes(path, splat_bytes(scene))


def read_splat(path: str | os.PathLike, *, nonfinite: str = "reject") -> GaussianScene:
    """Read an antimatter15 ``.splat`` file into a :class:`GaussianScene` (SH degree 0).

    Scales become log-scales, alpha an opacity logit (alpha 0 and 255 clamped 1e-6 away
    from 0 and 1), colours DC coefficients, rotations normalised quaternions. Raises
    :class:`SceneError` on a size that is not a multiple of 32 bytes, an empty file,
    negative scales, or NaN/Inf values (``nonfinite="drop"`` drops those Gaussians instead).
    """
    if nonfinite not in ("reject", "drop"):
        raise ValueError(f"nonfinite must be 'reject' or 'drop', got {nonfinite!r}")
    path = Path(path)
    if not path.is_file():
        raise SceneError(f"{path}: no such file")
    size = path.stat().st_size
    if size == 0:
        raise SceneError(f"{path}: empty .splat file (no Gaussians)")
    if size % RECORD_BYTES:
        raise SceneError(f"{path}: {size} bytes is not a multiple of the 32-byte .splat record; "
                         "truncated, or not a .splat file")
    if size // RECORD_BYTES > MAX_GAUSSIANS:
        raise SceneError(f"{path}: {size // RECORD_BYTES} Gaussians, more than the {MAX_GAUSSIANS} this reader accepts")
    rec = np.fromfile(path, dtype=SPLAT_DTYPE)
    return scene_from_records(rec, str(path), nonfinite=nonfinite)


def scene_from_records(rec: np.ndarray, name: str = ".splat", *, nonfinite: str = "reject") -> GaussianScene:
    """Decode ``.splat`` records (an array of :data:`SPLAT_DTYPE`)."""
    n = len(rec)
    with np.errstate(invalid="ignore"):  # a signalling NaN warns when cast; NaN/Inf are reported below
        means = rec["position"].astype(np.float32)
        scales = rec["scale"].astype(np.float64)
    if (scales < 0).any():
        raise SceneError(f"{name}: {int((scales < 0).any(1).sum())} Gaussians have negative scales; not a .splat file?")
    finite = np.isfinite(means).all(1) & np.isfinite(scales).all(1)
    bad = int(n - finite.sum())
    if bad:
        if nonfinite == "reject":
            raise SceneError(f"{name}: {bad} of {n} Gaussians have NaN/Inf positions or scales")
        if bad == n:
            raise SceneError(f"{name}: every Gaussian ({n}) has NaN/Inf values")
        logger.warning("%s: dropped %d of %d Gaussians with NaN/Inf values", name, bad, n)
        rec, means, scales = rec[finite], means[finite], scales[finite]
        n = len(rec)
    log_scales = np.log(np.maximum(scales, _MIN_SCALE)).astype(np.float32)
    rgba = rec["rgba"].astype(np.float64) / 255.0
    alpha = np.clip(rgba[:, 3], _OPACITY_EPS, 1 - _OPACITY_EPS)
    opacity = np.log(alpha / (1 - alpha)).astype(np.float32)
    dc = ((rgba[:, :3] - 0.5) / SH_C0).astype(np.float32)
    q = (rec["rot"].astype(np.float64) - 128.0) / 128.0
    norm = np.linalg.norm(q, axis=1, keepdims=True)
    q = np.where(norm > 0, q / np.where(norm > 0, norm, 1.0), np.array([1.0, 0, 0, 0])).astype(np.float32)
    t = torch.from_numpy
    scene = GaussianScene(
        means=t(np.ascontiguousarray(means)), quats=t(np.ascontiguousarray(q)), log_scales=t(log_scales),
        opacity_logits=t(opacity), sh_dc=t(dc), sh_rest=torch.zeros(n, 0, 3),
    )
    # the one rule of every reader (a scale of 3.4e38 has a log-scale past exp's float32 range)
    return check_finite(scene, name, nonfinite=nonfinite)[0]
