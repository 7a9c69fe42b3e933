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

import numpy as np
import torch

__all__ = [
    "Cameras", "CameraError", "SceneFrame", "load_cameras_json", "orbit_cameras", "look_at", "scene_frame",
    "sphere_directions", "frame_cameras", "transform_cameras", "pose_distance", "coverage_cameras", "up_vector",
]

# Near and far clip planes as multiples of the scene size (see :class:`SceneFrame`): a 0.2-unit
# object and a 1000-unit room get the same planes relative to themselves. 1e-2 is the absolute
# 0.01 of :func:`orbit_cameras` on a unit-sized scene.
NEAR_FRACTION = 1e-2
FAR_FRACTION = 1e8


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


def up_vector(up) -> torch.Tensor:
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
    up_v = up_vector(up)
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


# ----------------------------------------------------------------------------- scale-free helpers


@dataclass(frozen=True)
class SceneFrame:
    """Where a scene is and how big it is, in its own units: every scale-free camera rule is
    stated relative to this (centre, size, up), so it moves, turns and scales with the scene.

    ``centre``: [3] float64, the opacity-weighted mean of the Gaussian centres. ``size``: the
    opacity-weighted ``quantile`` of the distances to it (robust to floaters). ``up``: [3] unit
    float64, the world direction that points up in images. ``axes``: [3, 3] float64 rows, the
    opacity-weighted principal axes of the centres (largest spread first, each signed so that
    the third moment along it is non-negative): a frame that turns with the scene."""

    centre: torch.Tensor
    size: float
    up: torch.Tensor
    axes: torch.Tensor

    @property
    def azimuth_origin(self) -> torch.Tensor:
        """[3] the principal axis least aligned with ``up``: azimuth 0 of views that turn with
        the scene."""
        return self.axes[int((self.axes @ self.up).abs()[:2].argmin())]

    def canonical_axes(self) -> torch.Tensor:
        """[3, 3] rows: azimuth 0 (:attr:`azimuth_origin` in the plane perpendicular to ``up``),
        ``up``, and their cross product: a right-handed frame that keeps the scene's up and turns
        with the scene (the frame PGMS encodes in)."""
        e1, _ = _plane_basis(self.up, self.azimuth_origin)
        return torch.stack([e1, self.up, torch.linalg.cross(e1, self.up)])

    @property
    def near(self) -> float:
        return NEAR_FRACTION * self.size

    @property
    def far(self) -> float:
        return FAR_FRACTION * self.size

    def orbit_distance(self, fov_deg: float = 50.0, radius_scale: float = 1.15) -> float:
        """The distance at which a sphere of radius ``radius_scale * size`` fills the horizontal
        field of view: the distance of :func:`orbit_cameras`' views."""
        return radius_scale * self.size / math.sin(math.radians(fov_deg) / 2)


# The frame's sums run in numpy, one thread, in row order: torch splits a float64 reduction
# over its threads, so the centre, the size and the axes (and the coded file's XFRM section)
# differed in the last bits with the thread count.
def _weighted_quantile_radius(means: np.ndarray, weights: np.ndarray, centre: np.ndarray, quantile: float) -> float:
    dist = np.sqrt(((means - centre) ** 2).sum(1))
    order = np.argsort(dist, kind="stable")
    cum = np.cumsum(weights[order]) / weights.sum()
    idx = min(int(np.searchsorted(cum, quantile)), len(order) - 1)
    return float(dist[order[idx]])


