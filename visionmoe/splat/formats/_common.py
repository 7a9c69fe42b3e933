"""Shared pieces of the scene file formats: the DC colour constant, Morton order (files are written
through ``visionmoe.common.files.atomic_write``, the one writer)."""

from __future__ import annotations

import numpy as np

#: the degree-0 SH basis constant: colour = 0.5 + SH_C0 * f_dc
SH_C0 = 0.28209479177387814


def _part1by2(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.uint32) & np.uint32(0x3FF)
    v = (v ^ (v << np.uint32(16))) & np.uint32(0xFF0000FF)
    v = (v ^ (v << np.uint32(8))) & np.uint32(0x0300F00F)
    v = (v ^ (v << np.uint32(4))) & np.uint32(0x030C30C3)
    v = (v ^ (v << np.uint32(2))) & np.uint32(0x09249249)
    return v


def morton_order(xyz: np.ndarray) -> np.ndarray:
    """Permutation sorting points [N, 3] along a 30-bit Morton (Z-order) curve.

    Same order as PlayCanvas splat-transform (``sortMortonColumns``): 10 bits per axis over
    the points' bounding box, a stable sort, and every run of more than 256 points sharing a
    code refined recursively over its own bounding box.
    """
    order = np.arange(len(xyz), dtype=np.int64)
    pos = np.asarray(xyz, dtype=np.float64)

    def refine(idx: np.ndarray) -> np.ndarray:
        if len(idx) == 0:
            return idx
        p = pos[idx]
        lo, hi = p.min(0), p.max(0)
        ext = hi - lo
        if not np.isfinite(ext).all() or (ext == 0).all():
            return idx
        with np.errstate(divide="ignore"):
            mul = np.where(ext == 0, 0.0, 1024.0 / np.where(ext == 0, 1.0, ext))
        q = np.minimum(1023.0, (p - lo) * mul).astype(np.uint32)  # JS `>>> 0` truncates
        code = (_part1by2(q[:, 2]) << np.uint32(2)) + (_part1by2(q[:, 1]) << np.uint32(1)) + _part1by2(q[:, 0])
        perm = np.argsort(code, kind="stable")
        idx, code = idx[perm], code[perm]
        bounds = np.flatnonzero(np.diff(code)) + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [len(idx)]])
        for s, e in zip(starts, ends):
            if e - s > 256:
                idx[s:e] = refine(idx[s:e])
        return idx

    return refine(order)
