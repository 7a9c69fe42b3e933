"""Held-out evaluation of a compressed scene: views the encoder never rendered, render vs render.

The fidelity protocol (docs/EVALUATION.md): the original and the decoded scene are rendered
from the same cameras by visionmoe's renderer and compared (PSNR, SSIM). The headline
cameras are *held out*: never among the views the encoder rendered for its importance,
pruning, refinement or verification.

* Without a ``cameras.json``: :func:`heldout_cameras`, by default 32 views whose directions
  cover elevations -30..+60 degrees at all azimuths (area-uniform, stratified), at 0.5-1.3x
  the default orbit distance (a viewer zooms in), drawn with :data:`EVAL_SEED` (the encoder
  draws no random cameras and never uses this seed), with a near plane that scales with the
  scene (:class:`~visionmoe.splat.cameras.SceneFrame`).
* With a ``cameras.json``: :func:`split_cameras` holds out every 8th camera (index % 8 == 0,
  the 3DGS ``llffhold`` convention) and gives the encoder only the others.

:func:`check_disjoint` refuses an evaluation camera that equals an encoder camera. Views
the encoder saw can be scored too (:func:`score_views`), labelled as such, never the headline.

Similarity transforms of scenes (:func:`transform_scene`, SH bands rotated) and cameras
(:func:`~visionmoe.splat.cameras.transform_cameras`) measure invariance: the decoded
transformed scene against the transformed decoded scene.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from .cameras import CameraError, Cameras, frame_cameras, pose_distance, scene_frame, sphere_directions
from .io import GaussianScene
from .similarity import quat_from_rotmat, rotation_matrix, transform_scene  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)

__all__ = [
    "EVAL_SEED", "HOLDOUT_EVERY", "HeldoutError", "CameraSplit", "ViewScores", "heldout_cameras", "split_cameras",
    "encoder_cameras", "check_disjoint", "render_views", "score_views", "transform_scene", "rotation_matrix",
    "quat_from_rotmat", "invariance_transforms", "Similarity", "HeldoutReport", "evaluate_decoded",
]

#: Seed of the default held-out views. The encoder's views are deterministic orbits (no seed);
#: anything in the encoder that draws random cameras must use another seed.
EVAL_SEED = 0x26E7A1
#: Every HOLDOUT_EVERY-th camera of a cameras.json (index % HOLDOUT_EVERY == 0) is held out.
HOLDOUT_EVERY = 8
#: Pose distance (see :func:`~visionmoe.splat.cameras.pose_distance`) below which two cameras
#: count as the same view.
SAME_VIEW_TOLERANCE = 1e-3


class HeldoutError(ValueError):
    """An evaluation camera is also an encoder camera (the figure would not be held out)."""


# ----------------------------------------------------------------------------- cameras


def heldout_cameras(scene: GaussianScene, *, num_views: int = 32, size: int = 512, seed: int = EVAL_SEED,
                    min_elevation_deg: float = -30.0, max_elevation_deg: float = 60.0,
                    distance_range: tuple[float, float] = (0.5, 1.3), up="-y", fov_deg: float = 50.0,
                    frame=None) -> Cameras:
    """The default held-out views of ``scene`` (``size`` x ``size`` pixels).

    Directions: :func:`~visionmoe.splat.cameras.sphere_directions` over the elevation band with
    ``seed`` (area-uniform, one direction per equal-area cell). Distances: stratified in
    ``distance_range`` times the default orbit distance (:meth:`SceneFrame.orbit_distance`),
    shuffled so that distance and elevation are independent. Near/far planes scale with the
    scene. ``frame``: a :class:`SceneFrame` to use instead of the scene's own (e.g. the original
    scene's, for a decoded copy or a transformed one)."""
    if not isinstance(num_views, int) or isinstance(num_views, bool) or num_views < 1:
        raise CameraError(f"num_views must be a positive int, got {num_views!r}")
    lo, hi = (float(v) for v in distance_range)
    if not 0 < lo <= hi:
        raise CameraError(f"distance_range must satisfy 0 < low <= high, got {distance_range!r}")
    frame = scene_frame(scene, up=up) if frame is None else frame
    dirs = sphere_directions(num_views, min_elevation_deg=min_elevation_deg, max_elevation_deg=max_elevation_deg,
                             up=frame.up, seed=seed, azimuth_origin=frame.azimuth_origin)
    g = torch.Generator().manual_seed(int(seed) + 1)
    strata = (torch.randperm(num_views, generator=g).double() + torch.rand(num_views, generator=g, dtype=torch.float64))
    dist = lo + (hi - lo) * strata / num_views
    return frame_cameras(frame, dirs, dist, size, size, fov_deg=fov_deg)


