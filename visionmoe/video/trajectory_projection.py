"""Inference-time rigid-body trajectory projection for diffusers Wan pipelines.

The toy world's jitter is set by the last denoising steps: per frame, the moving object changes
shape and jumps by a pixel or two (scale-free jerk 3.5x the simulator's), and whatever earlier
steps do to the motion, the last two re-draw it (``MODEL_CARD.md``). This acts where it is set:
on the clean-video estimate ``x0 = x_t - sigma * v`` of the last ``steps`` denoising steps
(``v``: the velocity the scheduler receives, after classifier-free guidance and every hook),

1. decode ``x0`` with the pipeline's VAE; background = per-pixel temporal median; the object's
   soft mask = where a pixel deviates from it by more than 20% of the frame's peak deviation
   (ramping to full at 40%, dilated by one pixel); its track = the centroid of the deviation
   above half the peak, weighted by the excess (a soft form of the metric's tracker), over one
   blob of it followed from frame to frame (a ghost beside the ball neither pulls the track nor
   blends into the template);
2. fit the **law** to the track: piecewise parabolas with one shared vertical acceleration per
   clip, cut at bounces (:func:`.metrics.bounce_segments`), and straight lines horizontally
   (``law="gravity"``; ``law="lines"``: no acceleration, the wrong-law control); a bounce frame,
   which neither parabola fits, lies on whichever of the two is above the floor there;
3. a **rigid body** keeps its shape: the object's template is the per-pixel median of its
   crops aligned on the track, and each frame is re-drawn as the frame with the object removed
   (its mask filled with the background) plus the template at ``track + strength * (fit - track)``;
4. encode the projected and the decoded video and move ``x0`` by the difference of the two
   encodings (so the VAE's own round-trip error cancels), which the scheduler then steps with:
   ``v' = v - (E(projected) - E(decoded)) / sigma``.

With ``steps=1`` (the default) only the final step's estimate is projected: a physics
post-process of the clean latent, which the model does not revisit. Projecting earlier steps
was measured too (``MODEL_CARD.md``): the remaining steps re-draw the jitter. Frames that show
the object faintly or not at all neither steer the fit nor shape the template, and the body is
drawn there all the same: on the interpolated track between frames that show it, on the law's
fit carried on before the first and after the last; clips in which fewer than 5 frames show it
are left unchanged.

It suits what the toy world shows: one object on a static background and camera. It is not a
general video editor: several objects share one template, camera motion breaks the background
median.

**Where the projected video goes** (``space``):

- ``"latent"``: step 4 above. The pipeline's latents (``output_type="latent"``) carry the
  projection, and so does its decoded video, through one more encode and decode.
- ``"pixels"``: steps 1-3 on the video the pipeline decodes after its last step; the latents
  stay the base's. The toy world's VAE does not carry an edited latent faithfully. Through it the
  projected pixels' jerk gain shrinks from -61% to -41% on the tuning clips, and a green ball
  can come out blue (``MODEL_CARD.md``). Projecting the decoded video skips that round trip and
  costs no VAE passes of its own.

``attach_trajectory_projection(pipe, steps, law, strength, space)`` wraps the pipeline
scheduler's ``step`` (diffusers has no scheduler hooks) and, for ``"pixels"``, its VAE's
``decode``; ``detach_trajectory_projection(pipe)`` restores both. ``steps=0`` never runs the
VAE and changes nothing. ``strength=0`` keeps the object's track and only makes its shape rigid:
the control that separates the law from the rigidity.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np
import torch

from .metrics import _cv2, _fit_segments, bounce_segments

logger = logging.getLogger(__name__)

LAWS = ("gravity", "lines")
SPACES = ("latent", "pixels")

__all__ = ["LAWS", "SPACES", "TrajectoryProjection", "attach_trajectory_projection", "detach_trajectory_projection",
           "fit_law_track", "project_clip"]


def fit_law_track(y: np.ndarray, x: np.ndarray, law: str = "gravity", t: Optional[np.ndarray] = None,
                  at: Optional[np.ndarray] = None):
    """The law's least-squares fit of a ``[N]`` track (+y down) at frame times ``t`` (default
    0..N-1): ``y`` on piecewise parabolas with one shared acceleration (``"gravity"``) or on
    piecewise lines (``"lines"``), ``x`` on piecewise lines; segments cut at bounces as the metric
    cuts them. A point between two segments (a bounce frame, or a segment too short to fit) lies
    on whichever of the two parabolas is above the floor there (+y down: the smaller y),
    horizontally between the two lines; points before the first or after the last segment keep
    their measured value.

    Returns ``(fy, fx)``; with ``at`` (other frame times) also the law there, ``(fy, fx, ay, ax)``,
    from the first segment before it starts and from the latest segment started otherwise
    (measured values where no segment was fitted)."""
    if law not in LAWS:
        raise ValueError(f"law must be one of {LAWS}, got {law!r}")
    y = np.asarray(y, np.float64)
    x = np.asarray(x, np.float64)
    t_all = np.arange(len(y), dtype=np.float64) if t is None else np.asarray(t, np.float64)
    at = None if at is None else np.asarray(at, np.float64)
    fy, fx = y.copy(), x.copy()
    segs = bounce_segments(y)
    if not segs:
        if at is None:
            return fy, fx
        return fy, fx, np.interp(at, t_all, y), np.interp(at, t_all, x)
    # the metric's own least squares: sol = [shared acceleration (0 for lines), b0, c0, b1, c1, ...]
    _, _, sol = _fit_segments(t_all, y, segs, shared_accel=law == "gravity")
    starts = np.array([t_all[s] for s, _ in segs])
    xlines = [np.polyfit(t_all[s:e] - t_all[s], x[s:e], 1) for s, e in segs]

    def on_law(seg: np.ndarray, dt: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        ly = 0.5 * sol[0] * dt * dt + sol[1 + 2 * seg] * dt + sol[2 + 2 * seg]
        return ly, np.array([np.polyval(xlines[i], d) for i, d in zip(seg, dt)])

    for i, (s, e) in enumerate(segs):
        fy[s:e], fx[s:e] = on_law(np.full(e - s, i), t_all[s:e] - t_all[s])
    for k in range(len(segs) - 1):  # the gap between two segments: on the law (docstring)
        gap = np.arange(segs[k][1], segs[k + 1][0])
        if len(gap):
            ya, xa = on_law(np.full(len(gap), k), t_all[gap] - starts[k])
            yb, xb = on_law(np.full(len(gap), k + 1), t_all[gap] - starts[k + 1])
            fy[gap], fx[gap] = np.minimum(ya, yb), 0.5 * (xa + xb)
    if at is None:
        return fy, fx
    seg = np.clip(np.searchsorted(starts, at, side="right") - 1, 0, len(segs) - 1)
    ay, ax = on_law(seg, at - starts[seg])
    return fy, fx, ay, ax


def _object_centroids(dev: np.ndarray, shown: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(y, x) [F] of one object (NaN where a shown frame has none): the centroid of the colour
    deviation ``dev`` [F, H, W] above half the frame's peak, weighted by the excess (the mask
    :func:`.metrics.guarded_track` thresholds, soft), over one connected blob of it (the mask
    dilated by a pixel, so a ball drawn in two pieces stays one). A centroid over the whole frame
    would sit between two blobs (a ball and a ghost of it) and jump between them, and the
    template aligned on it would be a grey blend of both. The track starts at the heaviest blob of
    the frames that show a single one (of all frames if none does) and follows, forward and
    backward, the blob nearest to the constant-velocity prediction among those at least 30% as
    heavy as the frame's heaviest."""
    cv2 = _cv2()
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
                 min_peak: float = 0.1, faint: float = 0.35) -> Tuple[np.ndarray, float]:
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

    Returns:
        (projected frames, RMS shift of the object in pixels over the frames that show it);
        unchanged frames and 0.0 when fewer than 5 frames show the object.
    """
    cv2 = _cv2()
    f = np.asarray(frames, np.float32)
    if f.ndim != 4 or f.shape[-1] != 3:
        raise ValueError(f"frames must be [F, H, W, 3], got shape {f.shape}")
    F, H, W, _ = f.shape
    if F < 5:
        return f, 0.0
    bg = np.median(f, axis=0)
    dev = np.abs(f - bg).max(-1)
    peak = dev.reshape(F, -1).max(1)
    shown = (peak >= min_peak) & (peak >= faint * np.median(peak))
    if shown.sum() < 5:
        return f, 0.0
    y, x = _object_centroids(dev, shown)
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


@dataclass
class TrajectoryProjection:
    """The settings and state of one attachment (see the module docstring)."""

    vae: torch.nn.Module
    steps: int = 1
    law: str = "gravity"
    strength: float = 1.0
    space: str = "latent"
    calls: int = 0  # projected denoising steps or decoded videos (for tests and logging)
    shifts: List[float] = field(default_factory=list)  # RMS object shift per projected clip, px
    armed: bool = False  # "pixels": the last step has run, the next decode is the output
    _wrappers: dict = field(default_factory=dict, repr=False)  # what attach set on the scheduler / VAE

    def __post_init__(self):
        if not (isinstance(self.steps, (int, np.integer)) and self.steps >= 0):
            raise ValueError(f"steps must be an integer >= 0, got {self.steps!r}")
        if self.space not in SPACES:
            raise ValueError(f"space must be one of {SPACES}, got {self.space!r}")
        if self.space == "pixels" and self.steps > 1:
            raise ValueError(f"space 'pixels' projects the decoded video once: steps must be 0 or 1, got {self.steps}")
        if self.law not in LAWS:
            raise ValueError(f"law must be one of {LAWS}, got {self.law!r}")
        if not (np.isfinite(self.strength) and 0.0 <= self.strength <= 1.0):
            raise ValueError(f"strength must lie in [0, 1], got {self.strength!r}")
        cfg = self.vae.config
        self._mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1)
        self._std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1)

    @property
    def active(self) -> bool:
        return self.steps > 0

    def _project_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """Projected copies of decoded videos ``[B, 3, F, H, W]`` in [-1, 1]."""
        out = frames.clone()
        for b in range(frames.shape[0]):
            clip = frames[b].permute(1, 2, 3, 0).cpu().numpy()
            proj, shift = project_clip(clip, self.law, self.strength)
            self.shifts.append(shift)
            out[b] = torch.from_numpy(proj).permute(3, 0, 1, 2).to(out)
        return out

    @torch.no_grad()
    def project_video(self, video: torch.Tensor) -> torch.Tensor:
        """The pipeline's decoded ``video`` [B, 3, F, H, W] with its object projected (``"pixels"``);
        pixels the projection leaves alone keep their values, out-of-range ones included."""
        frames = video.float().clamp(-1, 1)
        out = video.float() + (self._project_frames(frames) - frames)
        self.calls += 1
        logger.debug("trajectory projection of the decoded video: mean object shift %.2f px",
                     float(np.mean(self.shifts[-video.shape[0]:])))
        return out.to(video.dtype)

    @torch.no_grad()
    def project(self, x0: torch.Tensor) -> torch.Tensor:
        """Projected clean latents for normalised Wan latents ``x0`` [B, C, T, H, W]."""
        if x0.shape[1] != self._mean.shape[1]:
            raise ValueError(f"latents have {x0.shape[1]} channels, the VAE {self._mean.shape[1]}")
        vae, dt = self.vae, self.vae.dtype
        mean, std = self._mean.to(x0.device), self._std.to(x0.device)
        frames = vae.decode((x0 * std + mean).to(dt), return_dict=False)[0].float().clamp(-1, 1)
        out = self._project_frames(frames)
        e0 = vae.encode(frames.to(dt)).latent_dist.mean.float()
        e1 = vae.encode(out.to(dt)).latent_dist.mean.float()
        return x0 + (e1 - e0) / std

    def apply(self, model_output: torch.Tensor, sample: torch.Tensor, sigma: float) -> torch.Tensor:
        """The velocity that makes the scheduler's clean estimate the projected one."""
        x0 = sample.float() - sigma * model_output.float()
        x0p = self.project(x0)
        self.calls += 1
        logger.debug("trajectory projection at sigma %.3f: mean object shift %.2f px", sigma,
                     float(np.mean(self.shifts[-x0.shape[0]:])))
        return ((sample.float() - x0p) / sigma).to(model_output.dtype)


