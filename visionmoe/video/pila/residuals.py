"""Operational residuals of physical relations on attribute-bank proxy fields.

Pure functions. Every field is a tensor ``[B, C, F, H, W]`` sampled on the latent token grid
(unit spacing in frames and cells; image axes: x = width, y = height, pointing down).
Vector fields have ``C = 2`` with components ``(x, y)``. Derivatives are second-order central
differences evaluated on the interior (one sample trimmed at each border of the axes a
residual differentiates), so a residual is exactly zero on fields up to quadratic order that
obey the law, and a quantitative measure of violation otherwise.

Each residual returns the (optionally weighted) mean squared residual, ``reduction="mean"``
(a scalar) or ``"none"`` (per sample, ``[B]``). ``weight`` is an optional ``[B, 1, F, H, W]``
non-negative occupancy (e.g. the density proxy), cropped like the residual.

These are the training regularisers of the experts' refinements (and can score videos):
``trajectory`` (one shared constant acceleration of the tracked object: gravity between
contacts), ``kinematic`` (a = dv/dt; zero by construction on the observable anchors, whose
acceleration is the time derivative of their velocity, so no category uses it any more), ``advection`` (dq/dt + u.grad q = 0), ``continuity``
(d rho/dt + div(rho u) = 0), ``incompressibility`` (div u = 0), ``rigidity`` (zero strain
rate), ``gravity`` (spatially and temporally constant acceleration, optionally equal to g),
``heat`` (dT/dt = kappa lap T).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

__all__ = [
    "RESIDUALS",
    "advection",
    "bank_residuals",
    "continuity",
    "ddt",
    "ddx",
    "ddy",
    "gravity",
    "heat",
    "incompressibility",
    "kinematic",
    "laplacian",
    "rigidity",
    "strain_rate",
    "trajectory",
]


def _check(name: str, t: torch.Tensor, channels: int | None = None) -> None:
    if t.dim() != 5:
        raise ValueError(f"{name} must be a [B, C, F, H, W] field, got shape {tuple(t.shape)}")
    if channels is not None and t.shape[1] != channels:
        raise ValueError(f"{name} must have {channels} channels, got shape {tuple(t.shape)}")


# Central differences on the full interior: output [B, C, F-2, H-2, W-2].
def ddt(f: torch.Tensor) -> torch.Tensor:
    return 0.5 * (f[:, :, 2:, 1:-1, 1:-1] - f[:, :, :-2, 1:-1, 1:-1])


def ddy(f: torch.Tensor) -> torch.Tensor:
    return 0.5 * (f[:, :, 1:-1, 2:, 1:-1] - f[:, :, 1:-1, :-2, 1:-1])


def ddx(f: torch.Tensor) -> torch.Tensor:
    return 0.5 * (f[:, :, 1:-1, 1:-1, 2:] - f[:, :, 1:-1, 1:-1, :-2])


def laplacian(f: torch.Tensor) -> torch.Tensor:
    c = f[:, :, 1:-1, 1:-1, 1:-1]
    return (
        f[:, :, 1:-1, 2:, 1:-1] + f[:, :, 1:-1, :-2, 1:-1] + f[:, :, 1:-1, 1:-1, 2:] + f[:, :, 1:-1, 1:-1, :-2] - 4 * c
    )


def _interior(f: torch.Tensor) -> torch.Tensor:
    return f[:, :, 1:-1, 1:-1, 1:-1]


def _reduce(res: torch.Tensor, weight: torch.Tensor | None, reduction: str) -> torch.Tensor:
    """Weighted mean of res**2 over all but the batch axis."""
    sq = res.pow(2)
    if weight is None:
        per = sq.flatten(1).mean(1)
    else:
        w = _interior(weight) if weight.shape[2:] != res.shape[2:] else weight
        w = w.expand_as(sq)
        per = (sq * w).flatten(1).sum(1) / w.flatten(1).sum(1).clamp_min(1e-12)
    if reduction == "none":
        return per
    if reduction == "mean":
        return per.mean()
    raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


def _need_frames(name: str, f: torch.Tensor) -> None:
    if min(f.shape[2:]) < 3:
        raise ValueError(f"{name} needs at least 3 samples along F, H and W, got shape {tuple(f.shape)}")


def kinematic(velocity, acceleration, weight=None, reduction="mean"):
    """Kinematic consistency: a - dv/dt."""
    _check("velocity", velocity, 2)
    _check("acceleration", acceleration, 2)
    _need_frames("kinematic", velocity)
    return _reduce(_interior(acceleration) - ddt(velocity), weight, reduction)


def advection(q, velocity, weight=None, reduction="mean"):
    """Latent (brightness) advection: dq/dt + u dq/dx + w dq/dy, for any number of channels of q."""
    _check("q", q)
    _check("velocity", velocity, 2)
    _need_frames("advection", q)
    u, w = _interior(velocity[:, :1]), _interior(velocity[:, 1:2])
    return _reduce(ddt(q) + u * ddx(q) + w * ddy(q), weight, reduction)


def continuity(density, velocity, weight=None, reduction="mean"):
    """Mass conservation: d rho/dt + div(rho u)."""
    _check("density", density, 1)
    _check("velocity", velocity, 2)
    _need_frames("continuity", density)
    flux = density * velocity
    return _reduce(ddt(density) + ddx(flux[:, :1]) + ddy(flux[:, 1:2]), weight, reduction)


def incompressibility(velocity, weight=None, reduction="mean"):
    """Divergence-free velocity: du/dx + dw/dy."""
    _check("velocity", velocity, 2)
    _need_frames("incompressibility", velocity)
    return _reduce(ddx(velocity[:, :1]) + ddy(velocity[:, 1:2]), weight, reduction)


def strain_rate(velocity: torch.Tensor) -> torch.Tensor:
    """Symmetric velocity gradient (e_xx, e_yy, e_xy): [B, 3, F-2, H-2, W-2]."""
    _check("velocity", velocity, 2)
    u, w = velocity[:, :1], velocity[:, 1:2]
    return torch.cat([ddx(u), ddy(w), 0.5 * (ddy(u) + ddx(w))], dim=1)


def rigidity(velocity, weight=None, reduction="mean"):
    """Rigid motion (translation + rotation) has zero strain rate."""
    _need_frames("rigidity", velocity)
    return _reduce(strain_rate(velocity), weight, reduction)


def gravity(acceleration, weight=None, reduction="mean", g: torch.Tensor | None = None):
    """Constant gravity: the acceleration field is one constant vector (equal to ``g`` if given).

    Residual = a - mean(a) (weighted mean over frames and cells), plus mean(a) - g when ``g``
    (a [2] or [B, 2] tensor, cells per frame^2) is given.
    """
    _check("acceleration", acceleration, 2)
    a = acceleration
    if weight is None:
        mean = a.flatten(2).mean(2)
    else:
        w = weight.expand_as(a)
        mean = (a * w).flatten(2).sum(2) / w.flatten(2).sum(2).clamp_min(1e-12)
    res = a - mean[:, :, None, None, None]
    if g is not None:
        g = torch.as_tensor(g, dtype=a.dtype, device=a.device).reshape(-1, 2)
        res = res + (mean - g)[:, :, None, None, None]
    return _reduce(res, weight, reduction)


def trajectory(velocity, weight=None, reduction="mean", drop_last: bool = True):
    """Shared constant acceleration of the tracked object (gravity, no contact): a law a motion
    field can violate, unlike ``a = dv/dt`` between two fields derived from each other.

    The object's velocity per frame is the occupancy-weighted mean of the flow field
    ``u(t) = sum w u / sum w`` (``weight``: ``[B, 1, F, H, W]``, uniform if None); its
    acceleration ``a(t) = u(t+1) - u(t)``; the residual is ``a(t) - mean_t a``. With
    ``drop_last`` the last frame is ignored (:func:`visionmoe.video.pila.fields.latent_flow` repeats
    the previous motion there). Needs 3 usable frames; returns zeros otherwise.
    """
    _check("velocity", velocity, 2)
    u = velocity[:, :, :-1] if drop_last and velocity.shape[2] > 1 else velocity
    w = torch.ones_like(u[:, :1]) if weight is None else weight[:, :, : u.shape[2]].expand_as(u[:, :1])
    mean_u = (u * w).flatten(3).sum(3) / w.flatten(3).sum(3).clamp_min(1e-12)  # [B, 2, F']
    if mean_u.shape[2] < 3:
        per = velocity.new_zeros(velocity.shape[0])
        return per if reduction == "none" else per.mean()
    a = torch.diff(mean_u, dim=2)
    res = a - a.mean(2, keepdim=True)
    per = res.pow(2).flatten(1).mean(1)
    if reduction == "none":
        return per
    if reduction == "mean":
        return per.mean()
    raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")


def heat(temperature, kappa=0.1, weight=None, reduction="mean"):
    """Heat diffusion: dT/dt - kappa lap T (kappa: float or [B] tensor, cells^2 per frame)."""
    _check("temperature", temperature, 1)
    _need_frames("heat", temperature)
    k = torch.as_tensor(kappa, dtype=temperature.dtype, device=temperature.device).reshape(-1, 1, 1, 1, 1)
    return _reduce(ddt(temperature) - k * laplacian(temperature), weight, reduction)


#: Residuals over a bank's proxy fields (names as in taxonomy.SLOTS, plus "latent": the
#: clean-latent estimate at token resolution). Each entry: proxies -> [B] residual.
RESIDUALS: dict[str, Callable[[Mapping[str, torch.Tensor]], torch.Tensor]] = {
    "kinematic": lambda p: kinematic(p["velocity"], p["acceleration"], p.get("occupancy"), "none"),
    "trajectory": lambda p: trajectory(p["velocity"], p.get("occupancy"), "none"),
    "advection": lambda p: advection(p["latent"], p["velocity"], p.get("occupancy"), "none"),
    "continuity": lambda p: continuity(p["density"], p["velocity"], None, "none"),
    "incompressibility": lambda p: incompressibility(p["velocity"], p.get("occupancy"), "none"),
    "rigidity": lambda p: rigidity(p["velocity"], p.get("occupancy"), "none"),
    "gravity": lambda p: gravity(p["acceleration"], p.get("occupancy"), "none"),
    "heat": lambda p: heat(p["temperature"], p.get("kappa", 0.1), None, "none"),
}


def bank_residuals(proxies: Mapping[str, torch.Tensor], names=None) -> dict[str, torch.Tensor]:
    """Evaluate the named residuals (default: all) on a proxy dict; fields too short are skipped."""
    out = {}
    for name in names or RESIDUALS:
        f = proxies.get("velocity")
        if f is not None and min(f.shape[2:]) < 3:
            continue
        out[name] = RESIDUALS[name](proxies)
    return out
