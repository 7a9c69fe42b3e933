"""Each category's law on what the correction produces: residuals of the **corrected** clean
estimate ``x0' = x_t - sigma (v + scale dv)``, differentiable through ``dv``.

The attribute bank's residuals (:meth:`visionmoe.video.pila.adapter.PILAOutput.residual_loss`)
are read from the slots' proxy heads, whose anchors come from the uncorrected estimate
``x_t - sigma v``: ``dv`` never enters them. Here the observables are measured on ``x0'`` itself
(:func:`observable_proxies`: its latent Lucas-Kanade flow, the flow's time derivative, its
contrast as density) and each category is held to its own laws (:data:`CATEGORY_LAWS`, from the
taxonomy: rigid bodies to one shared acceleration, zero strain rate and uniform gravity, liquids
to continuity and incompressibility, gas to advection and continuity, heat to diffusion...).

Every residual is the squared deviation of the observable from what the law predicts from the
same estimate (e.g. the best shared constant acceleration), hinged at a tolerance of the law
(``relu(R - tolerance)``, default 0): the reference is the law, never the training clip's own
residual, so a correction is pushed toward the law even where the data break it less or more.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional

import torch

from . import residuals as R
from .fields import latent_flow, temporal_derivative
from .taxonomy import CATEGORIES, CATEGORY_NAMES

__all__ = ["CATEGORY_LAWS", "LawResiduals", "category_law_residuals", "corrected_clean_latent", "observable_proxies"]

#: the laws of each category (names of :data:`visionmoe.video.pila.residuals.RESIDUALS`) that an
#: observable of the clean estimate can test ("kinematic" holds by construction on observables)
CATEGORY_LAWS: Dict[str, tuple] = {c.name: tuple(r for r in c.residuals if r != "kinematic") for c in CATEGORIES}


def corrected_clean_latent(x_t: torch.Tensor, velocity: torch.Tensor, dv: torch.Tensor, sigma, scale: float = 1.0):
    """``x_t - sigma (v + scale dv)`` (``sigma``: scalar or [B])."""
    s = torch.as_tensor(sigma, dtype=x_t.dtype, device=x_t.device).reshape(-1, *([1] * (x_t.dim() - 1)))
    return x_t - s * (velocity + scale * dv)


def observable_proxies(x0: torch.Tensor, kappa: float = 0.1) -> Dict[str, torch.Tensor]:
    """Proxy fields the residuals read, measured on a clean latent ``x0`` [B, C, F, H, W]
    (differentiable in ``x0``; the occupancy weight is not): ``velocity`` (latent flow, cells per
    latent frame), ``acceleration`` (its time derivative), ``density`` (contrast: RMS deviation
    from the frame's mean), ``temperature`` (the density, the quantity heat diffuses here),
    ``latent`` (``x0``), ``occupancy`` (density over its maximum, detached) and ``kappa``."""
    flow = latent_flow(x0.float())
    dev = x0.float() - x0.float().mean(dim=(3, 4), keepdim=True)
    density = dev.pow(2).mean(1, keepdim=True).add(1e-12).sqrt()
    occ = (density / density.flatten(1).amax(1).clamp_min(1e-6).view(-1, 1, 1, 1, 1)).detach()
    return {"velocity": flow, "acceleration": temporal_derivative(flow), "density": density, "temperature": density,
            "latent": x0.float(), "occupancy": occ, "kappa": kappa}


class LawResiduals(dict):
    """``name -> [B]`` residual of each law, plus :meth:`per_category` and :meth:`loss`."""

    laws: Mapping[str, tuple] = CATEGORY_LAWS  # category -> the names of its laws

    def per_category(self, tolerance: float = 0.0) -> torch.Tensor:
        """[B, num_categories]: the sum of each category's hinged laws."""
        any_r = next(iter(self.values()))
        out = any_r.new_zeros(any_r.shape[0], len(CATEGORY_NAMES))
        for k, name in enumerate(CATEGORY_NAMES):
            for law in self.laws[name]:
                if law in self:
                    out[:, k] = out[:, k] + torch.relu(self[law] - tolerance)
        return out

    def loss(self, weights: torch.Tensor, tolerance: float = 0.0) -> torch.Tensor:
        """Mean over the batch of the categories' hinged laws weighted by ``weights`` [B, K] (the
        routing mass per category, or the labels)."""
        if weights.dim() != 2 or weights.shape[1] != len(CATEGORY_NAMES):
            raise ValueError(f"weights must be [B, {len(CATEGORY_NAMES)}] (one per category), got {tuple(weights.shape)}")
        return (weights.to(self.per_category().dtype) * self.per_category(tolerance)).sum(1).mean()


def category_law_residuals(x0: torch.Tensor, laws: Optional[Mapping[str, tuple]] = None,
                           kappa: float = 0.1) -> LawResiduals:
    """Every law the categories use (``laws``: default :data:`CATEGORY_LAWS`) on the observables of
    ``x0`` (:func:`observable_proxies`), ``[B]`` each. Needs 3 latent frames and 3 cells per axis."""
    if x0.dim() != 5 or min(x0.shape[2:]) < 3:
        raise ValueError(f"x0 must be a [B, C, F, H, W] latent with F, H, W >= 3, got shape {tuple(x0.shape)}")
    proxies = observable_proxies(x0, kappa)
    names = sorted({r for rs in (laws or CATEGORY_LAWS).values() for r in rs})
    return LawResiduals(R.bank_residuals(proxies, names))
