"""Inference-time trajectory-law guidance for diffusers Wan pipelines.

A law the generated motion can violate, enforced where it is measured: at each denoising step
whose noise level ``sigma`` is above ``min_sigma``, the clean-video estimate
``x0 = x_t - sigma * v`` (``v``: the transformer's conditional velocity, after any other hook
such as PILA) is decoded by the pipeline's VAE, the moving object is soft-tracked (the
centroid of the pixels that deviate from the clip's temporal median by more than half of the
frame's largest deviation, weighted by the excess), and the track's **law residual** is the
squared error of piecewise parabolas with one shared vertical acceleration per clip (cut at
bounces, as :func:`.metrics.gravity_fit` cuts them) and of piecewise straight lines
horizontally (no horizontal force). The guidance moves ``x0`` down the residual's gradient
``g``: ``dv = strength * rms(v) * g / rms(g)`` (``v' = v + dv`` means ``x0' = x0 - sigma dv``;
``strength`` is the step's size relative to the velocity). The conditional call of a step
computes ``dv``; the unconditional call of the same step reuses it, so with classifier-free
guidance ``v_cfg' = v_cfg + dv``.

Measured on the toy world (``MODEL_CARD.md``): strength 0.05 with ``min_sigma`` 0.4 was chosen
on noise seeds 660000+ and then scored once on held-out seeds. Cost: one VAE decode and its
backward per guided step (about 8 s for 8 toy-world clips on two CPU cores).

``attach_trajectory_guidance(pipe, strength, min_sigma)``; ``detach_trajectory_guidance(pipe)``
restores the pipeline exactly; ``strength=0`` never runs the VAE and changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from diffusers.hooks import HookRegistry, ModelHook

from .metrics import bounce_segments

logger = logging.getLogger(__name__)

HOOK_NAME = "trajectory_guidance"
_TRANSFORMERS = ("transformer", "transformer_2")

__all__ = ["TrajectoryGuidance", "attach_trajectory_guidance", "detach_trajectory_guidance", "law_residual",
           "soft_track"]


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


@dataclass
class TrajectoryGuidance:
    """The settings and state of one attachment (see the module docstring)."""

    vae: torch.nn.Module
    strength: float = 0.05
    min_sigma: float = 0.4
    num_train_timesteps: int = 1000
    calls: int = 0  # guided steps computed (for tests and logging)
    last_residual: float | None = None

    def __post_init__(self):
        if not (np.isfinite(self.strength) and self.strength >= 0):
            raise ValueError(f"strength must be a finite number >= 0, got {self.strength!r}")
        if not 0.0 <= self.min_sigma <= 1.0:
            raise ValueError(f"min_sigma must lie in [0, 1], got {self.min_sigma!r}")
        cfg = self.vae.config
        self._mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1)
        self._std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1)
        self._key = None
        self._dv = None

    def correction(self, x_t: torch.Tensor, v: torch.Tensor, sigma: float) -> torch.Tensor:
        """``dv`` for latents ``x_t`` and velocity ``v`` at noise level ``sigma``."""
        mean, std = self._mean.to(x_t.device), self._std.to(x_t.device)
        x0 = (x_t - sigma * v).detach().float().requires_grad_(True)
        with torch.enable_grad():
            frames = self.vae.decode((x0 * std + mean).to(self.vae.dtype), return_dict=False)[0]
            y, x = soft_track(frames.float().clamp(-1, 1))
            loss = law_residual(y, x)
            if not loss.requires_grad:  # no trackable motion in any clip
                return torch.zeros_like(v)
            (g,) = torch.autograd.grad(loss, x0)
        self.calls += 1
        self.last_residual = float(loss)
        logger.debug("trajectory guidance at sigma %.3f: law residual %.4g", sigma, self.last_residual)
        rms_v = v.float().pow(2).mean().sqrt()
        return (self.strength * rms_v * g / (g.pow(2).mean().sqrt() + 1e-12)).to(v.dtype)

    def apply(self, x_t: torch.Tensor, timestep, v: torch.Tensor) -> torch.Tensor:
        sigma = float(torch.as_tensor(timestep).reshape(-1)[0]) / self.num_train_timesteps
        if self.strength == 0 or not sigma > self.min_sigma:
            return v
        if x_t.shape[1] != v.shape[1]:  # image-to-video: the input is cat([latents, condition])
            x_t = x_t[:, : v.shape[1]]
        key = (sigma, tuple(x_t.shape))
        cached = self._key
        if cached is None or cached[0] != key or not torch.equal(cached[1], x_t):
            # the conditional call of a step computes; the unconditional one reuses it
            self._key, self._dv = (key, x_t.detach().clone()), self.correction(x_t, v, sigma)
        return v + self._dv


class _Hook(ModelHook):
    def __init__(self, guidance: TrajectoryGuidance):
        super().__init__()
        self.guidance = guidance
        self._inputs = None

    def pre_forward(self, module, *args, **kwargs):
        names = ("hidden_states", "timestep")
        self._inputs = tuple(kwargs.get(n, args[i] if len(args) > i else None) for i, n in enumerate(names))
        return args, kwargs

    def post_forward(self, module, output):
        hidden_states, timestep = self._inputs
        self._inputs = None
        v = output[0] if isinstance(output, tuple) else output.sample
        v2 = self.guidance.apply(hidden_states, timestep, v)
        if v2 is v:
            return output
        if isinstance(output, tuple):
            return (v2, *output[1:])
        output.sample = v2
        return output


def attach_trajectory_guidance(pipe, strength: float = 0.05, min_sigma: float = 0.4) -> TrajectoryGuidance:
    """Guide ``pipe`` (a diffusers Wan pipeline with a ``vae``) toward the trajectory law; see
    the module docstring. Attaching again replaces the previous attachment."""
    vae = getattr(pipe, "vae", None)
    if vae is None or not hasattr(vae.config, "latents_mean"):
        raise ValueError(f"{type(pipe).__name__} has no Wan VAE (vae.config.latents_mean): trajectory guidance "
                         "decodes the clean-latent estimate")
    models = [getattr(pipe, n, None) for n in _TRANSFORMERS]
    models = [m for m in models if m is not None]
    if not models:
        raise ValueError(f"{type(pipe).__name__} has no `transformer` or `transformer_2`")
    detach_trajectory_guidance(pipe)
    sched = getattr(pipe, "scheduler", None)
    ntt = int(getattr(getattr(sched, "config", None), "num_train_timesteps", 1000) or 1000)
    guidance = TrajectoryGuidance(vae, float(strength), float(min_sigma), ntt)
    for model in models:
        HookRegistry.check_if_exists_or_initialize(model).register_hook(_Hook(guidance), HOOK_NAME)
    pipe._trajectory_guidance = guidance
    return guidance


def detach_trajectory_guidance(pipe) -> None:
    """Remove the guidance; the pipeline is the base pipeline again."""
    for name in _TRANSFORMERS:
        model = getattr(pipe, name, None)
        registry = getattr(model, "_diffusers_hook", None) if model is not None else None
        if registry is not None and registry.get_hook(HOOK_NAME) is not None:
            registry.remove_hook(HOOK_NAME, recurse=False)
    if hasattr(pipe, "_trajectory_guidance"):
        del pipe._trajectory_guidance
