"""Is a clip one free body moving over a static background and camera? The assumption of the
trajectory tools (:mod:`visionmoe.video.hooks.trajectory_projection`,
:mod:`visionmoe.video.hooks.trajectory_guidance`), checked before they touch a clip.

The checks share nothing with the law those tools enforce (no track, no parabola, no fit):

1. **camera**: the median magnitude of dense optical flow (OpenCV Farneback) between
   consecutive frames; a small object moves few pixels, a pan or zoom moves most of them;
2. **noise floor**: the motion mask is where a frame deviates from the clip's temporal median
   by more than ``max(min_level, noise_factor x the median deviation)`` grey levels, so that
   sensor noise over a textured static scene never becomes an object;
3. **motion**: the largest connected component of that mask (of at least ``min_area`` pixels)
   must show in ``min_moving_frames`` frames and its centroid travel ``min_motion`` pixels;
4. **objects**: it covers at most ``max_area_fraction`` of the frame, and at most
   ``max_multi_fraction`` of the moving frames hold several objects (a second component at
   least a quarter of the largest's area and half of its contrast);
5. **free body**: the largest component must be compact (the square root of the ratio of its
   second moments, ``elongation``); a bob on its string, a rod, a stream or a deforming sheet
   make one long moving region.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict

import numpy as np

from .tracking import check_frames, gray_frames, opencv

__all__ = ["DOMAIN_DEFAULTS", "DomainCheck", "single_free_body"]

#: defaults of :func:`single_free_body` (grey levels, pixels, fractions of the moving frames)
DOMAIN_DEFAULTS = {
    "max_camera_flow": 0.5,  # px/frame: median |flow| of the frame
    "min_level": 16.0,  # grey levels: the least deviation that counts as motion
    "noise_factor": 6.0,  # x the clip's median deviation from its temporal median
    "min_area": 4,  # px: smaller components are specks
    "max_area_fraction": 0.25,  # of the frame: a larger moving region is not a small body
    "min_moving_frames": 5,
    "max_multi_fraction": 0.5,  # of the moving frames that show several objects
    "min_motion": 3.0,  # px travelled by the largest component's centroid
    "max_elongation": 2.5,  # sqrt of the ratio of the largest component's second moments
}


@dataclass
class DomainCheck:
    """The verdict of :func:`single_free_body` and the measurements behind it."""

    in_domain: bool
    reason: str  # why not ("" when in domain)
    camera_flow: float  # px/frame, median over frame pairs of the median |flow|
    threshold: float  # grey levels of the motion mask
    moving_frames: int  # frames with at least one component
    multi_fraction: float  # moving frames with several objects / moving frames
    motion: float  # px travelled by the largest component's centroid (max distance from its first)
    elongation: float  # median over moving frames
    area_fraction: float  # median over moving frames of the largest component's area / frame area

    def as_dict(self) -> Dict[str, float]:
        return asdict(self)


def _camera_flow(gray: np.ndarray) -> float:
    cv2 = opencv()
    mags = []
    for a, b in zip(gray[:-1], gray[1:]):
        flow = cv2.calcOpticalFlowFarneback(a, b, None, 0.5, 3, 9, 3, 5, 1.1, 0)
        mags.append(float(np.median(np.hypot(flow[..., 0], flow[..., 1]))))
    return float(np.median(mags))


def _elongation(mask: np.ndarray) -> float:
    yy, xx = np.nonzero(mask)
    if len(yy) < 3:
        return 1.0
    ev = np.linalg.eigvalsh(np.cov(np.stack([yy, xx]).astype(np.float64)) + 1.0 / 12 * np.eye(2))
    return float(np.sqrt(ev[1] / max(ev[0], 1e-9)))


def single_free_body(frames, **overrides) -> DomainCheck:
    """Check that ``frames`` (``[F, H, W, 3]``, uint8, or float in [0, 1]) show one compact
    moving body over a static background seen by a static camera (see the module docstring;
    ``overrides`` replace :data:`DOMAIN_DEFAULTS`)."""
    unknown = set(overrides) - set(DOMAIN_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown domain settings {sorted(unknown)}; expected some of {sorted(DOMAIN_DEFAULTS)}")
    p = {**DOMAIN_DEFAULTS, **overrides}
    cv2 = opencv()
    frames = check_frames(frames)
    F, H, W, _ = frames.shape
    camera = _camera_flow(gray_frames(frames))
    f = frames.astype(np.float32)
    dev = np.abs(f - np.median(f, axis=0)).max(-1)
    thr = max(p["min_level"], p["noise_factor"] * float(np.median(dev)))
    moving, multi, elong, areas, cents = 0, 0, [], [], []
    for t in range(F):
        n, lab, stats, cent = cv2.connectedComponentsWithStats((dev[t] > thr).astype(np.uint8), connectivity=8)
        comps = [i for i in range(1, n) if stats[i, cv2.CC_STAT_AREA] >= p["min_area"]]
        if not comps:
            continue
        moving += 1
        big = max(comps, key=lambda i: stats[i, cv2.CC_STAT_AREA])
        area, peak = stats[big, cv2.CC_STAT_AREA], float(dev[t][lab == big].max())
        others = [i for i in comps if i != big and stats[i, cv2.CC_STAT_AREA] >= 0.25 * area
                  and float(dev[t][lab == i].max()) >= 0.5 * peak]
        multi += bool(others)
        elong.append(_elongation(lab == big))
        areas.append(area / (H * W))
        cents.append(cent[big])
    cents = np.asarray(cents).reshape(-1, 2)
    motion = float(np.hypot(*(cents - cents[0]).T).max()) if len(cents) else 0.0
    check = DomainCheck(True, "", camera, thr, moving, multi / max(moving, 1), motion,
                        float(np.median(elong)) if elong else float("nan"),
                        float(np.median(areas)) if areas else 0.0)
    reasons = [
        (camera > p["max_camera_flow"], f"the camera moves (median optical flow {camera:.2f} px/frame)"),
        (moving < p["min_moving_frames"], f"no moving object (motion above {thr:.0f} grey levels in {moving} of {F} frames)"),
        (motion < p["min_motion"], f"no moving object (it travels {motion:.1f} px)"),
        (check.area_fraction > p["max_area_fraction"],
         f"the moving region covers {100 * check.area_fraction:.0f}% of the frame, not a small body"),
        (check.multi_fraction > p["max_multi_fraction"],
         f"several moving objects (in {100 * check.multi_fraction:.0f}% of the moving frames)"),
        (check.elongation > p["max_elongation"],
         f"the moving region is elongated ({check.elongation:.1f}:1): not a free body (a string, a rod, a stream)"),
    ]
    for bad, why in reasons:
        if bad:
            check.in_domain, check.reason = False, why
            break
    return check
