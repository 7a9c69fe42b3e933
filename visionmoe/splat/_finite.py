"""The finiteness rule on plain arrays, for :mod:`.scene_check` and for ``io.read_ply`` (which
cannot import ``scene_check``: that module needs ``io``'s scene type). Every value finite, and
finite after activation in float32:

* ``exp(log_scales)`` in float32, so a log-scale above ln(FLT_MAX) ~ 88.72 is refused;
* colours: ``0.5 + sum_k Y_k c_k`` over the SH coefficients; every real SH basis function of
  degree <= 3 has ``|Y_k| < 1`` on the sphere, so ``0.5 + sum_k |c_k|`` below FLT_MAX bounds it;
* quaternions: the squared norm used to normalise them must not overflow float32;
* positions and opacity logits: finite (a sigmoid of a finite logit always is).
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger("visionmoe.splat.scene_check")

FLOAT32_MAX = float(np.finfo(np.float32).max)
#: the largest log-scale whose exp is finite in float32 (exp(88.72283) ~ 3.4e38)
LOG_SCALE_LIMIT = float(np.log(np.float64(FLOAT32_MAX)))
_CHUNK = 1 << 15  # rows checked at a time: float64 temporaries of a few MB whatever the scene's size

WHY = {
    "means": "NaN/Inf positions",
    "log_scales": f"NaN/Inf log-scales or log-scales above {LOG_SCALE_LIMIT:.5f} (exp overflows float32)",
    "opacity_logits": "NaN/Inf opacity logits",
    "sh": "NaN/Inf colour (SH) coefficients or colours that overflow float32",
    "quats": "NaN/Inf rotations or quaternions whose squared norm overflows float32",
}


def violations(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays``: means [N, 3], quats [N, 4], log_scales [N, 3], opacity_logits [N], sh_dc [N, 3],
    sh_rest [N, K, 3] (numpy or CPU tensors) -> attribute -> bool [N], True where it breaks the rule."""
    n = len(arrays["means"])
    out = {name: np.zeros(n, bool) for name in WHY}
    for a in range(0, n, _CHUNK):
        rows = slice(a, min(n, a + _CHUNK))
        v = {k: np.asarray(arrays[k][rows]).reshape(rows.stop - a, -1) for k in arrays}  # float32 views
        with np.errstate(over="ignore", invalid="ignore"):
            # sums accumulated in float64: an overflow past float32 shows as a value > FLOAT32_MAX
            colour_bound = (0.5 + np.abs(v["sh_dc"]).sum(1, dtype=np.float64)
                            + np.abs(v["sh_rest"]).sum(1, dtype=np.float64))
            q = v["quats"].astype(np.float64)
            quat_norm2 = (q * q).sum(1)
            out["means"][rows] = ~np.isfinite(v["means"]).all(1)
            ls = v["log_scales"].astype(np.float64)  # float32(LOG_SCALE_LIMIT) rounds up, past exp's range
            out["log_scales"][rows] = ~(np.isfinite(ls).all(1) & (ls <= LOG_SCALE_LIMIT).all(1))
            out["opacity_logits"][rows] = ~np.isfinite(v["opacity_logits"]).all(1)
            out["sh"][rows] = ~(np.isfinite(colour_bound) & (colour_bound <= FLOAT32_MAX))
            out["quats"][rows] = ~(np.isfinite(quat_norm2) & (quat_norm2 <= FLOAT32_MAX))
    return out


def verdict(arrays: dict[str, np.ndarray], source: str, nonfinite: str) -> tuple[np.ndarray | None, str | None]:
    """Apply the rule -> (the rows to keep, None when all pass; the error message when the scene
    is refused, else None). "reject" refuses any violation, "drop" only a scene with no row left
    (and logs how many rows it drops)."""
    if nonfinite not in ("reject", "drop"):
        raise ValueError(f"nonfinite must be 'reject' or 'drop', got {nonfinite!r}")
    per_attribute = violations(arrays)
    n = len(arrays["means"])
    bad = np.logical_or.reduce(list(per_attribute.values())) if n else np.zeros(0, bool)
    count = int(bad.sum())
    if count == 0:
        return None, None
    which = "; ".join(f"{int(rows.sum())} with {WHY[name]}" for name, rows in per_attribute.items() if rows.any())
    if nonfinite == "reject":
        return None, (f"{source}: {count} of {n} Gaussians have NaN/Inf values after activation in float32 "
                      f"({which}) (use nonfinite='drop' to skip them)")
    if count == n:
        return None, f"{source}: every Gaussian ({n}) has NaN/Inf values after activation in float32 ({which})"
    logger.warning("%s: dropped %d of %d Gaussians with NaN/Inf values after activation in float32 (%s)",
                   source, count, n, which)
    return ~bad, None
