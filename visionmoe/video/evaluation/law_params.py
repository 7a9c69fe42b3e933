"""Law parameters fitted from decoded frames with a colour-mask tracker: the per-category
deficit measurement of issue #49.

The tracker shares nothing with the method or with the trajectory tools
(:mod:`visionmoe.video.physics.tracking`, PILA's field proxies): per frame it keeps the pixels
whose hue is within ``hue_tol`` degrees of the captioned colour's hue and whose saturation and
value are high enough (the backgrounds, the floor and the spout are dull), and takes their
centroid and area. Everything is numpy and deterministic.

Each law scenario of :mod:`visionmoe.video.data.law_variants` has one parameter fitted from the
track (units: pixels and frames, +y down):

============ ================= ===========================================================
scenario     parameter         fit
============ ================= ===========================================================
projectile   ``g``             2 x the quadratic coefficient of y(t) (least squares)
bounce       ``restitution``   parabolas with a shared g before and after the first floor
                               contact; their crossing is the contact, e = -v_after / v_before
sliding      ``decel``         x(t) = x0 + v0 s - a s^2 / 2 with s = min(t, v0 / a): a grid
                               over (v0, a), x0 in closed form
stream       ``accel``         2 x the quadratic coefficient of the particles' centroid y(t)
                               (about g / 3 for a steady stream; compared with the same fit
                               on the simulator's lawful clip)
============ ================= ===========================================================

A clip whose object is found in fewer than ``min_frames`` frames, or whose law cannot be fitted
(no floor contact for a bounce), is a failure: :func:`law_error` scores it at ``WORST_ERROR``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np

from ..data.scenes import COLORS

__all__ = ["STREAM_COLOR", "WORST_ERROR", "ColorTrack", "LawFit", "caption_color", "color_track", "fit_law",
           "hue_of", "law_error", "lawful_range"]

#: the colour of the stream scenario's particles (``law_variants._stream``)
STREAM_COLOR = (60, 130, 235)
#: the relative law-parameter error a failure is scored at (and the cap of every error)
WORST_ERROR = 2.0


def hue_of(rgb) -> float:
    """Hue in degrees [0, 360) of one RGB triple."""
    return float(_hsv(np.asarray(rgb, np.float32).reshape(1, 1, 3))[0][0, 0])


def _hsv(img: np.ndarray):
    """[..., 3] RGB (0-255) -> hue (degrees), saturation, value (0-1)."""
    x = np.asarray(img, np.float32) / 255.0
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    mx, mn = x.max(-1), x.min(-1)
    d = mx - mn
    safe = np.where(d > 1e-6, d, 1.0)
    h = np.where(mx == r, ((g - b) / safe) % 6.0, np.where(mx == g, (b - r) / safe + 2.0, (r - g) / safe + 4.0))
    h = np.where(d > 1e-6, h * 60.0, 0.0)
    s = np.where(mx > 1e-6, d / np.maximum(mx, 1e-6), 0.0)
    return h, s, mx


def caption_color(caption: str):
    """The RGB the caption names (a colour word of ``COLORS``), the stream's blue for water, or ``None``."""
    words = caption.lower().split()
    for name, rgb in COLORS.items():
        if name in words:
            return rgb
    if "water" in words:
        return STREAM_COLOR
    return None


@dataclass
class ColorTrack:
    """Per-frame centroid (``NaN`` where the object is not found) and area of the captioned colour's mask."""

    positions: np.ndarray  # [F, 2] (x, y)
    area: np.ndarray  # [F] pixels
    color_fraction: float  # share of the clip's saturated bright pixels that have the captioned hue

    @property
    def found(self) -> np.ndarray:
        return np.isfinite(self.positions[:, 0])

    @property
    def found_fraction(self) -> float:
        return float(self.found.mean())


def color_track(frames, rgb, *, hue_tol: float = 15.0, min_sat: float = 0.4, min_val: float = 0.35,
                min_area: int = 2) -> ColorTrack:
    """Track the object of colour ``rgb`` in ``frames`` ([F, H, W, 3] uint8) by a hue mask."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [F, H, W, 3]; got shape {tuple(frames.shape)}")
    h, s, v = _hsv(frames)
    target = hue_of(rgb)
    dh = np.abs((h - target + 180.0) % 360.0 - 180.0)
    vivid = (s >= min_sat) & (v >= min_val)
    mask = vivid & (dh <= hue_tol)
    F_ = frames.shape[0]
    pos = np.full((F_, 2), np.nan)
    area = mask.reshape(F_, -1).sum(1).astype(np.float64)
    ys, xs = np.mgrid[0:frames.shape[1], 0:frames.shape[2]]
    for f in range(F_):
        if area[f] >= min_area:
            m = mask[f]
            pos[f] = (xs[m].mean() + 0.5, ys[m].mean() + 0.5)
    n_vivid = vivid.sum()
    return ColorTrack(pos, area, float(mask.sum() / n_vivid) if n_vivid else 0.0)


@dataclass
class LawFit:
    """One clip's fitted law parameter with its guards."""

    scenario: str
    value: float  # NaN on failure
    found_fraction: float
    area: float  # mean mask area over the frames where found (0 if never)
    color_fraction: float
    ok: bool
    reason: str = ""
    extra: Dict[str, float] = field(default_factory=dict)


