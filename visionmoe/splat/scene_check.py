"""The one finiteness rule for scenes: every value finite, and finite after activation in float32.

Every reader and decoder hands its scene to :func:`check_finite` before anything is written or
rendered. "After activation" is what a renderer computes from the stored values:

* ``exp(log_scales)`` in float32, so a log-scale above ln(FLT_MAX) ~ 88.72 is refused;
* colours: ``0.5 + sum_k Y_k c_k`` over the SH coefficients; every real SH basis function of
  degree <= 3 has ``|Y_k| < 1`` on the sphere, so ``0.5 + sum_k |c_k|`` below FLT_MAX bounds it;
* quaternions: the squared norm used to normalise them must not overflow float32;
* positions and opacity logits: finite (a sigmoid of a finite logit always is).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from .io import GaussianScene, SceneError

logger = logging.getLogger(__name__)

FLOAT32_MAX = float(np.finfo(np.float32).max)
#: the largest log-scale whose exp is finite in float32 (exp(88.72283) ~ 3.4e38)
LOG_SCALE_LIMIT = float(np.log(np.float64(FLOAT32_MAX)))


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def _bad_rows(scene: GaussianScene) -> dict[str, np.ndarray]:
    """attribute -> bool [N], True where that attribute of the Gaussian breaks the rule."""
    n = scene.num_gaussians
    means, quats, scales = _f64(scene.means), _f64(scene.quats), _f64(scene.log_scales)
    opacity, sh = _f64(scene.opacity_logits), _f64(scene.sh).reshape(n, -1)
    with np.errstate(over="ignore", invalid="ignore"):
        # float64 sums of float32 values: an overflow past float32 shows as a value > FLOAT32_MAX
        colour_bound = 0.5 + np.abs(sh).sum(1)
        quat_norm2 = (quats * quats).sum(1)
        return {
            "means": ~np.isfinite(means).all(1),
            "log_scales": ~(np.isfinite(scales).all(1) & (scales <= LOG_SCALE_LIMIT).all(1)),
            "opacity_logits": ~np.isfinite(opacity),
            "sh (colours)": ~(np.isfinite(colour_bound) & (colour_bound <= FLOAT32_MAX)),
            "quats": ~(np.isfinite(quat_norm2) & (quat_norm2 <= FLOAT32_MAX)),
        }


_WHY = {
    "means": "NaN/Inf positions",
    "log_scales": f"NaN/Inf log-scales or log-scales above {LOG_SCALE_LIMIT:.5f} (exp overflows float32)",
    "opacity_logits": "NaN/Inf opacity logits",
    "sh (colours)": "NaN/Inf colour (SH) coefficients or colours that overflow float32",
    "quats": "NaN/Inf rotations or quaternions whose squared norm overflows float32",
}


def check_finite(scene: GaussianScene, source: str, *, nonfinite: str = "reject") -> tuple[GaussianScene, int]:
    """Every value finite, and finite after activation in float32 (exp of log-scales, colours/SH,
    opacity logits, positions); "reject" raises SceneError naming how many Gaussians and which
    attribute; "drop" returns the scene without them and the count dropped."""
    if nonfinite not in ("reject", "drop"):
        raise ValueError(f"nonfinite must be 'reject' or 'drop', got {nonfinite!r}")
    n = scene.num_gaussians
    if n == 0:
        return scene, 0
    per_attribute = _bad_rows(scene)
    bad = np.logical_or.reduce(list(per_attribute.values()))
    count = int(bad.sum())
    if count == 0:
        return scene, 0
    which = "; ".join(f"{int(rows.sum())} with {_WHY[name]}" for name, rows in per_attribute.items() if rows.any())
    if nonfinite == "reject":
        raise SceneError(f"{source}: {count} of {n} Gaussians have NaN/Inf values after activation in float32 "
                         f"({which}) (use nonfinite='drop' to skip them)")
    if count == n:
        raise SceneError(f"{source}: every Gaussian ({n}) has NaN/Inf values after activation in float32 ({which})")
    logger.warning("%s: dropped %d of %d Gaussians with NaN/Inf values after activation in float32 (%s)",
                   source, count, n, which)
    return scene.subset(torch.from_numpy(~bad).to(scene.device)), count
