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
   clip, cut at bounces (:func:`visionmoe.video.physics.laws.bounce_segments`), and straight lines horizontally
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

The tracking, the law's fit and the re-drawing of a clip are
:func:`visionmoe.video.physics.rigid_body.project_clip`.

It suits what the toy world shows: one object on a static background and camera. It is not a
general video editor: several objects would share one template, camera motion breaks the
background median, sensor noise over a static scene would become an invented object, and a bob
on its string would lose the string. So each decoded clip is first checked by
:func:`visionmoe.video.physics.domain.single_free_body` (optical flow, connected components of the
motion mask above the noise floor, the distance the body travels, its compactness: nothing of the
law being enforced); a clip outside that domain is left exactly as it is, with one logged warning
per clip and run (``check_domain=False`` skips the check).

**Where the projected video goes** (``space``):

- ``"latent"``: step 4 above. The pipeline's latents (``output_type="latent"``) carry the
  projection, and so does its decoded video, through one more encode and decode.
- ``"pixels"``: steps 1-3 on the video the pipeline decodes after its last step; the latents
  stay the base's. The toy world's VAE does not carry an edited latent faithfully. Through it the
  projected pixels' jerk gain shrinks from -61% to -41% on the tuning clips, and a green ball
  can come out blue (``MODEL_CARD.md``). Projecting the decoded video skips that round trip and
  costs no VAE passes of its own.

``attach_trajectory_projection(pipe, steps, law, strength, space)`` (or
``apply_trajectory_projection(pipe, TrajectoryProjectionConfig(...))``) wraps the pipeline
scheduler's ``step`` (the scheduler is not an ``nn.Module``: diffusers has no scheduler hooks)
and, for ``"pixels"``, its VAE's ``decode`` (which no module's ``forward`` sees whole), through
the method wrappers of :mod:`._common`; ``detach_trajectory_projection(pipe)``
(= ``remove_trajectory_projection``) restores both. ``steps=0`` never runs the VAE and changes
nothing. ``strength=0`` keeps the object's track and only makes its shape rigid:
the control that separates the law from the rigidity.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np
import torch

from ..physics.domain import single_free_body
from ..physics.laws import LAWS
from ..physics.rigid_body import project_clip
from ._common import from_wan_latents, pop_attachment, set_attachment, unwrap_methods, wan_latent_stats, wrap_method

logger = logging.getLogger(__name__)

SPACES = ("latent", "pixels")
ATTRIBUTE = "_trajectory_projection"  # where the pipeline keeps the attachment

__all__ = ["LAWS", "SPACES", "TrajectoryProjection", "TrajectoryProjectionConfig", "apply_trajectory_projection",
           "attach_trajectory_projection", "detach_trajectory_projection", "remove_trajectory_projection"]


@dataclass
class TrajectoryProjectionConfig:
    """What :func:`apply_trajectory_projection` attaches (validated; see the module docstring)."""

    steps: int = 1
    law: str = "gravity"
    strength: float = 1.0
    space: str = "latent"
    check_domain: bool = True

    def __post_init__(self):
        if not isinstance(self.check_domain, bool):
            raise ValueError(f"check_domain must be True or False, got {self.check_domain!r}")
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