def _quad(t, y):
    A = np.stack([np.ones_like(t), t, 0.5 * t * t], 1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return coef  # y0, v0, accel


def _fit_bounce(t, y):
    """Restitution from the first floor contact (module docstring); ``None`` when there is none."""
    ymax = np.max(y)
    near = np.where(y >= ymax - 2.5)[0]
    k = int(near[0])  # the first frame near the lowest point = the first contact's neighbourhood
    pre = np.arange(len(t)) < k
    # the post segment ends before a second contact
    post_idx = np.arange(k + 1, len(t))
    later = [i for i in post_idx if i > k + 2 and y[i] >= ymax - 2.5 and y[i] >= y[i - 1]]
    end = later[0] if later else len(t)
    post = (np.arange(len(t)) > k) & (np.arange(len(t)) < end)
    if pre.sum() < 3 or post.sum() < 3:
        return None
    # shared-g least squares: y = a_i + b_i t + g t^2 / 2 on each segment
    n = pre.sum() + post.sum()
    A = np.zeros((n, 5))
    tt = np.concatenate([t[pre], t[post]])
    A[:pre.sum(), 0] = 1; A[:pre.sum(), 1] = t[pre]
    A[pre.sum():, 2] = 1; A[pre.sum():, 3] = t[post]
    A[:, 4] = 0.5 * tt * tt
    (a1, b1, a2, b2, g), *_ = np.linalg.lstsq(A, np.concatenate([y[pre], y[post]]), rcond=None)
    if abs(b1 - b2) < 1e-6:
        return None
    tc = (a2 - a1) / (b1 - b2)
    if not (t[pre][-1] - 1.0 <= tc <= t[post][0] + 1.0):
        tc = 0.5 * (t[pre][-1] + t[post][0])
    vb, va = b1 + g * tc, b2 + g * tc
    if vb <= 1e-3:
        return None
    return float(-va / vb), float(g), float(tc)


_SCENARIOS = ("projectile", "bounce", "sliding", "stream")
_V0 = np.arange(0.0, 4.5, 0.02)
_A = np.arange(-0.15, 0.45, 0.0025)


def _fit_slide(t, x):
    v0, a = _V0[:, None, None], _A[None, :, None]
    ts = np.where(a > 1e-9, v0 / np.where(a > 1e-9, a, 1.0), np.inf)
    s = np.minimum(t[None, None, :], ts)
    shape = v0 * s - 0.5 * a * s * s  # [V, A, T]
    x0 = (x[None, None, :] - shape).mean(-1, keepdims=True)
    sse = ((x[None, None, :] - shape - x0) ** 2).sum(-1)
    i, j = np.unravel_index(np.argmin(sse), sse.shape)
    return float(_A[j]), float(_V0[i])


def fit_law(frames, scenario: str, rgb, *, min_frames: int = 8, **track_kw) -> LawFit:
    """Track the ``rgb`` object in ``frames`` and fit ``scenario``'s law parameter (module docstring)."""
    if scenario not in _SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {_SCENARIOS}")
    tr = color_track(frames, rgb, **track_kw)
    found = tr.found
    area = float(tr.area[found].mean()) if found.any() else 0.0
    base = dict(scenario=scenario, found_fraction=tr.found_fraction, area=area, color_fraction=tr.color_fraction)
    if found.sum() < min_frames:
        return LawFit(value=float("nan"), ok=False, reason=f"found in {int(found.sum())} frames", **base)
    t = np.arange(len(found), dtype=np.float64)[found]
    x, y = tr.positions[found, 0], tr.positions[found, 1]
    if scenario in ("projectile", "stream"):
        val = float(_quad(t, y)[2])
        return LawFit(value=val, ok=True, **base)
    if scenario == "bounce":
        r = _fit_bounce(t, y)
        if r is None:
            return LawFit(value=float("nan"), ok=False, reason="no floor contact to fit", **base)
        return LawFit(value=r[0], ok=True, extra={"g": r[1], "contact": r[2]}, **base)
    a, v0 = _fit_slide(t, x)  # sliding
    return LawFit(value=a, ok=True, extra={"v0": v0}, **base)


def lawful_range(scenario: str, value: float) -> bool:
    """Whether a fitted parameter lies in the lawful variant's range (with a margin for the fit)."""
    if not np.isfinite(value):
        return False
    if scenario == "projectile":
        return 0.2 <= value <= 0.65
    if scenario == "bounce":
        return 0.4 <= value <= 0.95
    if scenario == "sliding":
        return value >= 0.06
    if scenario == "stream":
        return value >= 0.04
    raise ValueError(f"unknown scenario {scenario!r}")


def law_error(fit: LawFit, truth: float) -> float:
    """Relative error |fit - truth| / |truth|, capped at (and failures scored at) :data:`WORST_ERROR`."""
    if not fit.ok or not np.isfinite(fit.value) or not np.isfinite(truth) or abs(truth) < 1e-9:
        return WORST_ERROR
    return float(min(WORST_ERROR, abs(fit.value - truth) / abs(truth)))
