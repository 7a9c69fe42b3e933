"""Tracking the moving object of a clip (OpenCV): the frames' checks, the background (temporal
median), KLT feature tracks, the centroid track of :func:`object_track` and the
contrast-independent :func:`guarded_track` with its guards.

Shared by the evaluation (:mod:`visionmoe.video.evaluation`) and the inference-time hooks
(:mod:`visionmoe.video.hooks`). Frames are uint8 ``[F, H, W, 3]`` arrays (RGB). Units are
pixels and frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List

import numpy as np

__all__ = ["GUARDED_DEFAULTS", "GuardedTrack", "background", "check_frames", "gray_frames", "guarded_track",
           "klt_tracks", "object_track", "opencv", "tracked_runs"]


def opencv():
    import cv2

    return cv2


def check_frames(frames) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [F, H, W, 3] RGB; got shape {tuple(frames.shape)}")
    if frames.shape[0] < 3:
        raise ValueError(f"need at least 3 frames; got {frames.shape[0]}")
    if frames.dtype != np.uint8:
        if np.issubdtype(frames.dtype, np.floating) and frames.max() <= 1.0 + 1e-6:
            frames = frames * 255.0
        frames = np.clip(np.rint(frames), 0, 255).astype(np.uint8)
    return frames


def gray_frames(frames: np.ndarray) -> np.ndarray:
    cv2 = opencv()
    return np.stack([cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in frames])


def background(frames: np.ndarray) -> np.ndarray:
    return np.median(frames.astype(np.float32), axis=0)


def klt_tracks(frames, *, max_corners: int = 80, upscale: int = 2, fb_threshold: float = 0.5,
               reseed_every: int = 4) -> List[np.ndarray]:
    """Pyramidal Lucas-Kanade feature tracks, forward-backward checked.

    Returns a list of tracks, each ``[n, 3]`` rows ``(t, x, y)`` at consecutive frames.
    Frames are upscaled by ``upscale`` before tracking (small videos); coordinates are in
    the original pixels. New features are seeded every ``reseed_every`` frames away from
    live tracks.
    """
    cv2 = opencv()
    frames = check_frames(frames)
    gray = gray_frames(frames)
    if upscale != 1:
        gray = np.stack([cv2.resize(g, None, fx=upscale, fy=upscale, interpolation=cv2.INTER_CUBIC) for g in gray])
    F = gray.shape[0]
    lk = dict(winSize=(11, 11), maxLevel=2, criteria=(cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 30, 0.01))
    done: List[List] = []
    live: List[List] = []

    def seed(t):
        mask = np.full(gray[t].shape, 255, np.uint8)
        for tr in live:
            cv2.circle(mask, (int(tr[-1][1]), int(tr[-1][2])), 3 * upscale, 0, -1)
        pts = cv2.goodFeaturesToTrack(gray[t], maxCorners=max(max_corners - len(live), 0) or 1, qualityLevel=0.02,
                                      minDistance=2 * upscale, blockSize=5, mask=mask)
        if pts is not None and len(live) < max_corners:
            for p in pts.reshape(-1, 2):
                live.append([(t, float(p[0]), float(p[1]))])

    seed(0)
    for t in range(F - 1):
        if live:
            p0 = np.array([[tr[-1][1], tr[-1][2]] for tr in live], np.float32).reshape(-1, 1, 2)
            p1, st1, _ = cv2.calcOpticalFlowPyrLK(gray[t], gray[t + 1], p0, None, **lk)
            p0b, st2, _ = cv2.calcOpticalFlowPyrLK(gray[t + 1], gray[t], p1, None, **lk)
            ok = (st1.ravel() == 1) & (st2.ravel() == 1) & (np.linalg.norm((p0 - p0b).reshape(-1, 2), axis=1) < fb_threshold * upscale)
            nxt = []
            for tr, good, q in zip(live, ok, p1.reshape(-1, 2)):
                if good:
                    tr.append((t + 1, float(q[0]), float(q[1])))
                    nxt.append(tr)
                else:
                    done.append(tr)
            live[:] = nxt
        if (t + 1) % reseed_every == 0:
            seed(t + 1)
    done.extend(live)
    out = []
    for tr in done:
        a = np.asarray(tr, np.float64)
        a[:, 1:] /= upscale
        out.append(a)
    return out


def tracked_runs(track: np.ndarray) -> List[np.ndarray]:
    """Runs of consecutive tracked frames of a ``[F, 2]`` track (NaN = missing) as ``[n, 3]``
    ``(t, x, y)`` tracks."""
    t = np.nonzero(~np.isnan(track).any(1))[0]
    if len(t) == 0:
        return []
    breaks = np.nonzero(np.diff(t) > 1)[0] + 1
    return [np.concatenate([r[:, None], track[r]], 1) for r in np.split(t, breaks)]


def object_track(frames, *, threshold: float = 30.0, min_area: int = 4) -> np.ndarray:
    """Centroid ``[F, 2]`` (x, y; NaN where not found) of the main moving object.

    Background = per-pixel temporal median; foreground = pixels differing from it by more
    than ``threshold`` (max over RGB). Per frame the connected components of at least
    ``min_area`` pixels are candidates; the track follows the largest component at the
    start and then the candidate nearest to its constant-velocity prediction.
    """
    cv2 = opencv()
    frames = check_frames(frames)
    bg = np.median(frames.astype(np.float32), axis=0)
    F = frames.shape[0]
    cands = []
    for f in frames:
        fg = (np.abs(f.astype(np.float32) - bg).max(-1) > threshold).astype(np.uint8)
        n, _, stats, cents = cv2.connectedComponentsWithStats(fg, connectivity=8)
        cs = [(cents[i], stats[i, cv2.CC_STAT_AREA]) for i in range(1, n) if stats[i, cv2.CC_STAT_AREA] >= min_area]
        cands.append(cs)
    out = np.full((F, 2), np.nan)
    start = next((t for t in range(F) if cands[t]), None)
    if start is None:
        return out
    out[start] = max(cands[start], key=lambda c: c[1])[0]
    area = max(cands[start], key=lambda c: c[1])[1]
    prev = [start]
    for t in range(start + 1, F):
        if not cands[t]:
            continue
        last = prev[-1]
        pred = out[last]
        if len(prev) >= 2:
            l2 = prev[-2]
            pred = out[last] + (out[last] - out[l2]) * (t - last) / (last - l2)
        c = min(cands[t], key=lambda c: np.linalg.norm(c[0] - pred) + 0.5 * abs(math.sqrt(c[1]) - math.sqrt(area)))
        out[t] = c[0]
        prev.append(t)
    return out


#: Defaults of the guarded track (see :func:`guarded_track`).
GUARDED_DEFAULTS = {"rel_threshold": 0.5, "min_threshold": 8.0, "min_area": 3}


@dataclass
class GuardedTrack:
    """The main moving object per frame (NaN / 0 where not found) and the guards.

    ``positions`` [F, 2] centroid (x, y); ``area`` [F] pixels of its component; ``contrast``
    [F] peak deviation from the background in [0, 1]; ``count`` [F] components of at least
    ``min_area`` pixels (objects per frame).
    """

    positions: np.ndarray
    area: np.ndarray
    contrast: np.ndarray
    count: np.ndarray

    @property
    def found(self) -> np.ndarray:
        return ~np.isnan(self.positions).any(1)

    @property
    def frames_tracked(self) -> int:
        return int(self.found.sum())

    def guards(self) -> Dict[str, float]:
        f = self.found
        nan = float("nan")
        return {"frames_tracked": float(f.sum()), "fg_area": float(self.area[f].mean()) if f.any() else nan,
                "contrast": float(self.contrast[f].mean()) if f.any() else nan,
                "objects_per_frame": float(self.count.mean())}


def guarded_track(frames, *, rel_threshold: float = 0.5, min_threshold: float = 8.0, min_area: int = 3) -> GuardedTrack:
    """Contrast-independent track of the main moving object, with its guards.

    Background = per-pixel temporal median. In each frame the foreground is where the
    deviation from it exceeds ``rel_threshold`` of that frame's peak deviation (at least
    ``min_threshold`` grey levels, so a frame with nothing in it stays empty): a faded object
    (all deviations scaled by the same factor) gives the same mask, centroid and area, while
    its contrast guard drops. Components of at least ``min_area`` pixels are candidates; the
    track starts at the largest and then follows the candidate nearest to the
    constant-velocity prediction (as :func:`object_track`).
    """
    cv2 = opencv()
    frames = check_frames(frames)
    bg = background(frames)
    dev = np.abs(frames.astype(np.float32) - bg).max(-1)
    F = frames.shape[0]
    out = GuardedTrack(np.full((F, 2), np.nan), np.zeros(F), np.zeros(F), np.zeros(F))
    cands = []
    for t in range(F):
        thr = max(min_threshold, rel_threshold * float(dev[t].max()))
        n, lab, stats, cents = cv2.connectedComponentsWithStats((dev[t] > thr).astype(np.uint8), connectivity=8)
        cs = [(cents[i], stats[i, cv2.CC_STAT_AREA], i) for i in range(1, n) if stats[i, cv2.CC_STAT_AREA] >= min_area]
        out.count[t] = len(cs)
        cands.append((cs, lab))
    start = next((t for t in range(F) if cands[t][0]), None)
    if start is None:
        return out

    def take(t, c):
        out.positions[t] = c[0]
        out.area[t] = c[1]
        out.contrast[t] = float(dev[t][cands[t][1] == c[2]].max()) / 255.0

    first = max(cands[start][0], key=lambda c: c[1])
    take(start, first)
    area, prev = first[1], [start]
    for t in range(start + 1, F):
        if not cands[t][0]:
            continue
        last = prev[-1]
        pred = out.positions[last]
        if len(prev) >= 2:
            l2 = prev[-2]
            pred = out.positions[last] + (out.positions[last] - out.positions[l2]) * (t - last) / (last - l2)
        take(t, min(cands[t][0], key=lambda c: np.linalg.norm(c[0] - pred) + 0.5 * abs(math.sqrt(c[1]) - math.sqrt(area))))
        prev.append(t)
    return out
