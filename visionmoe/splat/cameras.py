"""Pinhole cameras for rendering Gaussian scenes: INRIA ``cameras.json`` and generated orbits.

Conventions: ``viewmats`` are world-to-camera 4x4 matrices in the OpenCV convention (camera
x right, y down, z forward), ``Ks`` are 3x3 pinhole intrinsics in pixels, pixel centres at
``(i + 0.5, j + 0.5)``; the same as :func:`visionmoe.ops.rasterize` and gsplat.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch

__all__ = ["Cameras", "CameraError", "load_cameras_json", "orbit_cameras", "look_at"]


class CameraError(ValueError):
    """A camera file or camera argument is invalid (the message says what and where)."""


@dataclass
class Cameras:
    """A batch of C pinhole cameras sharing one image size."""

    viewmats: torch.Tensor  # [C, 4, 4] world-to-camera (OpenCV)
    Ks: torch.Tensor  # [C, 3, 3]
    width: int
    height: int
    near: float = 0.01
    far: float = 1e10

    def __post_init__(self):
        if not isinstance(self.viewmats, torch.Tensor) or self.viewmats.dim() != 3 or self.viewmats.shape[1:] != (4, 4):
            shape = tuple(self.viewmats.shape) if isinstance(self.viewmats, torch.Tensor) else type(self.viewmats)
            raise CameraError(f"viewmats must be a tensor of shape (C, 4, 4), got {shape}")
        C = self.viewmats.shape[0]
        if not isinstance(self.Ks, torch.Tensor) or tuple(self.Ks.shape) != (C, 3, 3):
            shape = tuple(self.Ks.shape) if isinstance(self.Ks, torch.Tensor) else type(self.Ks)
            raise CameraError(f"Ks must be a tensor of shape ({C}, 3, 3), got {shape}")
        for name in ("width", "height"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CameraError(f"{name} must be a positive int, got {value!r}")
        if not (0 < float(self.near) < float(self.far)):
            raise CameraError(f"near and far must satisfy 0 < near < far, got {self.near!r}, {self.far!r}")

    def __len__(self) -> int:
        return int(self.viewmats.shape[0])

    def __getitem__(self, index) -> Cameras:
        """A subset of the cameras (int, slice, list or tensor index)."""
        if isinstance(index, int):
            index = [index]
        return Cameras(self.viewmats[index], self.Ks[index], self.width, self.height, self.near, self.far)

    @classmethod
    def concat(cls, parts) -> Cameras:
        """The cameras of ``parts`` (same image size and clip planes), in order."""
        parts = list(parts)
        if not parts:
            raise CameraError("concat needs at least one Cameras")
        first = parts[0]
        for c in parts[1:]:
            if (c.width, c.height, c.near, c.far) != (first.width, first.height, first.near, first.far):
                raise CameraError(f"concat: image size and clip planes must match, got {c.width}x{c.height} "
                                  f"(near {c.near}, far {c.far}) and {first.width}x{first.height} "
                                  f"(near {first.near}, far {first.far})")
        return cls(torch.cat([c.viewmats for c in parts]), torch.cat([c.Ks for c in parts]),
                   first.width, first.height, first.near, first.far)

    def to(self, device=None, dtype=None) -> Cameras:
        return Cameras(
            self.viewmats.to(device=device, dtype=dtype), self.Ks.to(device=device, dtype=dtype),
            self.width, self.height, self.near, self.far,
        )

    def scaled(self, factor: float) -> Cameras:
        """The same poses rendered at ``factor`` x the image size (focal lengths and principal
        points scaled with it: the image's corner is the pixel coordinates' origin)."""
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise CameraError(f"scale factor must be a positive finite number, got {factor!r}")
        width, height = max(1, round(self.width * factor)), max(1, round(self.height * factor))
        Ks = self.Ks.clone()
        Ks[:, 0, :] *= width / self.width
        Ks[:, 1, :] *= height / self.height
        return Cameras(self.viewmats, Ks, width, height, self.near, self.far)

    @property
    def centers(self) -> torch.Tensor:
        """[C, 3] camera centres in world coordinates."""
        R, t = self.viewmats[:, :3, :3], self.viewmats[:, :3, 3]
        return -torch.einsum("cji,cj->ci", R, t)


def intrinsics(width: int, height: int, fov_x_deg: float, dtype=torch.float32) -> torch.Tensor:
    """[3, 3] pinhole intrinsics with the principal point at the image centre and square pixels."""
    fx = 0.5 * width / math.tan(math.radians(fov_x_deg) / 2)
    return torch.tensor([[fx, 0.0, width / 2], [0.0, fx, height / 2], [0.0, 0.0, 1.0]], dtype=dtype)


def look_at(eye: torch.Tensor, target: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """[4, 4] world-to-camera (OpenCV) matrix of a camera at ``eye`` looking at ``target``.

    ``up`` is the world direction that appears upwards in the image (camera -y).
    """
    eye, target, up = (torch.as_tensor(v, dtype=torch.float64) for v in (eye, target, up))
    forward = target - eye
    if forward.norm() == 0:
        raise CameraError("look_at: eye and target coincide")
    z = forward / forward.norm()
    down = -up - (-up @ z) * z
    if down.norm() < 1e-9:
        raise CameraError("look_at: the up vector is parallel to the viewing direction")
    y = down / down.norm()
    x = torch.linalg.cross(y, z)
    R = torch.stack([x, y, z])  # rows: camera axes in world coordinates
    view = torch.eye(4, dtype=torch.float64)
    view[:3, :3] = R
    view[:3, 3] = -R @ eye
    return view


_AXES = {"x": 0, "y": 1, "z": 2}


def _up_vector(up) -> torch.Tensor:
    if isinstance(up, str):
        name = up.strip().lower()
        sign = -1.0 if name.startswith("-") else 1.0
        axis = name.lstrip("+-")
        if axis not in _AXES:
            raise CameraError(f"up must be one of +x, -x, +y, -y, +z, -z or a 3-vector, got {up!r}")
        v = torch.zeros(3, dtype=torch.float64)
        v[_AXES[axis]] = sign
        return v
    v = torch.as_tensor(up, dtype=torch.float64).reshape(-1)
    if v.numel() != 3 or not torch.isfinite(v).all() or v.norm() == 0:
        raise CameraError(f"up must be a non-zero finite 3-vector, got {up!r}")
    return v / v.norm()


def orbit_cameras(
    scene,
    num_views: int = 16,
    width: int = 512,
    height: int = 512,
    *,
    fov_deg: float = 50.0,
    elevation_deg: float = 20.0,
    up="-y",
    radius_scale: float = 1.15,
    quantile: float = 0.9,
    near: float = 0.01,
    far: float = 1e10,
) -> Cameras:
    """Deterministic orbit views around a Gaussian scene.

    The orbit centre is the opacity-weighted mean of the Gaussian centres (sigmoid opacities;
    non-finite Gaussians ignored). The scene "size" ``s`` is the opacity-weighted ``quantile``
    of the distances to that centre (robust to floaters); cameras sit at distance
    ``radius_scale * s / sin(fov/2)`` so that a sphere of radius ``s`` fills the horizontal
    field of view, at ``num_views`` azimuths evenly spaced from 0 and at ``elevation_deg``
    above the orbit plane.

    Up axis: ``up="-y"`` by default, because INRIA/COLMAP-trained scenes (and the .ply files
    that 3DGS viewers exchange) use the OpenCV camera convention in which world y points
    down. Pass ``"+z"`` for z-up captures or any 3-vector.
    """
    if not isinstance(num_views, int) or num_views < 1:
        raise CameraError(f"num_views must be a positive int, got {num_views!r}")
    if not 0 < fov_deg < 180:
        raise CameraError(f"fov_deg must be in (0, 180), got {fov_deg!r}")
    if not 0 < quantile <= 1:
        raise CameraError(f"quantile must be in (0, 1], got {quantile!r}")
    means = scene.means.detach().to("cpu", torch.float64)
    weights = torch.sigmoid(scene.opacity_logits.detach().to("cpu", torch.float64))
    ok = torch.isfinite(means).all(-1) & torch.isfinite(weights)
    means, weights = means[ok], weights[ok]
    if means.shape[0] == 0 or float(weights.sum()) <= 0:
        centre = torch.zeros(3, dtype=torch.float64)
        size = 1.0
    else:
        centre = (weights[:, None] * means).sum(0) / weights.sum()
        dist = (means - centre).norm(dim=-1)
        order = torch.argsort(dist)
        cum = torch.cumsum(weights[order], 0) / weights.sum()
        idx = int(torch.searchsorted(cum, torch.tensor([quantile], dtype=torch.float64)).clamp(max=len(order) - 1))
        size = float(dist[order[idx]])
        if not size > 0:
            size = 1.0
    up_v = _up_vector(up)
    # Orthonormal basis of the orbit plane (perpendicular to up).
    helper = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    if abs(float(helper @ up_v)) > 0.9:
        helper = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    e1 = helper - (helper @ up_v) * up_v
    e1 = e1 / e1.norm()
    e2 = torch.linalg.cross(up_v, e1)
    distance = radius_scale * size / math.sin(math.radians(fov_deg) / 2)
    elev = math.radians(elevation_deg)
    views = []
    for i in range(num_views):
        az = 2 * math.pi * i / num_views
        direction = math.cos(elev) * (math.cos(az) * e1 + math.sin(az) * e2) + math.sin(elev) * up_v
        views.append(look_at(centre + distance * direction, centre, up_v))
    viewmats = torch.stack(views).to(torch.float32)
    K = intrinsics(width, height, fov_deg)
    return Cameras(viewmats, K.expand(num_views, 3, 3).clone(), width, height, near, far)


def load_cameras_json(path, *, width: int | None = None, height: int | None = None) -> Cameras:
    """Read the ``cameras.json`` written by the INRIA 3DGS training code.

    Each entry has ``width``, ``height``, ``position`` (camera centre), ``rotation``
    (camera-to-world 3x3, columns are the camera axes) and ``fx``, ``fy``. All cameras are
    rendered at one size: ``width``/``height`` if given, else the first camera's; focal
    lengths are rescaled to that size and the principal point is the image centre.
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise CameraError(f"cannot read cameras file {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise CameraError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, list) or not data:
        raise CameraError(f"{path} must hold a non-empty JSON list of cameras, got {type(data).__name__}")
    views, Ks = [], []
    W = H = None
    for i, cam in enumerate(data):
        try:
            w, h = int(cam["width"]), int(cam["height"])
            pos = torch.tensor(cam["position"], dtype=torch.float64).reshape(3)
            rot = torch.tensor(cam["rotation"], dtype=torch.float64).reshape(3, 3)
            fx, fy = float(cam["fx"]), float(cam["fy"])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CameraError(
                f"{path}: camera {i} needs width, height, position [3], rotation [3][3], fx, fy ({exc})"
            ) from None
        if w < 1 or h < 1 or not (fx > 0 and fy > 0) or not torch.isfinite(pos).all() or not torch.isfinite(rot).all():
            raise CameraError(f"{path}: camera {i} has invalid values (size {w}x{h}, fx={fx}, fy={fy})")
        if W is None:
            W, H = width or w, height or h
        view = torch.eye(4, dtype=torch.float64)
        view[:3, :3] = rot.T
        view[:3, 3] = -rot.T @ pos
        views.append(view)
        sx, sy = W / w, H / h
        Ks.append(torch.tensor([[fx * sx, 0, W / 2], [0, fy * sy, H / 2], [0, 0, 1]], dtype=torch.float64))
    return Cameras(torch.stack(views).float(), torch.stack(Ks).float(), int(W), int(H))
