"""One clip of the guarded evaluation (:func:`score_clip`): its headlines (gravity-fit residual,
scale-free jerk), guards, trajectory descriptor and failure, under :class:`EvalSettings`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..physics.tracking import check_frames
from . import metrics as M

__all__ = ["DISTANCE", "EvalSettings", "GUARDS", "HEADLINES", "SHARES", "object_color", "score_clip", "track_shape"]


#: (key, label, direction): the headline scores
HEADLINES: Tuple[Tuple[str, str, str], ...] = (
    ("gravity_residual", "gravity-fit residual (px)", "lower"),
    ("jerk_rel", "scale-free jerk (1/f^2)", "lower"),
)


#: distribution-level headline (one value per arm)
DISTANCE = ("trajectory_distance", "distance to simulator trajectories", "lower")


#: (key, label): guards, reported next to every headline
GUARDS: Tuple[Tuple[str, str], ...] = (
    ("fg_area", "foreground area (px)"),
    ("contrast", "object contrast"),
    ("frames_tracked", "frames tracked"),
    ("objects_per_frame", "objects per frame"),
    ("flicker", "flicker"),
    ("color_ok", "captioned colour (share)"),
)


SHARES = ("color_ok", "failed")


@dataclass
class EvalSettings:
    """What a clip must show to count (validated)."""

    min_tracked: float = 0.8  # fraction of frames in which the object must be found
    min_vertical_range: float = 3.0  # px: a falling object moves at least this much
    stall_frames: int = 4  # consecutive frame steps ...
    stall_speed: float = 0.25  # ... slower than this (px/frame): a frozen object
    n_boot: int = 2000
    seed: int = 0

    def __post_init__(self):
        if not 0.0 < self.min_tracked <= 1.0:
            raise ValueError(f"min_tracked must lie in (0, 1], got {self.min_tracked}")
        if self.min_vertical_range < 0 or self.n_boot < 10:
            raise ValueError(f"need min_vertical_range >= 0 and n_boot >= 10, got {self.min_vertical_range}, {self.n_boot}")


def object_color(frames: np.ndarray) -> Optional[str]:
    """Palette name of the moving object: per-pixel vote of the nearest palette hue among the
    saturated pixels that differ from the clip's temporal median (None: nothing moves)."""
    from ..data.scenes import COLORS

    names = [n for n in COLORS if n != "white"]
    pal = np.asarray([COLORS[n] for n in names], np.float32)
    f = frames.astype(np.float32)
    px = f[np.abs(f - np.median(f, axis=0)).max(-1) > 40]
    px = px[px.max(1) - px.min(1) > 50] if len(px) >= 10 else px[:0]
    if len(px) < 5:
        return None
    a = px - px.min(1, keepdims=True)
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    q = pal - pal.min(1, keepdims=True)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return names[int(np.bincount((a @ q.T).argmax(1), minlength=len(names)).argmax())]


def track_shape(positions: np.ndarray, height: int) -> List[float]:
    """The trajectory as the distance compares it: ``[F, 2]`` positions relative to the first
    frame the object is found in, in frame heights, flattened; frames without the object are
    NaN (:func:`trajectory_distance` puts them a frame height away)."""
    p = np.asarray(positions, np.float64)
    found = ~np.isnan(p).any(1)
    if not found.any():
        return [float("nan")] * p.size
    return ((p - p[int(np.argmax(found))]) / float(height)).reshape(-1).tolist()


def score_clip(frames, color: Optional[str] = None, settings: Optional[EvalSettings] = None) -> Dict[str, Any]:
    """Headlines, guards, trajectory descriptor and failure of one clip (``[F, H, W, 3]`` uint8).

    ``failed`` is 1.0 when the object is lost, does not move or a headline is undefined; the
    headline values of such a clip are kept as measured (possibly NaN) and replaced only in
    :func:`summarize`.
    """
    st = settings or EvalSettings()
    frames = check_frames(frames)
    tr = M.guarded_track(frames)
    row: Dict[str, Any] = dict(tr.guards())
    F = frames.shape[0]
    row["flicker"] = M.flow_warp_error(frames)["flicker"]
    row["color_ok"] = float(object_color(frames) == color) if color is not None else float("nan")
    fit = M.gravity_fit(track=tr.positions)
    row["gravity_residual"] = float(fit.residual_quadratic)
    row["jerk_rel"] = M.scale_free_jerk(tr.positions)
    y = tr.positions[tr.found, 1]
    vrange = float(y.max() - y.min()) if len(y) else 0.0
    v = np.diff(tr.positions, axis=0)
    speed = np.linalg.norm(v[~np.isnan(v).any(1)], axis=1)
    row.update(gravity_accel=float(fit.accel), vertical_range=vrange,
               mean_speed=float(speed.mean()) if len(speed) else 0.0, num_segments=float(fit.num_segments))
    row["num_frames"] = float(F)
    row["track"] = track_shape(tr.positions, frames.shape[1])
    reasons = []
    if _stalled(tr.positions, st):
        reasons.append("stalled")
    if tr.frames_tracked < st.min_tracked * F:
        reasons.append("lost")
    if vrange < st.min_vertical_range:
        reasons.append("static")
    if any(not np.isfinite(row[k]) for k, _, _ in HEADLINES):
        reasons.append("undefined")
    row["failed"] = float(bool(reasons))
    row["failure"] = ",".join(reasons)
    return row


def _stalled(track: np.ndarray, st: "EvalSettings") -> bool:
    """The object stops: ``st.stall_frames`` consecutive frame steps slower than ``st.stall_speed``
    px/frame (a falling or bouncing ball under gravity passes through zero speed within a frame
    or two; the simulator's clips never stall)."""
    ok = ~np.isnan(track).any(1)
    run = 0
    for t in range(1, len(track)):
        slow = ok[t] and ok[t - 1] and np.linalg.norm(track[t] - track[t - 1]) < st.stall_speed
        run = run + 1 if slow else 0
        if run >= st.stall_frames:
            return True
    return False