@dataclass
class TrajectoryProjection:
    """The settings and state of one attachment (see the module docstring)."""

    vae: torch.nn.Module
    steps: int = 1
    law: str = "gravity"
    strength: float = 1.0
    space: str = "latent"
    check_domain: bool = True
    calls: int = 0  # projected denoising steps or decoded videos (for tests and logging)
    shifts: List[float] = field(default_factory=list)  # RMS object shift per projected clip, px
    refused: List[str] = field(default_factory=list)  # why each clip left unchanged was outside the domain
    armed: bool = False  # "pixels": the last step has run, the next decode is the output
    _wrappers: list = field(default_factory=list, repr=False)  # methods wrapped by attach (hooks._common)

    def __post_init__(self):
        TrajectoryProjectionConfig(self.steps, self.law, self.strength, self.space, self.check_domain)  # the checks
        self._mean, self._std = wan_latent_stats(self.vae)
        self._warned = set()  # clips warned about in this run

    def new_run(self) -> None:
        self._warned.clear()

    def _outside_domain(self, b: int, clip: np.ndarray) -> bool:
        """Whether clip ``b`` ([F, H, W, 3] in [-1, 1]) is outside the projection's domain (warned
        once per clip and run)."""
        if not self.check_domain:
            return False
        check = single_free_body((clip + 1) / 2)
        if check.in_domain:
            return False
        self.refused.append(check.reason)
        if b not in self._warned:
            self._warned.add(b)
            logger.warning("trajectory projection left clip %d unchanged: %s", b, check.reason)
        return True

    @property
    def active(self) -> bool:
        return self.steps > 0

    def _project_frames(self, frames: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Projected copies of decoded videos ``[B, 3, F, H, W]`` in [-1, 1], and which clips
        changed ([B] bool: those outside the domain are copied as they are)."""
        out = frames.clone()
        changed = torch.zeros(frames.shape[0], dtype=torch.bool)
        for b in range(frames.shape[0]):
            clip = frames[b].permute(1, 2, 3, 0).cpu().numpy()
            if self._outside_domain(b, clip):
                self.shifts.append(0.0)
                continue
            proj, shift = project_clip(clip, self.law, self.strength, check_domain=False)
            self.shifts.append(shift)
            out[b] = torch.from_numpy(proj).permute(3, 0, 1, 2).to(out)
            changed[b] = True
        return out, changed

    @torch.no_grad()
    def project_video(self, video: torch.Tensor) -> torch.Tensor:
        """The pipeline's decoded ``video`` [B, 3, F, H, W] with its object projected (``"pixels"``);
        pixels the projection leaves alone keep their values, out-of-range ones included."""
        self.new_run()  # one decoded video per run
        frames = video.float().clamp(-1, 1)
        out = video.float() + (self._project_frames(frames)[0] - frames)
        self.calls += 1
        logger.debug("trajectory projection of the decoded video: mean object shift %.2f px",
                     float(np.mean(self.shifts[-video.shape[0]:])))
        return out.to(video.dtype)

    @torch.no_grad()
    def project(self, x0: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Projected clean latents for normalised Wan latents ``x0`` [B, C, T, H, W], and which
        clips changed ([B] bool; the others are ``x0``'s own)."""
        if x0.shape[1] != self._mean.shape[1]:
            raise ValueError(f"latents have {x0.shape[1]} channels, the VAE {self._mean.shape[1]}")
        vae, dt = self.vae, self.vae.dtype
        mean, std = self._mean.to(x0.device), self._std.to(x0.device)
        frames = vae.decode(from_wan_latents(x0, mean, std).to(dt), return_dict=False)[0].float().clamp(-1, 1)
        out, changed = self._project_frames(frames)
        if not changed.any():
            return x0, changed
        changed = changed.to(x0.device)
        e0 = vae.encode(frames[changed].to(dt)).latent_dist.mean.float()
        e1 = vae.encode(out[changed].to(dt)).latent_dist.mean.float()
        x0p = x0.clone()
        x0p[changed] += (e1 - e0) / std
        return x0p, changed

    def apply(self, model_output: torch.Tensor, sample: torch.Tensor, sigma: float) -> torch.Tensor:
        """The velocity that makes the scheduler's clean estimate the projected one (the
        velocity itself for clips left unchanged)."""
        x0 = sample.float() - sigma * model_output.float()
        x0p, changed = self.project(x0)
        self.calls += 1
        logger.debug("trajectory projection at sigma %.3f: mean object shift %.2f px", sigma,
                     float(np.mean(self.shifts[-x0.shape[0]:])))
        projected = ((sample.float() - x0p) / sigma).to(model_output.dtype)
        keep = changed.to(model_output.device).view(-1, *([1] * (model_output.dim() - 1)))
        return torch.where(keep, projected, model_output)


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


def _check_pipeline(pipe) -> None:
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


def _projected_step(proj: TrajectoryProjection, sched):
    """``scheduler.step`` that projects the clean estimate of the last ``proj.steps`` steps."""
    original = sched.step

    def step(model_output, timestep, sample, *args, **kwargs):
        if not proj.active:
            return original(model_output, timestep, sample, *args, **kwargs)
        i, sigma = _step_position(sched, timestep)
        last = i == len(sched.timesteps) - 1
        if i == 0:
            proj.armed = False  # a new run: a decode before its last step is not its output
            proj.new_run()
        if proj.space == "latent" and i >= len(sched.timesteps) - proj.steps and sigma > 0:
            model_output = proj.apply(model_output, sample, sigma)
        result = original(model_output, timestep, sample, *args, **kwargs)
        proj.armed = proj.space == "pixels" and last
        return result

    return step


def _projected_decode(proj: TrajectoryProjection, vae):
    """``vae.decode`` that projects the video decoded after the last step (``"pixels"``)."""
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

    return decode


def apply_trajectory_projection(pipe, config: TrajectoryProjectionConfig | None = None) -> TrajectoryProjection:
    """Project ``pipe``'s output onto the law: the clean estimate of its last ``steps`` denoising
    steps (``space="latent"``) or the video its VAE decodes after the last step
    (``space="pixels"``; ``steps`` 0 or 1); see the module docstring. Attaching again replaces the
    previous attachment."""
    config = config or TrajectoryProjectionConfig()
    _check_pipeline(pipe)
    vae, sched = pipe.vae, pipe.scheduler
    proj = TrajectoryProjection(vae, config.steps, config.law, float(config.strength), config.space,
                                config.check_domain)
    remove_trajectory_projection(pipe)
    wrap_method(sched, "step", _projected_step(proj, sched), proj._wrappers)
    if config.space == "pixels":
        wrap_method(vae, "decode", _projected_decode(proj, vae), proj._wrappers)
    set_attachment(pipe, ATTRIBUTE, proj)
    return proj


def attach_trajectory_projection(pipe, steps: int = 1, law: str = "gravity", strength: float = 1.0,
                                 space: str = "latent", check_domain: bool = True) -> TrajectoryProjection:
    """:func:`apply_trajectory_projection` with ``TrajectoryProjectionConfig(steps, law, strength, space,
    check_domain)``."""
    return apply_trajectory_projection(pipe, TrajectoryProjectionConfig(steps, law, float(strength), space,
                                                                         check_domain))


def remove_trajectory_projection(pipe) -> None:
    """Remove the projection; the pipeline is the base pipeline again."""
    proj = pop_attachment(pipe, ATTRIBUTE)
    if proj is not None:
        unwrap_methods(proj._wrappers)


#: the name the user API has always had
detach_trajectory_projection = remove_trajectory_projection
