"""Similarity transforms of Gaussian scenes (``x -> scale * R @ x + t``): positions,
orientations, log-scales and view-dependent SH bands, and the canonical frame PGMS encodes in.

A scene's canonical frame (:func:`canonical_similarity`) is centred on the scene, in units of
its size, with its up along +y and the principal axis across up along +x: it is derived from
the scene alone (and its up), so a turned, moved or rescaled copy (up turned with it) has the
same canonical scene up to float rounding. The encoder codes that scene and the file stores
the way back (section XFRM), so everything the encoder chooses is independent of the world's
axes, origin and units.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from .io import GaussianScene

__all__ = ["rotation_matrix", "quat_from_rotmat", "transform_scene", "canonical_similarity", "file_transform"]


def rotation_matrix(axis, angle_deg: float) -> torch.Tensor:
    """[3, 3] float64 rotation by ``angle_deg`` about ``axis`` (right-handed)."""
    a = torch.as_tensor(axis, dtype=torch.float64).reshape(3)
    if not (torch.isfinite(a).all() and a.norm() > 0):
        raise ValueError(f"axis must be a non-zero finite 3-vector, got {axis!r}")
    a = a / a.norm()
    th = math.radians(angle_deg)
    K = torch.tensor([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]], dtype=torch.float64)
    return torch.eye(3, dtype=torch.float64) + math.sin(th) * K + (1 - math.cos(th)) * K @ K


def quat_from_rotmat(R: torch.Tensor) -> torch.Tensor:
    """[4] (w, x, y, z) unit quaternion of a [3, 3] rotation matrix (w >= 0)."""
    R = torch.as_tensor(R, dtype=torch.float64)
    m = R
    tr = float(m[0, 0] + m[1, 1] + m[2, 2])
    if tr > 0:
        s = math.sqrt(tr + 1.0) * 2
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = math.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2]) * 2
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = math.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2]) * 2
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = math.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1]) * 2
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    q = torch.tensor([float(v) for v in q], dtype=torch.float64)
    q = q / q.norm()
    return -q if q[0] < 0 else q


def _quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product a * b of (w, x, y, z) quaternions (a [4], b [N, 4])."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                        aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw], dim=-1)


def _sh_rotation(degree: int, R: torch.Tensor) -> list[torch.Tensor]:
    """Per band l = 1..degree, the [2l+1, 2l+1] matrix D with ``c' = D c`` for SH coefficients
    in the renderer's real basis: a Gaussian turned by R looks from ``R d`` as it did from ``d``.
    Solved by least squares on sampled directions (exact: each band is closed under rotation)."""
    from ..ops.sh import sh_basis

    dirs = torch.randn(256, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    Y = sh_basis(degree, dirs)  # [M, K] at d'
    Yb = sh_basis(degree, dirs @ R)  # at R^T d'
    out = []
    for band in range(1, degree + 1):
        sl = slice(band * band, (band + 1) ** 2)
        out.append(torch.linalg.lstsq(Y[:, sl], Yb[:, sl]).solution)
    return out


_SH_ROWS = 1 << 16  # rows of SH bands rotated in float64 at once


def transform_scene(scene: GaussianScene, rotation=None, translation=None, scale: float = 1.0) -> GaussianScene:
    """The scene moved by ``x -> scale * rotation @ x + translation``: positions, orientations
    (quaternions composed with the rotation), log-scales (+ log scale) and view-dependent SH
    bands (rotated so every Gaussian looks the same from the moved viewpoint). Opacity and DC
    colour do not change. Computed in float64, returned in the scene's dtype."""
    R = torch.eye(3, dtype=torch.float64) if rotation is None else torch.as_tensor(rotation, dtype=torch.float64)
    t = torch.zeros(3, dtype=torch.float64) if translation is None else torch.as_tensor(translation,
                                                                                        dtype=torch.float64)
    if R.shape != (3, 3) or not torch.allclose(R @ R.T, torch.eye(3, dtype=torch.float64), atol=1e-6) \
            or float(torch.linalg.det(R)) < 0:
        raise ValueError("rotation must be a proper [3, 3] rotation matrix")
    if t.shape != (3,) or not torch.isfinite(t).all() or not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"translation must be a finite [3] vector and scale positive, got {t.tolist()}, {scale!r}")
    dt = scene.means.dtype
    means = scale * scene.means.double() @ R.T + t
    quats = _quat_mul(quat_from_rotmat(R), scene.quats.double())
    rest = scene.sh_rest
    if rest.shape[1]:
        bands = _sh_rotation(scene.sh_degree, R)
        out = torch.empty_like(rest)
        for i in range(0, rest.shape[0], _SH_ROWS):  # float64 a block at a time: [N, 15, 3] at 6M is 2.2 GB
            block = rest[i:i + _SH_ROWS].to(torch.float64, copy=True)  # never the caller's own (float64) rows
            for band, D in enumerate(bands, start=1):
                sl = slice(band * band - 1, (band + 1) ** 2 - 1)
                block[:, sl] = torch.einsum("ij,njc->nic", D, block[:, sl])
            out[i:i + _SH_ROWS] = block.to(rest.dtype)
        rest = out
    return replace(scene, means=means.to(dt), quats=quats.to(dt), log_scales=scene.log_scales + math.log(scale),
                   sh_rest=rest)


def canonical_similarity(scene: GaussianScene, up="-y") -> tuple[torch.Tensor, torch.Tensor, float]:
    """-> (R, t, s) of the scene's canonical frame: ``transform_scene(scene, R, t, s)`` is the
    scene centred on its :class:`~visionmoe.splat.cameras.SceneFrame` centre, scaled to unit
    size, turned so that ``up`` is +y and the frame's azimuth origin +x. Its inverse is
    ``(R.T, c, size)``: ``x = size * R.T @ x' + c``."""
    from .cameras import scene_frame

    frame = scene_frame(scene, up=up)
    R = frame.canonical_axes()
    s = 1.0 / frame.size
    return R, -s * (R @ frame.centre), s


def file_transform(rotation, translation, scale: float, sh_degree: int):
    """The XFRM section (:class:`~visionmoe.splat.pgms.file_transform.FileTransform`) of ``x -> scale *
    rotation @ x + translation``, with the SH band matrices of ``rotation`` up to ``sh_degree``."""
    import numpy as np

    from .pgms.file_transform import FileTransform, rotmat_from_quat

    q = quat_from_rotmat(rotation)
    R = rotmat_from_quat(q)  # the rotation every decoder rebuilds from the stored quaternion
    bands = tuple(D.numpy().astype(np.float32) for D in _sh_rotation(sh_degree, R)) if sh_degree else ()
    return FileTransform(tuple(q.tolist()), tuple(torch.as_tensor(translation, dtype=torch.float64).tolist()),
                         float(scale), math.log(scale), bands)
