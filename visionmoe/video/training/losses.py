"""The loss terms of the three PILA training stages (:func:`stage_losses`): kinematic anchors,
category routing, residual regularisers, the flow-matching loss through the frozen backbone,
its motion and trajectory-law terms, and the sampler rollouts of stage 3 (:func:`rollout`)."""

from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ..pila.law_residuals import category_law_residuals, corrected_clean_latent
from ..pila.track_laws import category_track_residuals
from .backbone import backbone_velocity
from .config import TrainConfig
from .sampling import _shift, sample_sigmas

__all__ = ["anchor_loss", "category_loss", "law_loss", "motion_loss", "physics_loss", "rollout", "stage_losses",
           "trajectory_residual"]


def _pool_anchor(adapter, x0: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Anchors of the clean latent on the adapter's token grid (as in FieldEstimator.forward)."""
    p = adapter.config.patch_size
    H, W = x0.shape[-2:]
    ph, pw = (-H) % p, (-W) % p
    if ph or pw:
        x0 = F.pad(x0, (0, pw, 0, ph), mode="replicate")
    with torch.no_grad():
        anchors = adapter.fields.anchors(x0)
    pool = lambda f: F.avg_pool3d(f, (1, p, p))  # noqa: E731
    return {k: pool(v) / (p if k in ("velocity", "acceleration") else 1) for k, v in anchors.items()}


def anchor_loss(proxies: Dict[str, torch.Tensor], target: Dict[str, torch.Tensor]) -> torch.Tensor:
    """Kinematic-anchor loss: proxies' velocity, acceleration, density vs the clean latent's anchors."""
    return sum(F.mse_loss(proxies[k].float(), target[k].float()) for k in ("velocity", "acceleration", "density"))


def motion_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared first and second time differences of ``pred - target`` (B, C, T, H, W).

    Zero for an error that is constant over time; with fewer than 3 latent frames only the
    first difference (or nothing) is defined.
    """
    err = (pred - target).float()
    loss = err.new_zeros(())
    for order in (1, 2):
        if err.shape[2] <= order:
            break
        loss = loss + torch.diff(err, n=order, dim=2).pow(2).mean()
    return loss


def trajectory_residual(x0: torch.Tensor) -> torch.Tensor:
    """[B] the trajectory law (one shared constant acceleration of the object, residuals.trajectory)
    on the observable motion of a clean latent: its latent Lucas-Kanade flow weighted by its
    contrast (occupancy). Differentiable in ``x0``."""
    from ..pila import residuals as R
    from ..pila.fields import latent_flow

    flow = latent_flow(x0.float())
    dev = x0 - x0.mean(dim=(3, 4), keepdim=True)
    occ = dev.pow(2).mean(1, keepdim=True).sqrt().detach()
    return R.trajectory(flow, occ, "none")


def physics_loss(x_t, pred, v_base, x0, sigma) -> tuple:
    """Stage-3 physics through ``dv``: the trajectory law on the *corrected* clean-latent
    estimate ``x_t - sigma (v + s dv)``, as a hinge against the real clip's own residual (bounces
    break the law in real clips too): ``mean(relu(R(x0_corrected) - R(x0)))``. Also returns
    (no gradient) the base's ``R(x_t - sigma v)`` and the data's ``R(x0)`` for the logs."""
    s = sigma.view(-1, 1, 1, 1, 1)
    r = trajectory_residual(x_t - s * pred)
    with torch.no_grad():
        r_data = trajectory_residual(x0)
        r_base = trajectory_residual(x_t - s * v_base)
    return F.relu(r - r_data).mean(), r_base.mean(), r_data.mean()


LAW_KINDS = {"field": category_law_residuals, "track": category_track_residuals}


def law_loss(x_t, pred, sigma, labels, tolerance: float = 0.0, shift: int = 0, kind: str = "field") -> torch.Tensor:
    """Each labelled category's own laws (:mod:`visionmoe.video.pila.law_residuals`) on the
    corrected clean-latent estimate ``x_t - sigma pred`` (``pred = v + s dv``), hinged at
    ``tolerance``: differentiable through ``dv``, with the law, not the clip, as the reference.
    Weighted by the labels, never by the routing mass, which the router could steer toward the
    category whose law is easiest to meet. ``shift`` (a control, ``TrainConfig.law_shift``)
    holds each label to the laws of the category ``shift`` places on in the taxonomy. ``kind``:
    the field laws (:mod:`~visionmoe.video.pila.law_residuals`) or the track laws
    (:mod:`~visionmoe.video.pila.track_laws`)."""
    x0c = corrected_clean_latent(x_t, pred, torch.zeros_like(pred), sigma)
    return LAW_KINDS[kind](x0c).loss(torch.roll(labels.float(), shift, dims=1), tolerance)


def category_loss(mass: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy between the labels (normalised multi-hot) and the routing mass per category."""
    q = labels / labels.sum(-1, keepdim=True).clamp_min(1e-6)
    m = mass / mass.sum(-1, keepdim=True).clamp_min(1e-6)
    return -(q * torch.log(m.clamp_min(1e-6))).sum(-1).mean()


