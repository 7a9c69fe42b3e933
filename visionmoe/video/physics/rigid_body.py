"""Re-drawing the moving object of one decoded clip as a rigid body on a law's track
(:func:`project_clip`): the projection that :mod:`visionmoe.video.hooks.trajectory_projection`
applies inside a pipeline.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import numpy as np

from .domain import single_free_body
from .laws import fit_law_track
from .tracking import opencv

__all__ = ["object_centroids", "project_clip"]

logger = logging.getLogger(__name__)


def object_centroids(dev: np.ndarray, shown: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(y, x) [F] of one object (NaN where a shown frame has none): the centroid of the colour
    deviation ``dev`` [F, H, W] above half the frame's peak, weighted by the excess (the mask
    :func:`.tracking.guarded_track` thresholds, soft), over one connected blob of it (the mask
    dilated by a pixel, so a ball drawn in two pieces stays one). A centroid over the whole frame
    would sit between two blobs (a ball and a ghost of it) and jump between them, and the
    template aligned on it would be a grey blend of both. The track starts at the heaviest blob of
    the frames that show a single one (of all frames if none does) and follows, forward and
    backward, the blob nearest to the constant-velocity prediction among those at least 30% as
    heavy as the frame's heaviest."""
    cv2 = opencv()
    F, H, W = dev.shape
    yy, xx = np.mgrid[0:H, 0:W]
    peak = dev.reshape(F, -1).max(1)
    blobs = []  # per frame: [k, 3] rows (mass, y, x)
    for i in range(F):
        w = np.maximum(dev[i] - 0.5 * peak[i], 0.0)
        n, lab = cv2.connectedComponents(cv2.dilate((w > 0).astype(np.uint8), np.ones((3, 3), np.uint8)))
        mass = np.bincount(lab.ravel(), w.ravel(), n)[1:]
        my = np.bincount(lab.ravel(), (w * yy).ravel(), n)[1:]
        mx = np.bincount(lab.ravel(), (w * xx).ravel(), n)[1:]
        keep = mass > 0
        b = np.stack([mass[keep], my[keep] / np.maximum(mass[keep], 1e-12), mx[keep] / np.maximum(mass[keep], 1e-12)], 1)
        blobs.append(b[b[:, 0] >= 0.3 * b[:, 0].max()] if len(b) else b)
    y, x = np.full(F, np.nan), np.full(F, np.nan)
    frames = [i for i in range(F) if shown[i] and len(blobs[i])]
    if not frames:
        return y, x
    # start where the object is unambiguous: the heaviest blob among frames that show only one
    pool = [i for i in frames if len(blobs[i]) == 1] or frames
    s0 = max(pool, key=lambda i: blobs[i][:, 0].max())
    y[s0], x[s0] = blobs[s0][blobs[s0][:, 0].argmax(), 1:]
    for order in (range(s0 + 1, F), range(s0 - 1, -1, -1)):
        seen = [s0]
        for i in order:
            if not (shown[i] and len(blobs[i])):
                continue
            p = np.array([y[seen[-1]], x[seen[-1]]])
            if len(seen) >= 2:  # constant velocity from the last two frames followed
                a, b = seen[-1], seen[-2]
                p = p + (p - np.array([y[b], x[b]])) * (i - a) / (a - b)
            y[i], x[i] = blobs[i][np.hypot(*(blobs[i][:, 1:] - p).T).argmin(), 1:]
            seen.append(i)
    return y, x