def scene_frame(scene, *, quantile: float = 0.9, up="-y") -> SceneFrame:
    """The :class:`SceneFrame` of a Gaussian scene (the centre and size of :func:`orbit_cameras`).

    Non-finite Gaussians are ignored; so are Gaussians whose opacity logit is -inf (weight 0).
    A scene with no usable Gaussian gets the unit frame at the origin. Equivariant: for the
    scene moved by ``x -> s R x + t``, the frame's centre is ``s R c + t``, its size ``s`` times
    the size, its axes ``R``-rotated (up as given: pass ``R @ up`` for the moved scene)."""
    if not 0 < quantile <= 1:
        raise CameraError(f"quantile must be in (0, 1], got {quantile!r}")
    means = scene.means.detach().to("cpu", torch.float64)
    weights = torch.sigmoid(scene.opacity_logits.detach().to("cpu", torch.float64))
    ok = torch.isfinite(means).all(-1) & torch.isfinite(weights) & (weights > 0)
    means, weights = means[ok], weights[ok]
    up_v = up_vector(up)
    if means.shape[0] == 0 or float(weights.sum()) <= 0:
        return SceneFrame(torch.zeros(3, dtype=torch.float64), 1.0, up_v, torch.eye(3, dtype=torch.float64))
    m, w = means.numpy(), weights.numpy()
    centre = (w[:, None] * m).sum(0) / w.sum()
    # a radius within the centre's rounding is no size (every Gaussian at one point: the mean
    # of equal positions can miss them by an ulp)
    least = 1e-12 * (1.0 + float(np.abs(centre).max()))
    size = _weighted_quantile_radius(m, w, centre, quantile)
    if not (size > least and math.isfinite(size)):
        size = float(np.sqrt(((m - centre) ** 2).sum(1)).max())
        if not (size > least and math.isfinite(size)):
            size = 1.0
    return SceneFrame(torch.from_numpy(centre), size, up_v, _principal_axes(m - centre, w))


def _principal_axes(d: np.ndarray, w: np.ndarray) -> torch.Tensor:
    """[3, 3] rows: weighted principal axes of offsets ``d`` (largest variance first), each
    signed by the weighted third moment along it (positive; ties keep the eigensolver's sign,
    which only a perfectly symmetric scene reaches). The third row is ``x cross y`` (a rotation)."""
    cov = np.stack([(w * d[:, i] * d[:, j]).sum() for i in range(3) for j in range(3)]).reshape(3, 3) / w.sum()
    _, vecs = torch.linalg.eigh(torch.from_numpy(cov))
    axes = vecs.T.flip(0).clone()  # descending variance
    for i in range(2):
        along = (d * axes[i].numpy()).sum(1)
        if float((w * along ** 3).sum()) < 0:
            axes[i] = -axes[i]
    axes[2] = torch.linalg.cross(axes[0], axes[1])
    return axes


def sphere_directions(num: int, *, min_elevation_deg: float = -90.0, max_elevation_deg: float = 90.0,
                      up="-y", seed: int | None = None, azimuth_origin=None) -> torch.Tensor:
    """[num, 3] float64 unit directions spread evenly over the band of elevations
    ``[min, max]`` above the plane perpendicular to ``up`` (the whole sphere by default).

    ``seed=None``: a Fibonacci lattice (equal area per point, deterministic). With a seed:
    the same lattice, each point jittered inside its own cell and the whole set turned by a
    random azimuth, so different seeds give different directions with the same even coverage.

    ``azimuth_origin``: a 3-vector whose projection on that plane is azimuth 0 (default: a
    world axis). Pass a direction that turns with the scene (e.g. ``SceneFrame.axes[0]``) and
    the directions turn with it."""
    if not isinstance(num, int) or isinstance(num, bool) or num < 1:
        raise CameraError(f"num must be a positive int, got {num!r}")
    if not -90.0 <= min_elevation_deg <= max_elevation_deg <= 90.0:
        raise CameraError(f"elevations must satisfy -90 <= min <= max <= 90, got {min_elevation_deg!r}, "
                          f"{max_elevation_deg!r}")
    up_v = up_vector(up)
    e1, e2 = _plane_basis(up_v, azimuth_origin)
    g = None if seed is None else torch.Generator().manual_seed(int(seed))
    lo, hi = math.sin(math.radians(min_elevation_deg)), math.sin(math.radians(max_elevation_deg))
    i = torch.arange(num, dtype=torch.float64)
    jitter_h = 0.5 if g is None else torch.rand(num, generator=g, dtype=torch.float64)
    jitter_a = 0.0 if g is None else (torch.rand(num, generator=g, dtype=torch.float64) - 0.5)
    offset = 0.0 if g is None else float(torch.rand(1, generator=g, dtype=torch.float64)) * 2 * math.pi
    h = lo + (hi - lo) * (i + jitter_h) / num  # sin(elevation): uniform in area
    golden = math.pi * (3.0 - math.sqrt(5.0))
    az = golden * (i + jitter_a) + offset
    r = (1 - h * h).clamp_min(0).sqrt()
    return (r * az.cos())[:, None] * e1 + (r * az.sin())[:, None] * e2 + h[:, None] * up_v


