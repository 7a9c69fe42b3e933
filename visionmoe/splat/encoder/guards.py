"""The encoder's input rules for degenerate scenes (issue 31): what is clamped, what is refused.

Every rule is one line here and one line in docs/ROBUSTNESS.md; nothing degenerate reaches the
rate search, so every encode ends (a result or one error):

* NaN/Inf anywhere: refused (``io.read_ply(nonfinite="drop")`` / ``--drop-nonfinite`` skip them).
* A coordinate beyond ``MAX_COORDINATE`` (1e7 scene units, float32 still resolves 1 unit there):
  refused with the count and the largest value; PGMS quantises positions relative to the scene's
  extent, and one point at 1e15 or 3e38 leaves no precision (or no float32 range) for the rest.
* Log-scales outside ``[MIN_LOG_SCALE, MAX_LOG_SCALE]`` = [-30, 30] (sizes 9e-14 to 1e13): clamped,
  counted in ``CompressResult.clamped_log_scales``. Below, a Gaussian is a point at any camera
  resolution (the rasteriser's 0.3 px low-pass sets its footprint); above, its covariance
  overflows float32 (exp(2 x 44) > 3.4e38) and the estimates turn NaN.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from ..io import GaussianScene, SceneError

logger = logging.getLogger(__name__)

MAX_COORDINATE = 1e7
MIN_LOG_SCALE, MAX_LOG_SCALE = -30.0, 30.0


@dataclass
class GuardedScene:
    scene: GaussianScene
    clamped_log_scales: int  # Gaussians whose log-scales were clamped into range


def guard_input(scene: GaussianScene) -> GuardedScene:
    """Apply the input rules above -> the scene to encode (or raise ``SceneError``, one line)."""
    n = scene.num_gaussians
    if n == 0:
        raise SceneError("the scene holds no Gaussians; nothing to compress")
    for name in ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest"):
        bad = ~torch.isfinite(getattr(scene, name).reshape(n, -1)).all(1)
        if bool(bad.any()):
            raise SceneError(f"{int(bad.sum())} of {n} Gaussians have NaN/Inf values in {name} "
                             f"(drop them first: read_ply(..., nonfinite='drop'))")
    far = scene.means.abs().amax(1) > MAX_COORDINATE
    if bool(far.any()):
        raise SceneError(f"{int(far.sum())} of {n} Gaussians lie beyond {MAX_COORDINATE:g} scene units from the "
                         f"origin (largest position coordinate {float(scene.means.abs().max()):.3g}); PGMS codes "
                         f"positions within +-{MAX_COORDINATE:g}: remove or crop them")
    qn = scene.quats.norm(dim=1)
    if bool((qn < 1e-12).any()):
        raise SceneError(f"{int((qn < 1e-12).sum())} of {n} Gaussians have a zero rotation quaternion")
    out_of_range = ((scene.log_scales < MIN_LOG_SCALE) | (scene.log_scales > MAX_LOG_SCALE)).any(1)
    clamped = int(out_of_range.sum())
    if clamped:
        logger.info("%d of %d Gaussians have log-scales outside [%g, %g]; clamped", clamped, n, MIN_LOG_SCALE,
                       MAX_LOG_SCALE)
        scene = replace(scene, log_scales=scene.log_scales.clamp(MIN_LOG_SCALE, MAX_LOG_SCALE))
    return GuardedScene(scene, clamped)
