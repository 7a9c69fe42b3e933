"""Each category's law on the moving object's **track** in a clean latent: inequalities the law
predicts for any of its parameters, hinged, so a lawful clip costs nothing and only a clip that
breaks the law is pushed, through ``dv``, toward it.

The field laws of :mod:`visionmoe.video.pila.law_residuals` read the latent's flow and contrast;
on the deficit world's simulator clips they score lawful projectiles worse than unlawful ones
(AUC 0.28) and barely separate sliding (0.63), and a clip frozen in time satisfies every one of them
(``scripts/probe_law_residuals.py``). Here the observable is the object itself: per latent frame
the centroid of what differs from the clip's per-cell temporal median (the static background),
in latent cells, +y down; its velocity and acceleration are finite differences over the latent
frames. The laws (y down; ``v``, ``a``: the centroid's velocity and acceleration):

========= =========================================================================================
category  law on the track, and the unlawful motion it penalises
========= =========================================================================================
rigid     gravity pulls down and supports only cancel it: ``a_y >= 0``; friction only takes speed:
          ``a_x v_x <= 0`` (gravity of the wrong sign, objects that drift up, sliding that speeds up)
elastic   a bounce returns less than it took: the object never rises above the highest point it
          reached before (restitution above 1: each bounce higher)
liquid    poured liquid falls: ``v_y >= 0`` (a stream that drifts up); the centroid of a stream,
          a flux of particles entering and leaving, does not follow any one particle's acceleration
gas       smoke and steam rise: ``v_y <= 0``
========= =========================================================================================

Thermal and optics have no track law (their observables are not an object's motion): zero.
"""

from __future__ import annotations

from typing import Dict

import torch

from .law_residuals import LawResiduals
from .taxonomy import CATEGORY_NAMES

__all__ = ["TRACK_LAWS", "category_track_residuals", "object_track"]

#: the track laws of each category (names of the residuals :func:`category_track_residuals` returns)
TRACK_LAWS: Dict[str, tuple] = {name: () for name in CATEGORY_NAMES}
TRACK_LAWS.update(rigid=("no_upward_acceleration", "friction_slows"), elastic=("no_rise_above_peak",),
                  liquid=("falls",), gas=("rises",))


def object_track(x0: torch.Tensor, power: float = 2.0) -> torch.Tensor:
    """[B, F - 1, 2] (x, y) centroid in latent cells of each frame's difference from the clip's
    per-cell temporal median (the background, detached), weighted by that difference's energy
    to ``power`` (the object, not the noise around it). Differentiable in ``x0``. The first
    latent frame is left out: a causal video VAE codes it alone, from one frame, and on the
    deficit world's clips its difference from the others does not sit on the object."""
    x = x0.float()[:, :, 1:]
    background = x.median(dim=2, keepdim=True).values.detach()
    energy = (x - background).pow(2).mean(1)  # [B, F, H, W]
    w = energy.pow(power)
    w = w / w.sum(dim=(2, 3), keepdim=True).clamp_min(1e-12)
    H, W = w.shape[-2:]
    ys = torch.arange(H, dtype=w.dtype, device=w.device)
    xs = torch.arange(W, dtype=w.dtype, device=w.device)
    return torch.stack([(w.sum(2) * xs).sum(-1), (w.sum(3) * ys).sum(-1)], -1)


def _residuals(track: torch.Tensor) -> Dict[str, torch.Tensor]:
    v = torch.diff(track, dim=1)  # [B, F-1, 2]
    a = torch.diff(v, dim=1)  # [B, F-2, 2]
    v_mid = 0.5 * (v[:, 1:] + v[:, :-1])  # the velocity at each acceleration's frame
    y = track[..., 1]
    highest_before = torch.cummin(y, dim=1).values[:, :-1].detach()
    return {
        "no_upward_acceleration": torch.relu(-a[..., 1]).pow(2).mean(1),
        "friction_slows": torch.relu(a[..., 0] * v_mid[..., 0]).mean(1),
        "no_rise_above_peak": torch.relu(highest_before - y[:, 1:]).pow(2).mean(1),
        "falls": torch.relu(-v[..., 1]).pow(2).mean(1),
        "rises": torch.relu(v[..., 1]).pow(2).mean(1),
    }


class TrackLawResiduals(LawResiduals):
    """The track laws' residuals, ``name -> [B]``, with each category's sum (:data:`TRACK_LAWS`)."""

    laws = TRACK_LAWS


def category_track_residuals(x0: torch.Tensor) -> TrackLawResiduals:
    """Every track law on the clean latent ``x0`` [B, C, F, H, W], ``[B]`` each. Needs 4 latent
    frames (the first is not tracked)."""
    if x0.dim() != 5 or x0.shape[2] < 4:
        raise ValueError(f"x0 must be a [B, C, F, H, W] latent with F >= 4, got shape {tuple(x0.shape)}")
    return TrackLawResiduals(_residuals(object_track(x0)))