def rollout(adapter_fn, adapter, pipe, x0, eps, sigma, text, uncond, mask, cfg: TrainConfig) -> torch.Tensor:
    """The state at ``sigma`` that ``cfg.rollout_steps`` guided Euler steps of backbone + adapter
    reach from ``x0`` noised ``rollout_steps`` inference steps higher (see the module doc)."""
    k, s, g = cfg.rollout_steps, cfg.rollout_shift, cfg.rollout_guidance
    u = sigma / (s - (s - 1) * sigma)  # the shift's inverse
    u_hi = (u + k * cfg.rollout_du).clamp(max=1.0)
    sig = [_shift(u_hi + (u - u_hi) * j / k, s) for j in range(k)] + [sigma]
    view = lambda t: t.view(-1, 1, 1, 1, 1)  # noqa: E731
    x = (1 - view(sig[0])) * x0 + view(sig[0]) * eps
    with torch.no_grad():
        for j in range(k):
            v_c = backbone_velocity(pipe, x, sig[j], text).float()
            v = v_c
            dv = adapter_fn(x, v_c, sig[j], encoder_hidden_states=text if adapter.text_classifier is not None else None,
                            category_mask=mask, compute_residuals=False).dv.float()
            if g != 1.0:
                u_text = uncond.expand(len(x), -1, -1)
                v_u = backbone_velocity(pipe, x, sig[j], u_text).float()
                v = v_u + g * (v_c - v_u)
                if cfg.apply_to == "each_branch":  # dv_u + g (dv_c - dv_u), as attach applies it
                    dv_u = adapter_fn(x, v_u, sig[j], encoder_hidden_states=u_text if adapter.text_classifier is not None
                                      else None, category_mask=torch.ones_like(mask), compute_residuals=False).dv.float()
                    dv = dv_u + g * (dv - dv_u)
            x = x + view(sig[j + 1] - sig[j]) * (v + cfg.pila_scale * dv)
    return x


