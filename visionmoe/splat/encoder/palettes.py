"""Palette detection: which fine-tier channels sit on a small set of values (section PALT).

An encoder-side analysis; the table format and its encode/decode rules live in ``quantize.py``.
"""

from __future__ import annotations

import numpy as np

from ..pgms.quantize import MAX_PALETTE, PALETTE_ABSOLUTE, PALETTE_CHANNELS, PALETTE_PREDICTED, Palettes, nearest_index


def _entropy(v: np.ndarray) -> float:
    _, c = np.unique(v, return_counts=True)
    p = c / c.sum()
    return float(-(p * np.log2(p)).sum())


def detect_palettes(leaves, parent_dc: np.ndarray | None = None, max_size: int = MAX_PALETTE) -> Palettes | None:
    """Find the channels of the fine tier (``leaves``, a GaussianScene) that take at most
    ``max_size`` (and at most N/4) distinct values; DC channels get PALETTE_PREDICTED when
    the index residual against the parent's DC (``parent_dc`` [N, 3]) has lower entropy."""
    n = leaves.num_gaussians
    cols = {"op": leaves.opacity_logits.numpy().reshape(-1)}
    for c in range(3):
        cols[f"dc{c}"] = leaves.sh_dc.numpy()[:, c]
        cols[f"ls{c}"] = leaves.log_scales.numpy()[:, c]
    values, mode = {}, {}
    for ch in PALETTE_CHANNELS:
        x = np.asarray(cols[ch], np.float32)
        if n < 64 or not np.isfinite(x).all():
            continue
        u = np.unique(x)
        if len(u) > min(max_size, n // 4):
            continue
        values[ch] = u
        mode[ch] = PALETTE_ABSOLUTE
        if ch.startswith("dc") and parent_dc is not None and len(u) > 1:
            idx = nearest_index(u, x)
            pidx = nearest_index(u, parent_dc[:, int(ch[2])])
            if _entropy(idx - pidx) < _entropy(idx):
                mode[ch] = PALETTE_PREDICTED
    return Palettes(values, mode) if values else None