def project_clip(frames: np.ndarray, law: str = "gravity", strength: float = 1.0, radius: Optional[int] = None,
                 min_peak: float = 0.1, faint: float = 0.35, check_domain: bool = True) -> Tuple[np.ndarray, float]:
    """Re-draw the moving object of one clip as a rigid template on the law's track.

    Args:
        frames: ``[F, H, W, 3]`` float in [-1, 1] (a decoded clip).
        law: ``"gravity"`` or ``"lines"`` (:func:`fit_law_track`).
        strength: how far each frame moves toward the fit (0: the object stays where it is,
            only its shape is made rigid; 1: onto the fit).
        radius: the template's half size in pixels (default: 14% of the shorter side).
        min_peak, faint: a frame whose peak deviation from the background is below
            ``min_peak`` or below ``faint`` times the clip's median peak shows the object faintly
            or not at all: it neither steers the fit nor shapes the template; the body is drawn
            there all the same (a rigid body does not vanish): between two frames that show it
            at the track interpolated from them, before the first and after the last on the
            law's fit carried on (with ``strength`` 0, which has no law, those stay as drawn).
        check_domain: first check that the clip shows one free body over a static background and
            camera (:func:`.domain.single_free_body`); one outside that is returned unchanged,
            with a logged warning.

    Returns:
        (projected frames, RMS shift of the object in pixels over the frames that show it);
        unchanged frames and 0.0 when fewer than 5 frames show the object or the clip is outside
        the domain.
    """
    cv2 = opencv()
    f = np.asarray(frames, np.float32)
    if f.ndim != 4 or f.shape[-1] != 3:
        raise ValueError(f"frames must be [F, H, W, 3], got shape {f.shape}")
    F, H, W, _ = f.shape
    if F < 5:
        return f, 0.0
    if check_domain:
        check = single_free_body(np.clip((f + 1) / 2, 0, 1))
        if not check.in_domain:
            logger.warning("rigid-body projection left the clip unchanged: %s", check.reason)
            return f, 0.0
    bg = np.median(f, axis=0)
    dev = np.abs(f - bg).max(-1)
    peak = dev.reshape(F, -1).max(1)
    shown = (peak >= min_peak) & (peak >= faint * np.median(peak))
    if shown.sum() < 5:
        return f, 0.0
    y, x = object_centroids(dev, shown)
    shown &= np.isfinite(y)
    if shown.sum() < 5:
        return f, 0.0
    t = np.nonzero(shown)[0]
    ends = np.array([i for i in range(F) if i < t[0] or i > t[-1]], np.int64)
    fy, fx, ey, ex = fit_law_track(y[t], x[t], law, t, at=ends)
    ty = np.interp(np.arange(F), t, y[t] + strength * (fy - y[t]))
    tx = np.interp(np.arange(F), t, x[t] + strength * (fx - x[t]))
    if strength > 0:  # the law carries the body into the frames before and after it shows
        ty[ends], tx[ends] = ey, ex
    p = np.maximum(peak, 1e-6)[:, None, None]  # an empty frame (peak 0) gets no mask
    alpha = np.clip((dev - 0.2 * p) / (0.2 * p), 0.0, 1.0).astype(np.float32)
    kernel = np.ones((3, 3), np.float32)
    alpha = np.stack([cv2.dilate(a, kernel) for a in alpha])
    R = int(radius) if radius is not None else max(3, int(round(0.14 * min(H, W))))
    S = 2 * R + 1
    lin = cv2.INTER_LINEAR
    crop_a, crop_c = [], []
    for i in t:  # crops of the object aligned on its centroid, where it shows
        M = np.float32([[1, 0, R - x[i]], [0, 1, R - y[i]]])
        crop_a.append(cv2.warpAffine(alpha[i], M, (S, S), flags=lin))
        crop_c.append(cv2.warpAffine(np.ascontiguousarray(f[i] * alpha[i][..., None]), M, (S, S), flags=lin))
    tmpl_a = np.median(np.stack(crop_a), 0)
    tmpl_c = np.median(np.stack(crop_c), 0)
    out = f.copy()
    drawn = range(F) if strength > 0 else range(t[0], t[-1] + 1)  # strength 0: no law to carry it
    for i in drawn:
        a = alpha[i][..., None]
        removed = f[i] * (1 - a) + bg * a
        M = np.float32([[1, 0, tx[i] - R], [0, 1, ty[i] - R]])
        a2 = cv2.warpAffine(tmpl_a, M, (W, H), flags=lin)[..., None]
        c2 = cv2.warpAffine(tmpl_c, M, (W, H), flags=lin)
        out[i] = removed * (1 - a2) + c2
    return out, float(np.sqrt(np.mean((ty[t] - y[t]) ** 2 + (tx[t] - x[t]) ** 2)))
