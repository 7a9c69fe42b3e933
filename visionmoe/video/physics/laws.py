"""Fitting physical laws to object tracks: piecewise parabolas with one shared acceleration cut
at bounces (:func:`bounce_segments`, :func:`fit_segments`), the gravity fit of a clip
(:func:`gravity_fit`, :class:`GravityFit`, :data:`PHYSICAL_THRESHOLDS`) and the law's fit of a
track (:func:`fit_law_track`, used by the rigid-body projection).

Units are pixels and frames; +y is down.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from .tracking import object_track

__all__ = ["GravityFit", "LAWS", "PHYSICAL_THRESHOLDS", "bounce_segments", "fit_law_track", "fit_segments",
           "gravity_fit"]

LAWS = ("gravity", "lines")


@dataclass
class GravityFit:
    """Result of :func:`gravity_fit` (px and frames; +y is down)."""

    accel: float  # shared vertical acceleration of the parabolas (> 0: downwards)
    residual_quadratic: float  # RMS px of the piecewise-parabola fit
    residual_linear: float  # RMS px of piecewise straight lines on the same segments
    num_segments: int
    coverage: float  # fraction of tracked frames inside fitted segments
    restitution: float  # max speed ratio after/before a bounce (nan without bounces)
    tangential_accel: float  # horizontal acceleration along the motion (< 0: decelerating)
    num_points: int
    falling: bool  # the object moves vertically (>= 3 px): the fit applies
    physical: bool

    def as_dict(self) -> Dict[str, float]:
        return asdict(self)


#: Thresholds of "physical" for :func:`gravity_fit` and :func:`score_video`, calibrated on
#: the generator's ground-truth clips (64x64) with margin; see tests/video/evaluation/test_metrics.py.
PHYSICAL_THRESHOLDS = {
    "min_accel": 0.05,  # px/frame^2, downwards
    "max_residual_quadratic": 0.75,  # px
    "min_linear_over_quadratic": 2.0,
    "min_coverage": 0.7,
    "max_restitution": 1.05,
    "max_tangential_accel": 0.05,
}


def fit_segments(t, y, segs, shared_accel=True):
    """Least squares of y on per-segment (b, c) + shared 0.5*g*t^2; returns (g, rms, coeffs)."""
    rows, ys = [], []
    k = len(segs)
    for i, (s, e) in enumerate(segs):
        tt = t[s:e] - t[s]
        for j, ti in enumerate(tt):
            r = np.zeros(1 + 2 * k)
            r[0] = 0.5 * ti * ti if shared_accel else 0.0
            r[1 + 2 * i] = ti
            r[2 + 2 * i] = 1.0
            rows.append(r)
            ys.append(y[s + j])
    A, b = np.asarray(rows), np.asarray(ys)
    if not shared_accel:
        A = A[:, 1:]
    sol, *_ = np.linalg.lstsq(A, b, rcond=None)
    res = b - A @ sol
    rms = float(np.sqrt(np.mean(res**2)))
    if not shared_accel:
        sol = np.concatenate([[0.0], sol])
    return float(sol[0]), rms, sol


def bounce_segments(y: np.ndarray, floor_tolerance: float = 3.0) -> List[Tuple[int, int]]:
    """Index ranges ``[a, b)`` of a height track between bounces: down-to-up reversals within
    ``floor_tolerance`` px (or 15% of the vertical range) of the lowest point; the frame at the
    reversal is excluded, ranges under 3 frames are dropped."""
    n = len(y)
    vy = np.diff(y)
    floor = y.max()
    tol = max(floor_tolerance, 0.15 * (y.max() - y.min()))
    cuts = [i for i in range(1, n - 1) if vy[i - 1] > 0 and vy[i] < 0 and y[i] >= floor - tol]
    segs, s = [], 0
    for c in cuts:
        segs.append((s, c))
        s = c + 1
    segs.append((s, n))
    return [(a, b) for a, b in segs if b - a >= 3]


def gravity_fit(frames=None, *, track: Optional[np.ndarray] = None, floor_tolerance: float = 3.0) -> GravityFit:
    """Fit the main moving object's height by parabolas with one shared acceleration.

    ``track`` (``[F, 2]`` x, y, NaN = missing) may be given instead of ``frames`` (then the
    object is not detected). Bounces are down-to-up reversals within ``floor_tolerance`` px
    (or 15% of the vertical range) of the lowest point; the frame at the reversal is
    excluded and the track split there. Segments with fewer than 3 points are ignored
    (counted against ``coverage``).
    """
    if track is None:
        track = object_track(frames)
    track = np.asarray(track, np.float64)
    ok = ~np.isnan(track).any(1)
    t = np.nonzero(ok)[0].astype(np.float64)
    x, y = track[ok, 0], track[ok, 1]
    n = len(t)
    nan = float("nan")
    if n < 5:
        return GravityFit(nan, nan, nan, 0, 0.0, nan, nan, n, False, False)
    segs = bounce_segments(y, floor_tolerance)
    covered = sum(b - a for a, b in segs)
    if not segs:
        return GravityFit(nan, nan, nan, 0, 0.0, nan, nan, n, False, False)
    g, rms_q, sol = fit_segments(t, y, segs)
    _, rms_l, _ = fit_segments(t, y, segs, shared_accel=False)
    # restitution at each bounce: speeds of the two parabolas at the excluded contact frame
    rest = []
    for i in range(len(segs) - 1):
        (a0, b0), (a1, b1) = segs[i], segs[i + 1]
        if a1 - b0 > 2:  # not adjacent across a single excluded frame
            continue
        tc = t[b0]
        v_before = sol[1 + 2 * i] + g * (tc - t[a0])
        v_after = sol[1 + 2 * (i + 1)] + g * (tc - t[a1])
        if v_before > 1e-3:
            rest.append(abs(v_after) / v_before)
    e = float(max(rest)) if rest else nan
    # horizontal acceleration along the direction of motion (friction decelerates), fitted
    # on the frames where the object moves horizontally
    vx = np.diff(x)
    moving = np.nonzero(np.abs(vx) > 0.1)[0]
    ax = 0.0
    if len(moving) >= 3:
        lo, hi = moving[0], moving[-1] + 2
        xc = np.polyfit(t[lo:hi], x[lo:hi], 2)
        ax = float(2 * xc[0] * np.sign(np.mean(vx[lo:hi - 1])))
    th = PHYSICAL_THRESHOLDS
    falling = (y.max() - y.min()) >= 3.0
    if falling:
        physical = bool(
            g > th["min_accel"]
            and rms_q <= th["max_residual_quadratic"]
            and rms_l >= th["min_linear_over_quadratic"] * max(rms_q, 0.05)
            and covered / n >= th["min_coverage"]
            and (math.isnan(e) or e <= th["max_restitution"])
            and ax <= th["max_tangential_accel"]
        )
    else:  # no fall to judge: only dissipation (friction decelerates, never accelerates)
        physical = bool(ax <= th["max_tangential_accel"])
    return GravityFit(g, rms_q, rms_l, len(segs), covered / n, e, ax, n, falling, physical)


def fit_law_track(y: np.ndarray, x: np.ndarray, law: str = "gravity", t: Optional[np.ndarray] = None,
                  at: Optional[np.ndarray] = None):
    """The law's least-squares fit of a ``[N]`` track (+y down) at frame times ``t`` (default
    0..N-1): ``y`` on piecewise parabolas with one shared acceleration (``"gravity"``) or on
    piecewise lines (``"lines"``), ``x`` on piecewise lines; segments cut at bounces as the metric
    cuts them. A point between two segments (a bounce frame, or a segment too short to fit) lies
    on whichever of the two parabolas is above the floor there (+y down: the smaller y),
    horizontally between the two lines; points before the first or after the last segment keep
    their measured value.

    Returns ``(fy, fx)``; with ``at`` (other frame times) also the law there, ``(fy, fx, ay, ax)``,
    from the first segment before it starts and from the latest segment started otherwise
    (measured values where no segment was fitted)."""
    if law not in LAWS:
        raise ValueError(f"law must be one of {LAWS}, got {law!r}")
    y = np.asarray(y, np.float64)
    x = np.asarray(x, np.float64)
    t_all = np.arange(len(y), dtype=np.float64) if t is None else np.asarray(t, np.float64)
    at = None if at is None else np.asarray(at, np.float64)
    fy, fx = y.copy(), x.copy()
    segs = bounce_segments(y)
    if not segs:
        if at is None:
            return fy, fx
        return fy, fx, np.interp(at, t_all, y), np.interp(at, t_all, x)
    # the metric's own least squares: sol = [shared acceleration (0 for lines), b0, c0, b1, c1, ...]
    _, _, sol = fit_segments(t_all, y, segs, shared_accel=law == "gravity")
    starts = np.array([t_all[s] for s, _ in segs])
    xlines = [np.polyfit(t_all[s:e] - t_all[s], x[s:e], 1) for s, e in segs]

    def on_law(seg: np.ndarray, dt: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        ly = 0.5 * sol[0] * dt * dt + sol[1 + 2 * seg] * dt + sol[2 + 2 * seg]
        return ly, np.array([np.polyval(xlines[i], d) for i, d in zip(seg, dt)])

    for i, (s, e) in enumerate(segs):
        fy[s:e], fx[s:e] = on_law(np.full(e - s, i), t_all[s:e] - t_all[s])
    for k in range(len(segs) - 1):  # the gap between two segments: on the law (docstring)
        gap = np.arange(segs[k][1], segs[k + 1][0])
        if len(gap):
            ya, xa = on_law(np.full(len(gap), k), t_all[gap] - starts[k])
            yb, xb = on_law(np.full(len(gap), k + 1), t_all[gap] - starts[k + 1])
            fy[gap], fx[gap] = np.minimum(ya, yb), 0.5 * (xa + xb)
    if at is None:
        return fy, fx
    seg = np.clip(np.searchsorted(starts, at, side="right") - 1, 0, len(segs) - 1)
    ay, ax = on_law(seg, at - starts[seg])
    return fy, fx, ay, ax