@dataclass
class CameraSplit:
    """Cameras of a capture split into the encoder's (``train``) and the held-out (``test``)."""

    train: Cameras
    test: Cameras
    train_index: list[int]
    test_index: list[int]


def split_cameras(cameras: Cameras, every: int = HOLDOUT_EVERY) -> CameraSplit:
    """Hold out every ``every``-th camera (indices 0, every, 2 every, ...: the 3DGS convention
    ``idx % llffhold == 0`` on the file's order); the encoder gets the others. Needs at least
    two cameras (one of each)."""
    if not isinstance(every, int) or isinstance(every, bool) or every < 2:
        raise CameraError(f"every must be an int >= 2, got {every!r}")
    n = len(cameras)
    if n < 2:
        raise CameraError(f"a train/test split needs at least 2 cameras, got {n}")
    test = [i for i in range(n) if i % every == 0]
    train = [i for i in range(n) if i % every != 0]
    return CameraSplit(cameras[train], cameras[test], train, test)


def encoder_cameras(scene: GaussianScene, cameras: Cameras | None = None, *, num_views: int | None = None,
                    view_size: int = 256, up="-y", coverage_views: int | None = None, frame: str = "scene",
                    effort: str = "default") -> Cameras:
    """The poses the encoder renders for ``compress(scene, cameras=cameras, num_views=...,
    view_size=..., up=..., coverage_views=..., frame=..., effort=...)`` (None: the effort's
    counts): ``cameras`` when given, else its default
    orbit views followed by its coverage views (``contribution.coverage_views``). Its checks,
    pruning search and refinement render some of these poses (the refinement at other pixel
    sizes), so a check against them covers every view the encoder saw (``coverage_views=0``: the
    orbit poses alone)."""
    if cameras is not None:
        return cameras
    from .cameras import transform_cameras
    from .encoder.contribution import coverage_views as coverage, default_cameras
    from .encoder.options import EFFORTS
    from .similarity import canonical_similarity

    num_views = EFFORTS[effort].views if num_views is None else num_views
    coverage_views = EFFORTS[effort].coverage_views if coverage_views is None else coverage_views
    if frame == "scene":  # the encoder renders the canonical scene: its views, mapped back
        R, t, s = canonical_similarity(scene, up)
        canon, up = transform_scene(scene, R, t, s), (0.0, 1.0, 0.0)
    else:
        canon = scene
    cams = default_cameras(canon, num_views=num_views, size=view_size, up=up)
    if coverage_views > 0:
        cams = Cameras.concat([cams, coverage(canon, num_views=coverage_views, size=view_size, up=up)])
    return cams if frame != "scene" else transform_cameras(cams, R.T, -(R.T @ t) / s, 1.0 / s)


def check_disjoint(eval_cameras: Cameras, seen_cameras: Cameras, scale: float,
                   tolerance: float = SAME_VIEW_TOLERANCE) -> float:
    """Raise :class:`HeldoutError` if an evaluation camera sees the same image as an encoder
    camera (pose distance below ``tolerance``; positions in units of ``scale``, e.g. the scene
    size); return the smallest pose distance found."""
    d = pose_distance(eval_cameras, seen_cameras, scale)
    least = float(d.min()) if d.numel() else math.inf
    if least < tolerance:
        i, j = divmod(int(d.argmin()), d.shape[1])
        raise HeldoutError(f"evaluation camera {i} equals encoder camera {j} (pose distance {least:.2e} < "
                           f"{tolerance:g}): the evaluation would not be held out")
    return least


# ----------------------------------------------------------------------------- scores


@dataclass
class ViewScores:
    """PSNR/SSIM of one set of views, and what the views are."""

    psnr: float
    ssim: float
    per_view_psnr: list[float] = field(default_factory=list)
    label: str = ""

    def summary(self) -> dict:
        return {"psnr_db": round(self.psnr, 3), "ssim": round(self.ssim, 5), "views": len(self.per_view_psnr),
                "label": self.label}


def render_views(scene: GaussianScene, cameras: Cameras, *, batch: int = 4, device=None) -> torch.Tensor:
    """[C, H, W, 3] colours of ``scene`` from every camera (no gradient), rendered in batches."""
    from .render import render

    if device is not None:
        scene, cameras = scene.to(device), cameras.to(device)
    with torch.no_grad():
        return torch.cat([render(scene, cameras[i: i + batch]).colors.cpu() for i in range(0, len(cameras), batch)])


def score_views(reference: torch.Tensor, images: torch.Tensor, label: str = "") -> ViewScores:
    """Mean PSNR and SSIM of ``images`` against ``reference`` ([C, H, W, 3] each)."""
    from .metrics import psnr, ssim

    per = [float(psnr(images[i: i + 1], reference[i: i + 1])) for i in range(images.shape[0])]
    return ViewScores(float(sum(per) / len(per)), float(ssim(images, reference)), per, label)


