"""GaussianScene and INRIA-layout .ply reading/writing (via plyfile)."""

from __future__ import annotations

import logging
import math
import os
import tempfile
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch
from plyfile import PlyData, PlyElement

logger = logging.getLogger(__name__)


class SceneError(ValueError):
    """A scene file or scene tensor is not what a 3DGS .ply must be; the message says why."""


def sh_coeffs(degree: int) -> int:
    return (degree + 1) ** 2


@dataclass
class GaussianScene:
    """A trained 3DGS scene in the INRIA parameterisation (activations not applied)."""

    means: torch.Tensor  # [N, 3]
    quats: torch.Tensor  # [N, 4] (w, x, y, z), not necessarily normalised
    log_scales: torch.Tensor  # [N, 3]
    opacity_logits: torch.Tensor  # [N]
    sh_dc: torch.Tensor  # [N, 3]
    sh_rest: torch.Tensor  # [N, K-1, 3], K = (sh_degree + 1)^2

    def __post_init__(self):
        n = self.means.shape[0]
        expected = {
            "means": (n, 3), "quats": (n, 4), "log_scales": (n, 3), "opacity_logits": (n,), "sh_dc": (n, 3),
        }
        for name, shape in expected.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise SceneError(f"GaussianScene.{name} must have shape {shape}, got {got}")
        rest = tuple(self.sh_rest.shape)
        if len(rest) != 3 or rest[0] != n or rest[2] != 3 or rest[1] not in (0, 3, 8, 15):
            raise SceneError(f"GaussianScene.sh_rest must have shape ({n}, K-1, 3) with K-1 in (0, 3, 8, 15), got {rest}")

    @property
    def num_gaussians(self) -> int:
        return int(self.means.shape[0])

    def __len__(self) -> int:
        return self.num_gaussians

    @property
    def sh_degree(self) -> int:
        return int(round(math.sqrt(self.sh_rest.shape[1] + 1))) - 1

    @property
    def sh(self) -> torch.Tensor:  # [N, K, 3]
        return torch.cat([self.sh_dc.unsqueeze(1), self.sh_rest], dim=1)

    @property
    def device(self) -> torch.device:
        return self.means.device

    def to(self, *args, **kwargs) -> GaussianScene:
        return replace(self, **{f.name: getattr(self, f.name).to(*args, **kwargs) for f in fields(self)})

    def subset(self, index: torch.Tensor) -> GaussianScene:
        """Gaussians selected by a bool mask [N] or an index tensor."""
        return replace(self, **{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def with_sh_degree(self, degree: int) -> GaussianScene:
        """Truncate (or zero-pad) the view-dependent SH bands to ``degree``."""
        k = sh_coeffs(degree) - 1
        rest = self.sh_rest[:, :k]
        if rest.shape[1] < k:
            pad = rest.new_zeros(rest.shape[0], k - rest.shape[1], 3)
            rest = torch.cat([rest, pad], dim=1)
        return replace(self, sh_rest=rest)

    def float_ply_bytes(self) -> int:
        """Size of this scene as a binary float32 INRIA .ply at its native SH degree (payload)."""
        per = 3 + 3 + 3 + 3 * (sh_coeffs(self.sh_degree) - 1) + 1 + 3 + 4  # xyz, normals, dc, rest, op, scale, rot
        return self.num_gaussians * per * 4


_REQUIRED = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity",
             "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]


def read_ply(path: str | os.PathLike, *, nonfinite: str = "reject") -> GaussianScene:
    """Read an INRIA-layout 3DGS .ply (ascii or binary, either endianness, SH degree 0-3).

    Extra properties are ignored. ``nonfinite``: "reject" raises SceneError on NaN/Inf
    values; "drop" removes those Gaussians and logs how many.
    """
    if nonfinite not in ("reject", "drop"):
        raise ValueError(f"nonfinite must be 'reject' or 'drop', got {nonfinite!r}")
    path = Path(path)
    if not path.is_file():
        raise SceneError(f"{path}: no such file")
    try:
        ply = PlyData.read(str(path))
    except Exception as exc:  # plyfile raises several types for malformed files
        raise SceneError(f"{path}: not a readable .ply file ({type(exc).__name__}: {exc})") from None
    if "vertex" not in ply:
        raise SceneError(f"{path}: no 'vertex' element; a 3DGS .ply stores Gaussians as vertices")
    vertex = ply["vertex"]
    names = {p.name for p in vertex.properties}
    missing = [n for n in _REQUIRED if n not in names]
    if missing:
        raise SceneError(f"{path}: missing vertex properties {missing}; expected an INRIA-layout 3DGS .ply")
    rest_names = sorted((n for n in names if n.startswith("f_rest_")), key=lambda s: int(s.split("_")[-1]))
    if len(rest_names) not in (0, 9, 24, 45):
        raise SceneError(f"{path}: {len(rest_names)} f_rest_* properties; expected 0, 9, 24 or 45 (SH degree 0-3)")
    n = len(vertex.data)
    if n == 0:
        raise SceneError(f"{path}: the scene holds zero Gaussians")

    def column(name: str) -> np.ndarray:
        col = vertex.data[name]
        if col.dtype.kind not in "fiu":
            raise SceneError(f"{path}: property {name} has type {col.dtype}, expected a number")
        return np.asarray(col, dtype=np.float32)

    def stack(cols) -> np.ndarray:
        return np.stack([column(c) for c in cols], axis=1) if cols else np.zeros((n, 0), np.float32)

    means = stack(["x", "y", "z"])
    dc = stack(["f_dc_0", "f_dc_1", "f_dc_2"])
    k = len(rest_names) // 3
    rest = stack(rest_names).reshape(n, 3, k).transpose(0, 2, 1)  # file is channel-major
    opacity = column("opacity")
    scales = stack(["scale_0", "scale_1", "scale_2"])
    quats = stack(["rot_0", "rot_1", "rot_2", "rot_3"])

    finite = (
        np.isfinite(means).all(1) & np.isfinite(dc).all(1) & np.isfinite(rest).all((1, 2))
        & np.isfinite(opacity) & np.isfinite(scales).all(1) & np.isfinite(quats).all(1)
    )
    bad = int(n - finite.sum())
    if bad:
        if nonfinite == "reject":
            raise SceneError(f"{path}: {bad} of {n} Gaussians have NaN/Inf values (use nonfinite='drop' to skip them)")
        logger.warning("%s: dropped %d of %d Gaussians with NaN/Inf values", path, bad, n)
        if bad == n:
            raise SceneError(f"{path}: every Gaussian has NaN/Inf values")
        means, dc, rest, opacity, scales, quats = (a[finite] for a in (means, dc, rest, opacity, scales, quats))

    t = torch.from_numpy
    return GaussianScene(
        means=t(np.ascontiguousarray(means)), quats=t(np.ascontiguousarray(quats)),
        log_scales=t(np.ascontiguousarray(scales)), opacity_logits=t(np.ascontiguousarray(opacity)),
        sh_dc=t(np.ascontiguousarray(dc)), sh_rest=t(np.ascontiguousarray(rest)),
    )


def write_ply(scene: GaussianScene, path: str | os.PathLike, *, ascii: bool = False) -> Path:
    """Write an INRIA-layout float32 .ply atomically (temp file in the same folder + rename)."""
    path = Path(path)
    s = scene.to("cpu")
    n, k = s.num_gaussians, s.sh_rest.shape[1]
    rest_names = [f"f_rest_{i}" for i in range(3 * k)]
    names = (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"] + rest_names
             + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])
    rest = s.sh_rest.detach().float().numpy().transpose(0, 2, 1).reshape(n, 3 * k)
    cols = np.concatenate([
        s.means.detach().float().numpy(), np.zeros((n, 3), np.float32), s.sh_dc.detach().float().numpy(), rest,
        s.opacity_logits.detach().float().numpy()[:, None], s.log_scales.detach().float().numpy(),
        s.quats.detach().float().numpy(),
    ], axis=1)
    data = np.empty(n, dtype=[(name, "<f4") for name in names])
    for i, name in enumerate(names):
        data[name] = cols[:, i]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            PlyData([PlyElement.describe(data, "vertex")], text=ascii).write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