def stage_losses(adapter_fn, adapter, pipe, batch: Dict, cfg: TrainConfig, gen: torch.Generator,
                 device: torch.device, uncond: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
    """All loss terms of one micro-batch for ``cfg.stage``; ``total`` is the weighted sum.

    ``uncond``: the empty prompt's embedding (1, L, D), for rollouts with guidance."""
    x0 = batch["latents"].to(device, torch.float32)
    text = batch["text"].to(device)
    labels = batch["labels"].to(device)
    B = x0.shape[0]
    eps = torch.randn(x0.shape, generator=gen).to(device)
    sigma = sample_sigmas(torch.rand(B, generator=gen), cfg).to(device)
    use_mask = (torch.rand(B, generator=gen) < cfg.label_mask_prob).to(device)
    s = sigma.view(B, 1, 1, 1, 1)
    x_t = (1 - s) * x0 + s * eps
    target = _pool_anchor(adapter, x0) if cfg.stage < 3 else None  # anchor targets (stages 1, 2)
    mask = torch.where(use_mask[:, None], labels > 0, torch.ones_like(labels, dtype=torch.bool))
    mask = mask | ~mask.any(-1, keepdim=True)  # never an empty prior
    flow_target = eps - x0
    if cfg.stage == 3 and cfg.apply_to == "each_branch" and cfg.uncond_prob > 0:
        drop = (torch.rand(B, generator=gen) < cfg.uncond_prob).to(device)
        if bool(drop.any()):
            if uncond is None:
                raise ValueError("apply_to='each_branch' with uncond_prob > 0 needs the empty prompt's embedding (uncond)")
            text = torch.where(drop.view(B, 1, 1), uncond.to(text.dtype).expand(B, -1, -1), text)
            mask = mask | drop[:, None]  # the empty prompt carries no category prior
    if cfg.stage == 3 and cfg.rollout_steps > 0:
        roll = (torch.rand(B, generator=gen) < cfg.rollout_prob).to(device)
        if bool(roll.any()):
            if cfg.rollout_guidance != 1.0 and uncond is None:
                raise ValueError("rollouts with guidance need the empty prompt's embedding (uncond)")
            x_r = rollout(adapter_fn, adapter, pipe, x0[roll], eps[roll], sigma[roll], text[roll], uncond, mask[roll], cfg)
            x_t[roll] = x_r  # both are fresh tensors of this batch: written in place
            flow_target[roll] = (x_r - x0[roll]) / s[roll]
    v = backbone_velocity(pipe, x_t, sigma, text).float()
    v_applied = v  # the velocity the pipeline adds the correction to (see attach: v_cfg + s dv)
    if cfg.stage == 3 and cfg.flow_guidance != 1.0:
        if uncond is None:
            raise ValueError("flow_guidance != 1 needs the empty prompt's embedding (uncond)")
        v_u = backbone_velocity(pipe, x_t, sigma, uncond.expand(B, -1, -1)).float()
        v_applied = v_u + cfg.flow_guidance * (v - v_u)
    out = adapter_fn(x_t, v, sigma, encoder_hidden_states=text if adapter.text_classifier is not None else None,
                     category_mask=mask, compute_residuals=cfg.stage > 1)
    L: Dict[str, torch.Tensor] = {}
    if cfg.stage == 1:
        bank = out.bank.proxies
        L["anchor"] = anchor_loss(bank, target)
        from ..pila import residuals as R

        if cfg.w_kinematic > 0 and min(bank["velocity"].shape[2:]) >= 3:
            L["kinematic"] = R.kinematic(bank["velocity"], bank["acceleration"], bank["occupancy"])
        total = cfg.w_anchor * L["anchor"] + cfg.w_kinematic * L.get("kinematic", 0.0)
    else:
        L["balance"] = out.aux_loss
        L["z"] = out.z_loss
        L["residual"] = out.residual_loss()
        total = cfg.w_balance * L["balance"] + cfg.w_z * L["z"] + cfg.w_residual * L["residual"]
        if cfg.stage == 2:
            L["category"] = category_loss(out.experts.category_mass, labels)
            L["anchor"] = anchor_loss(out.refined_proxies, target)
            total = total + cfg.w_category * L["category"] + cfg.w_anchor * 0.1 * L["anchor"]
            if out.category_logits is not None:
                L["classifier"] = F.binary_cross_entropy_with_logits(out.category_logits.float(), labels)
                total = total + cfg.w_classifier * L["classifier"]
        else:
            pred = v_applied + cfg.pila_scale * out.dv.float()
            L["flow"] = F.mse_loss(pred, flow_target)
            if cfg.w_physics > 0:
                L["physics"], L["physics_base"], L["physics_data"] = physics_loss(x_t, pred, v_applied, x0, sigma)
                total = total + cfg.w_physics * L["physics"]
            if cfg.w_law > 0:
                L["law"] = law_loss(x_t, pred, sigma, labels, cfg.law_tolerance, cfg.law_shift, cfg.law_kind)
                total = total + cfg.w_law * L["law"]
            if cfg.w_motion > 0:
                L["motion"] = motion_loss(pred, flow_target)
                total = total + cfg.w_motion * L["motion"]
            with torch.no_grad():
                L["flow_base"] = F.mse_loss(v_applied, flow_target)  # the frozen model alone (reference)
            total = total + cfg.w_flow * L["flow"]
    L["total"] = total
    return L