# ----------------------------------------------------------------------------- transforms


@dataclass(frozen=True)
class Similarity:
    """``x -> scale * rotation @ x + translation`` and a name for tables."""

    name: str
    rotation: torch.Tensor
    translation: torch.Tensor
    scale: float


def invariance_transforms(frame, count: int = 6) -> list[Similarity]:
    """``count`` (at most 6) fixed similarity transforms for the invariance spread, around the
    scene's frame (rotations about its centre, shifts in units of its size, scales about the
    origin: a change of units): a tilted 37-degree
    turn scaled 1.7x and shifted; 1e-3x; 1e3x; z-up (90 degrees about x); upside down with a
    shift of 10 sizes; a generic turn about a skew axis at 0.05x."""
    c, s = frame.centre, frame.size
    specs = [
        ("rot37-tilt x1.7 shift", rotation_matrix([0.3, 1.0, 0.2], 37.0), 1.7, [0.7, -0.4, 1.1]),
        ("x0.001", torch.eye(3, dtype=torch.float64), 1e-3, [0.0, 0.0, 0.0]),
        ("x1000", torch.eye(3, dtype=torch.float64), 1e3, [0.0, 0.0, 0.0]),
        ("z-up (rot90 x)", rotation_matrix([1.0, 0.0, 0.0], 90.0), 1.0, [0.0, 0.0, 0.0]),
        ("upside down shift 10", rotation_matrix([0.0, 0.0, 1.0], 180.0), 1.0, [10.0, 0.0, -10.0]),
        ("rot123 skew x0.05", rotation_matrix([-0.5, 0.8, 0.6], 123.0), 0.05, [-2.0, 3.0, 1.0]),
    ]
    if not 1 <= count <= len(specs):
        raise ValueError(f"count must be in 1..{len(specs)}, got {count!r}")
    out = []
    for name, R, k, shift in specs[:count]:
        # turned about the centre and shifted, then in other units: x -> k (R (x - c) + c + shift * size).
        # Scaling about the origin keeps float32 positions as precise relative to the scene as
        # the original's; scaled about a far centre they are not (fruit, 0.22 wide at 2.25 from
        # the origin: a 1e-3x copy about its centre is rounded by 5e-4 of its own size).
        t = k * (c - R @ c + torch.tensor(shift, dtype=torch.float64) * s)
        out.append(Similarity(name, R, t, k))
    return out


# ----------------------------------------------------------------------------- report


@dataclass
class HeldoutReport:
    """Held-out scores (the headline), scores on views the encoder saw (labelled, optional) and
    how far the held-out poses are from the encoder's (smallest pose distance)."""

    heldout: ViewScores
    seen: ViewScores | None
    separation: float

    def summary(self) -> dict:
        return {"heldout": self.heldout.summary(), "seen": None if self.seen is None else self.seen.summary(),
                "min_pose_distance": round(self.separation, 4)}


def evaluate_decoded(original: GaussianScene, decoded: GaussianScene, eval_cameras: Cameras,
                     seen_cameras: Cameras | None = None, *, seen_views: int = 8, device=None,
                     reference: torch.Tensor | None = None, seen_from: int | None = None) -> HeldoutReport:
    """Score ``decoded`` against ``original`` on ``eval_cameras`` (checked disjoint from
    ``seen_cameras``, the encoder's views, when given) and, when ``seen_views`` > 0, on that many
    of the encoder's poses rendered at the evaluation size (labelled "seen by the encoder").
    ``reference``: the original's renders of ``eval_cameras`` if already made. ``seen_from``:
    the "seen" views are spread over the first that many encoder cameras (the orbit poses of
    :func:`encoder_cameras`; default all)."""
    frame = scene_frame(original)
    sep = check_disjoint(eval_cameras, seen_cameras, frame.size) if seen_cameras is not None else math.inf
    ref = render_views(original, eval_cameras, device=device) if reference is None else reference
    label = f"{len(eval_cameras)} held-out views at {eval_cameras.width}x{eval_cameras.height}"
    held = score_views(ref, render_views(decoded, eval_cameras, device=device), label)
    seen = None
    if seen_cameras is not None and seen_views > 0:
        n = len(seen_cameras) if seen_from is None else max(1, min(seen_from, len(seen_cameras)))
        idx = torch.linspace(0, n - 1, min(seen_views, n)).round().long().tolist()
        cams = seen_cameras[idx].scaled(eval_cameras.width / seen_cameras.width)
        seen = score_views(render_views(original, cams, device=device), render_views(decoded, cams, device=device),
                           f"{len(idx)} views the encoder saw, at {cams.width}x{cams.height} (not held out)")
    return HeldoutReport(held, seen, sep)