def _plane_basis(up_v: torch.Tensor, origin=None) -> tuple[torch.Tensor, torch.Tensor]:
    if origin is not None:
        o = torch.as_tensor(origin, dtype=torch.float64).reshape(3)
        o = o - (o @ up_v) * up_v
        if o.norm() > 1e-6:
            e1 = o / o.norm()
            return e1, torch.linalg.cross(up_v, e1)
    helper = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    if abs(float(helper @ up_v)) > 0.9:
        helper = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    e1 = helper - (helper @ up_v) * up_v
    e1 = e1 / e1.norm()
    return e1, torch.linalg.cross(up_v, e1)


def frame_cameras(frame: SceneFrame, directions, distances, width: int = 512, height: int = 512, *,
                  fov_deg: float = 50.0) -> Cameras:
    """Cameras at ``frame.centre + distance * direction`` looking at the centre, with the frame's
    up pointing up in the image and clip planes that scale with the scene (``frame.near``,
    ``frame.far``). ``directions``: [C, 3] (normalised here); ``distances``: [C] or a number, in
    units of ``frame.orbit_distance(fov_deg)`` (1.0: the orbit distance). A view straight along
    the up axis takes the frame's first principal axis as its image-up direction instead.
    Scale-free: for the scene and frame moved by a similarity ``x -> s R x + t`` (up turned
    with it) the cameras equal :func:`transform_cameras` of these."""
    if not 0 < fov_deg < 180:
        raise CameraError(f"fov_deg must be in (0, 180), got {fov_deg!r}")
    dirs = torch.as_tensor(directions, dtype=torch.float64).reshape(-1, 3)
    C = dirs.shape[0]
    if C == 0 or not torch.isfinite(dirs).all() or bool((dirs.norm(dim=-1) == 0).any()):
        raise CameraError(f"directions must be a non-empty [C, 3] array of finite non-zero vectors, "
                          f"got {tuple(dirs.shape)}")
    dist = torch.as_tensor(distances, dtype=torch.float64).reshape(-1)
    if dist.numel() == 1:
        dist = dist.expand(C)
    if dist.numel() != C:
        raise CameraError(f"distances must be one number or {C} numbers (one per direction), got {dist.numel()}")
    if not (torch.isfinite(dist).all() and bool((dist > 0).all())):
        raise CameraError("distances must be positive and finite")
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    base = frame.orbit_distance(fov_deg)
    views = []
    for d, k in zip(dirs, dist):
        up_c = frame.up if abs(float(d @ frame.up)) < 1 - 1e-6 else frame.axes[0]
        if abs(float(d @ up_c)) > 1 - 1e-6:
            up_c = frame.axes[1]
        views.append(look_at(frame.centre + float(k) * base * d, frame.centre, up_c))
    K = intrinsics(width, height, fov_deg)
    return Cameras(torch.stack(views).to(torch.float32), K.expand(C, 3, 3).clone(), width, height, frame.near,
                   frame.far)