def _step_position(scheduler, timestep) -> Tuple[int, float]:
    """(index of ``timestep`` in the scheduler's schedule, its sigma)."""
    ts = scheduler.timesteps
    t = torch.as_tensor(timestep, device=ts.device).reshape(-1)[0]
    hits = (ts == t).nonzero()
    if len(hits) == 0:
        raise ValueError(f"timestep {float(t)} is not in the scheduler's schedule")
    i = int(hits[0])
    sigmas = getattr(scheduler, "sigmas", None)
    if sigmas is not None and len(sigmas) > i:
        return i, float(sigmas[i])
    ntt = int(getattr(scheduler.config, "num_train_timesteps", 1000) or 1000)
    return i, float(t) / ntt


def attach_trajectory_projection(pipe, steps: int = 1, law: str = "gravity", strength: float = 1.0,
                                 space: str = "latent") -> TrajectoryProjection:
    """Project ``pipe``'s output onto the law: the clean estimate of its last ``steps`` denoising
    steps (``space="latent"``) or the video its VAE decodes after the last step
    (``space="pixels"``; ``steps`` 0 or 1); see the module docstring. Attaching again replaces the
    previous attachment."""
    vae = getattr(pipe, "vae", None)
    if vae is None or not hasattr(vae.config, "latents_mean"):
        raise ValueError(f"{type(pipe).__name__} has no Wan VAE (vae.config.latents_mean): trajectory projection "
                         "decodes the clean-latent estimate")
    sched = getattr(pipe, "scheduler", None)
    if sched is None or not hasattr(sched, "step"):
        raise ValueError(f"{type(pipe).__name__} has no scheduler")
    pred = getattr(sched.config, "prediction_type", "flow_prediction")
    if pred != "flow_prediction" and "FlowMatch" not in type(sched).__name__:
        raise ValueError(f"trajectory projection needs a flow-prediction scheduler, {type(sched).__name__} "
                         f"predicts {pred!r}")
    proj = TrajectoryProjection(vae, steps, law, float(strength), space)
    detach_trajectory_projection(pipe)
    original = sched.step

    def step(model_output, timestep, sample, *args, **kwargs):
        if not proj.active:
            return original(model_output, timestep, sample, *args, **kwargs)
        i, sigma = _step_position(sched, timestep)
        last = i == len(sched.timesteps) - 1
        if i == 0:
            proj.armed = False  # a new run: a decode before its last step is not its output
        if proj.space == "latent" and i >= len(sched.timesteps) - proj.steps and sigma > 0:
            model_output = proj.apply(model_output, sample, sigma)
        result = original(model_output, timestep, sample, *args, **kwargs)
        proj.armed = proj.space == "pixels" and last
        return result

    sched.step = proj._wrappers["step"] = step
    if space == "pixels":
        decode_base = vae.decode

        def decode(z, *args, **kwargs):
            out = decode_base(z, *args, **kwargs)
            if not (proj.active and proj.armed):
                return out  # decodes during denoising (e.g. trajectory guidance's) pass through
            proj.armed = False
            if isinstance(out, tuple):
                return (proj.project_video(out[0]),) + tuple(out[1:])
            out.sample = proj.project_video(out.sample)
            return out

        vae.decode = proj._wrappers["decode"] = decode
    pipe._trajectory_projection = proj
    return proj


def detach_trajectory_projection(pipe) -> None:
    """Remove the projection; the pipeline is the base pipeline again."""
    proj = getattr(pipe, "_trajectory_projection", None)
    if proj is None:
        return
    for owner, name in ((getattr(pipe, "scheduler", None), "step"), (getattr(pipe, "vae", None), "decode")):
        if owner is not None and vars(owner).get(name) is proj._wrappers.get(name, False):
            delattr(owner, name)  # the instance attribute set by attach; the class method is back
    del pipe._trajectory_projection
