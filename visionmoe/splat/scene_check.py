"""The one finiteness rule for scenes: every value finite, and finite after activation in float32
(exp of log-scales, colours from the SH coefficients, quaternion norms, positions, opacity
logits; the rule itself: :mod:`._finite`). Every reader and decoder applies it before anything
is written or rendered."""

from __future__ import annotations

import torch

from ._finite import FLOAT32_MAX, LOG_SCALE_LIMIT, verdict
from .io import GaussianScene, SceneError

__all__ = ["FLOAT32_MAX", "LOG_SCALE_LIMIT", "check_finite"]


def check_finite(scene: GaussianScene, source: str, *, nonfinite: str = "reject") -> tuple[GaussianScene, int]:
    """Every value finite, and finite after activation in float32 (exp of log-scales, colours/SH,
    opacity logits, positions); "reject" raises SceneError naming how many Gaussians and which
    attribute; "drop" returns the scene without them and the count dropped."""
    arrays = {name: getattr(scene, name).detach().cpu()
              for name in ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest")}
    keep, error = verdict(arrays, source, nonfinite)
    if error:
        raise SceneError(error)
    if keep is None:
        return scene, 0
    return scene.subset(torch.from_numpy(keep).to(scene.device)), int((~keep).sum())
