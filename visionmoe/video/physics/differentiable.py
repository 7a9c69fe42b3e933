"""Differentiable (torch) forms of the tracker and of the trajectory law, for inference-time
guidance (:mod:`visionmoe.video.hooks.trajectory_guidance`): a soft centroid track of the
moving object and the squared residual of the law on it.
"""

from __future__ import annotations

import torch

from .laws import bounce_segments

__all__ = ["law_residual", "soft_track"]


def soft_track(frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``frames`` [B, 3, F, H, W] in [-1, 1] -> (y, x) [B, F]: differentiable centroids of the
    moving object (pixels deviating from the temporal median by more than half the frame's
    peak deviation, weighted by the excess; the median and the threshold are not differentiated)."""
    g = frames.mean(1)
    bg = g.median(dim=1, keepdim=True).values.detach()
    dev = (g - bg).abs()
    peak = dev.flatten(2).amax(-1).detach()[..., None, None]
    w = torch.relu(dev - 0.5 * peak)
    H, W = g.shape[-2:]
    yy = torch.arange(H, dtype=g.dtype, device=g.device)[:, None].expand(H, W)
    xx = torch.arange(W, dtype=g.dtype, device=g.device)[None, :].expand(H, W)
    s = w.sum((-1, -2)) + 1e-6
    return (w * yy).sum((-1, -2)) / s, (w * xx).sum((-1, -2)) / s


def law_residual(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Sum over clips of the squared residuals of ``y`` [B, F] on piecewise parabolas with one
    shared acceleration and of ``x`` on piecewise lines (segments from the detached ``y``)."""
    total = y.new_zeros(())
    for b in range(y.shape[0]):
        segs = bounce_segments(y[b].detach().cpu().numpy())  # cut where the metric cuts
        if not segs:
            continue
        k, rows = len(segs), sum(e - s for s, e in segs)
        A = y.new_zeros(rows, 1 + 2 * k)
        L = y.new_zeros(rows, 2 * k)
        idx, r = [], 0
        for i, (s, e) in enumerate(segs):
            t = torch.arange(e - s, dtype=y.dtype, device=y.device)
            A[r:r + e - s, 0] = 0.5 * t * t
            A[r:r + e - s, 1 + 2 * i] = t
            A[r:r + e - s, 2 + 2 * i] = 1
            L[r:r + e - s, 2 * i] = t
            L[r:r + e - s, 2 * i + 1] = 1
            idx += range(s, e)
            r += e - s
        at = torch.tensor(idx, device=y.device)
        for design, v in ((A, y[b, at]), (L, x[b, at])):
            projection = design @ torch.linalg.pinv(design)
            res = v - projection @ v
            total = total + (res * res).sum()
    return total