def transform_cameras(cameras: Cameras, rotation=None, translation=None, scale: float = 1.0) -> Cameras:
    """The cameras that see the scene moved by ``x -> scale * rotation @ x + translation`` exactly as
    ``cameras`` see the original (same images; clip planes scaled with the scene)."""
    R = torch.eye(3, dtype=torch.float64) if rotation is None else torch.as_tensor(rotation, dtype=torch.float64)
    t = torch.zeros(3, dtype=torch.float64) if translation is None else torch.as_tensor(translation,
                                                                                        dtype=torch.float64)
    if R.shape != (3, 3) or t.shape != (3,) or not (math.isfinite(scale) and scale > 0):
        raise CameraError(f"need a [3, 3] rotation, a [3] translation and a positive scale, got {tuple(R.shape)}, "
                          f"{tuple(t.shape)}, {scale!r}")
    V = cameras.viewmats.to(torch.float64)
    Rv, tv = V[:, :3, :3], V[:, :3, 3]
    Rn = Rv @ R.T
    out = torch.eye(4, dtype=torch.float64).repeat(len(cameras), 1, 1)
    out[:, :3, :3] = Rn
    out[:, :3, 3] = scale * tv - Rn @ t
    return Cameras(out.to(cameras.viewmats.dtype), cameras.Ks.clone(), cameras.width, cameras.height,
                   cameras.near * scale, cameras.far * scale)


def pose_distance(a: Cameras, b: Cameras, scale: float) -> torch.Tensor:
    """[len(a), len(b)] pose difference: the distance between camera centres divided by
    ``scale`` (e.g. the scene's size) plus the angle between the camera axes in radians (the
    Frobenius norm of the rotations' difference over sqrt 2) plus the relative focal length
    difference. 0 exactly when two cameras see the same image of the scene."""
    if not (math.isfinite(scale) and scale > 0):
        raise CameraError(f"scale must be positive and finite, got {scale!r}")
    ca, cb = a.centers.double(), b.centers.double()
    centre = torch.cdist(ca, cb) / scale
    Ra, Rb = a.viewmats[:, :3, :3].double(), b.viewmats[:, :3, :3].double()
    rot = (Ra[:, None] - Rb[None]).flatten(2).norm(dim=-1) / math.sqrt(2)
    fa = a.Ks[:, 0, 0].double() / a.width
    fb = b.Ks[:, 0, 0].double() / b.width
    focal = (fa[:, None] - fb[None]).abs() / fa[:, None].clamp_min(1e-12)
    return centre + rot + focal


def coverage_cameras(scene, num_views: int = 32, size: int = 256, *, distances=(1.0,), fov_deg: float = 50.0,
                     frame: SceneFrame | None = None) -> Cameras:
    """Views from every direction, fixed to the scene itself (not to world axes or units).

    Directions: a Fibonacci lattice over the whole sphere (``sphere_directions``, no seed) whose
    pole is the scene's least-spread principal axis and whose azimuth 0 is its most-spread one;
    image up is the pole. Distances cycle through ``distances`` (in units of the orbit distance,
    :meth:`SceneFrame.orbit_distance`); clip planes scale with the scene. For the scene moved by
    any similarity the cameras move with it, so whatever is computed from their renders does not
    depend on the scene's position, orientation or units (up to principal axes that tie: a
    scene spread equally along two axes has no preferred azimuth)."""
    if not isinstance(num_views, int) or isinstance(num_views, bool) or num_views < 1:
        raise CameraError(f"num_views must be a positive int, got {num_views!r}")
    dist = [float(d) for d in distances]
    if not dist or not all(d > 0 and math.isfinite(d) for d in dist):
        raise CameraError(f"distances must be positive finite numbers, got {distances!r}")
    f = scene_frame(scene) if frame is None else frame
    pole = f.axes[2]
    f = SceneFrame(f.centre, f.size, pole, f.axes)
    dirs = sphere_directions(num_views, up=pole, azimuth_origin=f.axes[0])
    k = torch.tensor([dist[i % len(dist)] for i in range(num_views)], dtype=torch.float64)
    return frame_cameras(f, dirs, k, size, size, fov_deg=fov_deg)
