"""Staged training of the PILA adapter on a frozen Wan backbone, on ``accelerate``.

Stages (``TrainConfig.stage``); each run trains one stage, starting from the adapter of the
previous one (``init_adapter``) or from scratch:

1. **Field estimation** (trains ``adapter.fields``). A cached clean latent ``x0`` is noised
   to ``x_t = (1 - sigma) x0 + sigma * eps``; the frozen backbone gives ``v``; the field
   estimator sees ``(x_t, v, sigma)`` only. Kinematic-anchor losses: its velocity,
   acceleration and density proxies must match the anchors measured on the *clean* latent
   (latent Lucas-Kanade flow, its time derivative, latent contrast), plus the kinematic
   residual ``a = dv/dt`` on its proxies.
2. **Experts and router** (trains ``adapter.experts``, the learned text-embedding category
   classifier and its router bias, and the heat diffusivity). Category labels supervise the
   routing mass per category (cross-entropy) and the text classifier (binary cross-entropy);
   the Switch load-balance loss and the router z-loss keep routing healthy; the
   category-weighted operational residuals regularise the refined proxies, and an anchor
   term keeps them near the observable motion. The routing is masked by the labels for a
   fraction ``label_mask_prob`` of the samples (label-prior masked routing) and left free
   otherwise, so the router also learns the categories from the latents.
3. **Joint** (trains the whole adapter). The flow-matching loss through the frozen
   backbone: ``|| v + scale * dv - (eps - x0) ||^2``, with the backbone's velocity ``v``
   and the adapter's correction ``dv``, plus the residual regularisers and router losses.
   ``w_motion`` adds the same error's first and second differences along time (a velocity
   error that changes from one latent frame to the next is a wrong motion, one that is
   constant over time a wrong appearance): it weights the flow loss towards motion.
   ``rollout_steps = k > 0`` trains on the sampler's own states (exposure bias): for a
   fraction ``rollout_prob`` of the samples, ``x0`` is noised at a level ``k`` inference steps
   above ``sigma`` (steps uniform before the inference shift ``rollout_shift``, ``du`` apart)
   and brought down to ``sigma`` by ``k`` Euler steps of the frozen backbone with guidance
   ``rollout_guidance`` plus the current adapter (no gradient), as the pipeline would. The
   target there is the straight path from the reached state to ``x0``: ``(x_t - x0) / sigma``
   (``eps - x0`` on the noising path itself).
   ``apply_to`` says where the pipeline will add the correction (:mod:`.attach`):
   ``"guided"`` (to the guided velocity ``v_u + g (v_c - v_u)``, ``g = flow_guidance``) or
   ``"each_branch"`` (to every transformer call: the conditional velocity here, with the
   prompt replaced by the empty one and the category prior lifted for a share
   ``uncond_prob`` of the samples, as the base model was trained for guidance). The trained
   adapter's config records it.

The backbone (transformer(s), VAE, text encoder) is frozen: ``requires_grad_(False)``,
``eval()``, never passed to the optimiser, run under ``torch.no_grad()``. Data comes from
the latent cache of :mod:`visionmoe.video.data` (built on the main process on first use).

Batches, noise and sigmas are pure functions of ``(seed, micro-step, process index)``, so
a run resumed from a checkpoint (``accelerator.save_state``: adapter, optimiser, LR
schedule, grad scaler) continues exactly where it stopped, and ``accelerate launch
--num_processes N`` shards each global batch across processes.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

STAGES = (1, 2, 3)
_SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_ADAPTER_KEYS = {"patch_size", "hidden_dim", "slot_dim", "expert_hidden", "experts_per_category", "top_k",
                 "flow_window", "flow_reg", "kappa", "structure", "anchor", "single_expert", "plain_blocks"}


@dataclass
class TrainConfig:
    """Training configuration (also readable from YAML, see :meth:`from_yaml`).

    Data: ``data`` is a JSONL manifest or a folder of captioned videos; it is encoded once
    into ``cache_dir`` (default ``<output_dir>/cache``). With ``data`` unset, an existing
    ``cache_dir`` is used as is.
    Model: ``model`` is ``"tiny"`` / ``"tiny-2.2"`` (the embedded offline tiny Wan 2.1 / 2.2)
    or a local path / hub id of a diffusers Wan checkpoint.
    """

    stage: int = 1
    output_dir: str = "pila-out"
    data: Optional[str] = None
    cache_dir: Optional[str] = None
    model: str = "tiny"
    init_adapter: Optional[str] = None
    adapter: Dict[str, Any] = field(default_factory=lambda: {"hidden_dim": 64, "slot_dim": 16, "expert_hidden": 64})
    # video / text
    num_frames: int = 17
    height: int = 64
    width: int = 64
    max_sequence_length: int = 512  # WanPipeline pads prompts to 512 tokens: train as inference runs
    # optimisation
    max_steps: int = 1000
    batch_size: int = 4
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    mixed_precision: str = "no"  # frozen backbone in "bf16" / "fp16" (CUDA) / float32 ("no"); the adapter trains in float32
    cpu: bool = False  # force CPU (also automatic for several processes on a machine without CUDA)
    seed: int = 0
    # noise levels: sigma = shift * u / (1 + (shift - 1) * u), u ~ U(0, 1) or logit-normal
    sigma_sampling: str = "uniform"  # "uniform" or "logit_normal"
    sigma_shift: float = 3.0
    pila_scale: float = 1.0
    label_mask_prob: float = 0.5
    # loss weights
    w_anchor: float = 1.0
    w_kinematic: float = 0.0  # stage 1: a = dv/dt on the proxies (zero on the anchors by construction; off)
    w_category: float = 1.0
    w_classifier: float = 1.0
    w_balance: float = 0.01
    w_z: float = 0.001
    w_residual: float = 0.1
    w_flow: float = 1.0
    w_motion: float = 0.0  # stage 3: temporal 1st/2nd differences of the flow error (see module doc)
    w_physics: float = 1.0  # stage 3: trajectory law on the corrected clean-latent estimate, through dv
    # stage 3: the velocity the correction is added to, as the pipeline applies it:
    # v_u + g (v_c - v_u) with g = flow_guidance (1 = the conditional velocity only)
    flow_guidance: float = 1.0
    # stage 3: "guided" (one dv added to the guided velocity) or "each_branch" (the adapter
    # corrects each transformer call; trained on the conditional velocity, see the module doc)
    apply_to: str = "guided"
    uncond_prob: float = 0.1  # each_branch: share of samples trained with the empty prompt
    # stage 3: train on states reached by the sampler (see module doc); 0 steps = off
    rollout_steps: int = 0
    rollout_prob: float = 1.0
    rollout_du: float = 0.05  # one inference step before the shift (1 / num_inference_steps)
    rollout_shift: float = 3.0  # the inference scheduler's flow_shift
    rollout_guidance: float = 3.0  # the inference guidance scale (1 = conditional only)
    # bookkeeping
    checkpoint_every: int = 500
    checkpoints_total_limit: Optional[int] = 3
    resume: Optional[str] = "auto"  # "auto" (latest in output_dir), a checkpoint dir, or None
    log_every: int = 10
    report_to: str = "none"  # "none", "tensorboard", "wandb", ... (accelerate trackers)
    num_workers: int = 0
    cache_batch_size: int = 1
    shard_size: int = 64
    save_dtype: str = "float32"  # dtype of the saved adapter weights; "float16" halves the file

    def __post_init__(self):
        errs = []
        if self.stage not in STAGES:
            errs.append(f"stage must be 1, 2 or 3, got {self.stage!r}")
        if self.num_frames < 5 or (self.num_frames - 1) % 4:
            errs.append(f"num_frames must be 4k+1 (Wan), e.g. 17 or 81, got {self.num_frames}")
        if self.height % 16 or self.width % 16 or self.height <= 0 or self.width <= 0:
            errs.append(f"height and width must be positive multiples of 16, got {self.height}x{self.width}")
        for k in ("max_steps", "batch_size", "gradient_accumulation_steps", "checkpoint_every", "log_every",
                  "max_sequence_length", "cache_batch_size", "shard_size"):
            if not isinstance(getattr(self, k), int) or getattr(self, k) < 1:
                errs.append(f"{k} must be an integer >= 1, got {getattr(self, k)!r}")
        if not self.learning_rate > 0:
            errs.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.mixed_precision not in ("no", "bf16", "fp16"):
            errs.append(f"mixed_precision must be 'no', 'bf16' or 'fp16', got {self.mixed_precision!r}")
        if self.save_dtype not in _SAVE_DTYPES:
            errs.append(f"save_dtype must be one of {sorted(_SAVE_DTYPES)}, got {self.save_dtype!r}")
        if self.sigma_sampling not in ("uniform", "logit_normal"):
            errs.append(f"sigma_sampling must be 'uniform' or 'logit_normal', got {self.sigma_sampling!r}")
        if not self.sigma_shift > 0:
            errs.append(f"sigma_shift must be > 0, got {self.sigma_shift}")
        if not 0.0 <= self.label_mask_prob <= 1.0:
            errs.append(f"label_mask_prob must lie in [0, 1], got {self.label_mask_prob}")
        if not isinstance(self.rollout_steps, int) or self.rollout_steps < 0:
            errs.append(f"rollout_steps must be an integer >= 0, got {self.rollout_steps!r}")
        if not 0.0 <= self.rollout_prob <= 1.0:
            errs.append(f"rollout_prob must lie in [0, 1], got {self.rollout_prob}")
        if not self.flow_guidance >= 0:
            errs.append(f"flow_guidance must be >= 0, got {self.flow_guidance}")
        if self.apply_to not in ("guided", "each_branch"):
            errs.append(f"apply_to must be 'guided' or 'each_branch', got {self.apply_to!r}")
        elif self.apply_to == "each_branch" and self.flow_guidance != 1.0:
            errs.append("apply_to='each_branch' trains on each branch's own velocity: flow_guidance must be 1")
        if not 0.0 <= self.uncond_prob <= 1.0:
            errs.append(f"uncond_prob must lie in [0, 1], got {self.uncond_prob}")
        if not (self.rollout_du > 0 and self.rollout_shift > 0 and self.rollout_guidance >= 0):
            errs.append("rollout_du and rollout_shift must be > 0 and rollout_guidance >= 0")
        for f_ in dataclasses.fields(self):
            if f_.name.startswith("w_") and getattr(self, f_.name) < 0:
                errs.append(f"{f_.name} must be >= 0, got {getattr(self, f_.name)}")
        unknown = set(self.adapter) - _ADAPTER_KEYS
        if unknown:
            errs.append(f"unknown adapter option(s) {sorted(unknown)}; allowed: {sorted(_ADAPTER_KEYS)}")
        if self.data is None and self.cache_dir is None:
            errs.append("give data (a manifest or a folder of captioned videos) or cache_dir (an existing latent cache)")
        if errs:
            raise ValueError("invalid TrainConfig: " + "; ".join(errs))
        if self.cache_dir is None:
            self.cache_dir = os.path.join(self.output_dir, "cache")

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown config key(s) {sorted(unknown)}; valid keys: {sorted(names)}")
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str, **overrides) -> "TrainConfig":
        import yaml

        if not os.path.isfile(path):
            raise FileNotFoundError(f"config file not found: {path}")
        with open(path) as fh:
            d = yaml.safe_load(fh) or {}
        if not isinstance(d, dict):
            raise ValueError(f"{path}: expected a mapping of config keys, got {type(d).__name__}")
        d.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(d)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self, path: str) -> None:
        import yaml

        with open(path, "w") as fh:
            yaml.safe_dump(self.to_dict(), fh, sort_keys=False)


@dataclass
class TrainResult:
    steps: int  # optimiser steps done in total (including before a resume)
    history: List[Dict[str, float]]  # one entry per logged step of this run
    seconds_per_step: float  # mean wall time per optimiser step of this run
    adapter_dir: str
    resumed_from: Optional[str]
    skipped_videos: int


# ---------------------------------------------------------------------------------------
# model loading


def load_backbone(model: str, dtype: torch.dtype = torch.float32):
    """A Wan pipeline (frozen parts only are used): ``"tiny"``, ``"tiny-2.2"`` or a diffusers checkpoint."""
    if model in ("tiny", "tiny-2.1", "tiny-2.2"):
        from .tiny import load_tiny_wan

        pipe = load_tiny_wan("2.2" if model.endswith("2.2") else "2.1")
        for name in ("transformer", "transformer_2"):
            if getattr(pipe, name, None) is not None:
                getattr(pipe, name).to(dtype)
    else:
        from diffusers import WanPipeline

        if os.path.sep in model and not os.path.isdir(model):
            raise FileNotFoundError(f"Wan model folder not found: {model}")
        pipe = WanPipeline.from_pretrained(model, torch_dtype=dtype)
        pipe.vae.to(torch.float32)
    for name in ("transformer", "transformer_2", "vae", "text_encoder"):
        m = getattr(pipe, name, None)
        if m is not None:
            m.requires_grad_(False)
            m.eval()
    return pipe


def backbone_velocity(pipe, x_t: torch.Tensor, sigma: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """The frozen model's velocity at ``x_t`` (Wan 2.2: ``transformer`` above the boundary,
    ``transformer_2`` below), timestep ``1000 * sigma``."""
    t = sigma * 1000.0
    models = [(pipe.transformer, torch.ones_like(t, dtype=torch.bool))]
    t2 = getattr(pipe, "transformer_2", None)
    if t2 is not None:
        ratio = getattr(pipe.config, "boundary_ratio", None) or 0.875
        high = t >= ratio * 1000.0
        models = [(pipe.transformer, high), (t2, ~high)]
    out = torch.zeros_like(x_t)
    with torch.no_grad():
        for m, sel in models:
            if not bool(sel.any()):
                continue
            dt = next(m.parameters()).dtype
            # timesteps stay float32 as in WanPipeline (bf16 cannot hold 999 exactly)
            v = m(hidden_states=x_t[sel].to(dt), timestep=t[sel].float(), encoder_hidden_states=text[sel].to(dt),
                  return_dict=False)[0]
            out[sel] = v.to(out.dtype)
    return out


def trainable_parameters(adapter, stage: int):
    """Set ``requires_grad`` by stage; returns the trainable parameters."""
    adapter.requires_grad_(False)
    if stage == 1:
        mods = [adapter.fields]
    elif stage == 2:
        mods = [adapter.experts] + ([adapter.text_classifier] if adapter.text_classifier is not None else [])
    else:
        mods = [adapter]
    for m in mods:
        m.requires_grad_(True)
    if stage == 2:
        if adapter.text_prior_weight is not None:
            adapter.text_prior_weight.requires_grad_(True)
        adapter.log_kappa.requires_grad_(True)
    return [p for p in adapter.parameters() if p.requires_grad]


# ---------------------------------------------------------------------------------------
# deterministic sampling


def _mix(*xs: int) -> int:
    h = 0x9E3779B97F4A7C15
    for x in xs:
        h = (h ^ (int(x) + 0x632BE59BD9B4E019 + ((h << 6) & 0xFFFFFFFFFFFFFFFF) + (h >> 2))) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


def batch_indices(micro_step: int, batch_size: int, n: int, seed: int, rank: int, world: int) -> List[int]:
    """Dataset indices of one process's micro-batch: epochs are seeded permutations; the global
    micro-batch of ``batch_size * world`` consecutive positions is split across processes."""
    out = []
    for j in range(batch_size):
        pos = micro_step * batch_size * world + rank * batch_size + j
        epoch, k = divmod(pos, n)
        g = torch.Generator().manual_seed(_mix(seed, epoch))
        out.append(int(torch.randperm(n, generator=g)[k]))
    return out


def _shift(u: torch.Tensor, s: float) -> torch.Tensor:
    """Flow-matching timestep shift: more of [0, 1] near 1 (high noise) for s > 1."""
    return s * u / (1 + (s - 1) * u)


def sample_sigmas(u: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    if cfg.sigma_sampling == "logit_normal":
        u = torch.sigmoid(torch.special.ndtri(u.clamp(1e-6, 1 - 1e-6)))
    return _shift(u, cfg.sigma_shift).clamp(1e-3, 1.0)


# ---------------------------------------------------------------------------------------
# losses


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
    from . import residuals as R
    from .fields import latent_flow

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


def category_loss(mass: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy between the labels (normalised multi-hot) and the routing mass per category."""
    q = labels / labels.sum(-1, keepdim=True).clamp_min(1e-6)
    m = mass / mass.sum(-1, keepdim=True).clamp_min(1e-6)
    return -(q * torch.log(m.clamp_min(1e-6))).sum(-1).mean()


def empty_prompt_embedding(pipe, max_sequence_length: int) -> torch.Tensor:
    """The empty prompt's text embedding [1, L, D], zero-padded to L tokens as WanPipeline pads it."""
    from .data import encode_captions

    e = encode_captions(pipe, [""], max_sequence_length)[0]
    return torch.cat([e, e.new_zeros(max_sequence_length - e.shape[0], e.shape[1])])[None]


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
        from . import residuals as R

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
            if cfg.w_motion > 0:
                L["motion"] = motion_loss(pred, flow_target)
                total = total + cfg.w_motion * L["motion"]
            with torch.no_grad():
                L["flow_base"] = F.mse_loss(v_applied, flow_target)  # the frozen model alone (reference)
            total = total + cfg.w_flow * L["flow"]
    L["total"] = total
    return L


# ---------------------------------------------------------------------------------------
# the loop


def _latest_checkpoint(output_dir: str) -> Optional[str]:
    root = os.path.join(output_dir, "checkpoints")
    if not os.path.isdir(root):
        return None
    steps = [(int(m.group(1)), d) for d in os.listdir(root) if (m := re.fullmatch(r"checkpoint-(\d+)", d))
             and os.path.isfile(os.path.join(root, d, "trainer_state.json"))]
    return os.path.join(root, max(steps)[1]) if steps else None


def _reset_accelerate_state():
    import torch.distributed as dist
    from accelerate.state import AcceleratorState

    if not (dist.is_available() and dist.is_initialized()):
        AcceleratorState._reset_state(reset_partial_state=True)


def prepare_cache(cfg: TrainConfig, pipe, accelerator=None, progress: bool = True):
    """Build (or reuse) the latent cache of ``cfg.data`` in ``cfg.cache_dir`` on the main process."""
    from .data import CacheConfig, build_cache, load_records

    report = None
    is_main = accelerator is None or accelerator.is_main_process
    if cfg.data is not None and is_main:
        records = load_records(cfg.data)
        cc = CacheConfig(cfg.num_frames, cfg.height, cfg.width, cfg.max_sequence_length, cfg.model)
        report = build_cache(records, pipe, cfg.cache_dir, cc, shard_size=cfg.shard_size,
                             batch_size=cfg.cache_batch_size, progress=progress)
        logger.info("latent cache: %d new, %d reused, %d skipped", report.cached, report.already_cached, report.skipped)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    return report


def train(cfg: TrainConfig, *, progress: bool = False, log_callback: Optional[Callable[[Dict], None]] = None,
          pipe=None) -> TrainResult:
    """Run one training stage (see the module docstring). Returns a :class:`TrainResult`.

    ``pipe`` may pass an already loaded Wan pipeline (else ``cfg.model`` is loaded).
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration, set_seed
    from diffusers.optimization import get_scheduler

    from .adapter import PILAAdapter
    from .data import LatentCache, collate

    if cfg.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise ValueError("mixed_precision='fp16' needs a CUDA GPU; use 'bf16' or 'no' on CPU")
    _reset_accelerate_state()
    # Several processes without CUDA (``accelerate launch --multi_gpu`` / ``torchrun`` on a CPU
    # machine): without cpu=True accelerate would run them as independent single processes.
    cpu = cfg.cpu or (not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1)
    # Mixed precision = the frozen backbone's weights and compute in bf16/fp16 (nearly all the
    # FLOPs); the adapter (a few % of them) keeps float32 weights, compute and gradients, so
    # no loss scaling is needed and accelerate's autocast wrapping is not used.
    accelerator = Accelerator(
        cpu=cpu,
        mixed_precision="no",
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        log_with=None if cfg.report_to == "none" else cfg.report_to,
        project_config=ProjectConfiguration(project_dir=cfg.output_dir, logging_dir=os.path.join(cfg.output_dir, "logs")),
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=False)],
    )
    set_seed(cfg.seed)
    device = accelerator.device
    if accelerator.is_main_process:
        os.makedirs(cfg.output_dir, exist_ok=True)
        cfg.to_yaml(os.path.join(cfg.output_dir, f"config_stage{cfg.stage}.yaml"))
    weight_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.mixed_precision, torch.float32)
    if pipe is None:
        pipe = load_backbone(cfg.model, weight_dtype)
    for name in ("transformer", "transformer_2", "vae", "text_encoder"):
        m = getattr(pipe, name, None)
        if m is not None:
            m.requires_grad_(False).eval()
    # the VAE and text encoder are needed only to build the cache; training needs the transformer(s)
    encoders = [m for m in (getattr(pipe, "vae", None), getattr(pipe, "text_encoder", None)) if m is not None]
    if cfg.data is not None and accelerator.is_main_process:
        for m in encoders:
            m.to(device)
    report = prepare_cache(cfg, pipe, accelerator, progress=progress and accelerator.is_main_process)
    uncond = None
    if cfg.stage == 3 and ((cfg.rollout_steps > 0 and cfg.rollout_guidance != 1.0) or cfg.flow_guidance != 1.0
                           or (cfg.apply_to == "each_branch" and cfg.uncond_prob > 0)):
        if getattr(pipe, "text_encoder", None) is None:
            raise ValueError("guided training (rollouts, flow_guidance or each_branch's empty prompts) needs the "
                             "pipeline's text encoder (for the empty prompt)")
        uncond = empty_prompt_embedding(pipe, cfg.max_sequence_length).to(device)
    if device.type != "cpu":
        for m in encoders:
            m.to("cpu")
    for name in ("transformer", "transformer_2"):
        if getattr(pipe, name, None) is not None:
            getattr(pipe, name).to(device)
    dataset = LatentCache(cfg.cache_dir)
    cc = dataset.config
    if (cc["num_frames"], cc["height"], cc["width"]) != (cfg.num_frames, cfg.height, cfg.width):
        raise ValueError(f"the cache in {cfg.cache_dir} holds {cc['num_frames']} frames at {cc['height']}x{cc['width']}, "
                         f"the config asks for {cfg.num_frames} at {cfg.height}x{cfg.width}")
    sample = dataset[0]
    text_dim = int(sample["text"].shape[-1])
    latent_channels = int(sample["latents"].shape[0])

    if cfg.init_adapter:
        if not os.path.isdir(cfg.init_adapter):
            raise FileNotFoundError(f"init_adapter folder not found: {cfg.init_adapter}")
        adapter = PILAAdapter.from_pretrained(cfg.init_adapter)
        adapter.check_compatible(latent_channels=latent_channels, text_dim=text_dim, where="latent cache")
    else:
        adapter = PILAAdapter(latent_channels=latent_channels, text_dim=text_dim, **cfg.adapter)
    if cfg.stage == 3:
        adapter.register_to_config(apply_to=cfg.apply_to)  # how the pipeline is to apply what this stage trains
    adapter.to(device).train()
    params = trainable_parameters(adapter, cfg.stage)
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    lr_scheduler = get_scheduler("constant_with_warmup", optimizer, num_warmup_steps=cfg.warmup_steps * accelerator.num_processes,
                                 num_training_steps=cfg.max_steps * accelerator.num_processes)
    model, optimizer, lr_scheduler = accelerator.prepare(adapter, optimizer, lr_scheduler)
    raw = accelerator.unwrap_model(model)

    step, resumed = 0, None
    ckpt = _latest_checkpoint(cfg.output_dir) if cfg.resume == "auto" else cfg.resume
    if ckpt:
        if not os.path.isfile(os.path.join(ckpt, "trainer_state.json")):
            raise FileNotFoundError(f"not a training checkpoint (no trainer_state.json): {ckpt}")
        state = json.load(open(os.path.join(ckpt, "trainer_state.json")))
        if state["stage"] != cfg.stage:
            raise ValueError(f"checkpoint {ckpt} is from stage {state['stage']}, this run trains stage {cfg.stage}; "
                             f"use init_adapter with the previous stage's adapter and a new output_dir")
        accelerator.load_state(ckpt)
        step, resumed = int(state["step"]), ckpt
        logger.info("resumed from %s at step %d", ckpt, step)
    if cfg.report_to != "none":
        accelerator.init_trackers("pila", config={k: v for k, v in cfg.to_dict().items() if not isinstance(v, dict)})

    history: List[Dict[str, float]] = []
    n = len(dataset)
    rank, world = accelerator.process_index, accelerator.num_processes
    bar = None
    if progress and accelerator.is_main_process:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.max_steps, initial=step, desc=f"stage {cfg.stage}", unit="step")
    log_path = os.path.join(cfg.output_dir, "train_log.jsonl")
    times = []
    while step < cfg.max_steps:
        t0 = time.perf_counter()
        acc: Dict[str, float] = {}
        for a in range(cfg.gradient_accumulation_steps):
            micro = step * cfg.gradient_accumulation_steps + a
            items = [dataset[i] for i in batch_indices(micro, cfg.batch_size, n, cfg.seed, rank, world)]
            batch = collate(items, cfg.max_sequence_length)
            gen = torch.Generator().manual_seed(_mix(cfg.seed, 7, micro, rank))
            with accelerator.accumulate(model):
                L = stage_losses(model, raw, pipe, batch, cfg, gen, device, uncond)
                # experts that no token chose this step still take part (zero gradient), so
                # DistributedDataParallel sees every trainable parameter in every step
                touch = sum(p_.sum() for p_ in params) * 0.0
                accelerator.backward(L["total"] + touch)
                if accelerator.sync_gradients and cfg.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(params, cfg.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            for k, v in L.items():
                acc[k] = acc.get(k, 0.0) + float(v.detach()) / cfg.gradient_accumulation_steps
        step += 1
        times.append(time.perf_counter() - t0)
        if any(not math.isfinite(v) for v in acc.values()):
            raise FloatingPointError(f"non-finite loss at step {step}: {acc}; lower learning_rate or check the data")
        logs = {k: accelerator.reduce(torch.tensor(v, device=device), "mean").item() for k, v in sorted(acc.items())}
        logs.update(step=step, lr=lr_scheduler.get_last_lr()[0], sec_per_step=times[-1])
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            history.append(logs)
            if cfg.report_to != "none":
                accelerator.log(logs, step=step)
            if accelerator.is_main_process:
                with open(log_path, "a") as fh:
                    fh.write(json.dumps({"stage": cfg.stage, **logs}) + "\n")
                logger.info("stage %d step %d: %s", cfg.stage, step, {k: round(v, 5) for k, v in logs.items()})
                if log_callback is not None:
                    log_callback(logs)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{logs['total']:.4g}")
        if step % cfg.checkpoint_every == 0 or step == cfg.max_steps:
            _save_checkpoint(accelerator, cfg, step)
    if bar is not None:
        bar.close()
    accelerator.wait_for_everyone()
    adapter_dir = os.path.join(cfg.output_dir, "adapter")
    if accelerator.is_main_process:
        final = accelerator.unwrap_model(model)
        if cfg.stage >= 2 and final.text_classifier is not None:
            final.text_classifier.trained.fill_(True)
        if cfg.save_dtype != "float32":  # a cast copy: the trained model stays as it is
            final = copy.deepcopy(final).to(_SAVE_DTYPES[cfg.save_dtype])
        final.save_pretrained(adapter_dir)
    accelerator.wait_for_everyone()
    if cfg.report_to != "none":
        accelerator.end_training()
    return TrainResult(step, history, float(sum(times) / max(len(times), 1)), adapter_dir, resumed,
                       report.skipped if report else 0)


def _save_checkpoint(accelerator, cfg: TrainConfig, step: int) -> None:
    root = os.path.join(cfg.output_dir, "checkpoints")
    path = os.path.join(root, f"checkpoint-{step}")
    accelerator.wait_for_everyone()
    accelerator.save_state(path)
    if accelerator.is_main_process:
        with open(os.path.join(path, "trainer_state.json"), "w") as fh:
            json.dump({"step": step, "stage": cfg.stage}, fh)
        if cfg.checkpoints_total_limit:
            old = sorted((int(d.split("-")[1]), d) for d in os.listdir(root) if re.fullmatch(r"checkpoint-\d+", d))
            for _, d in old[: max(len(old) - cfg.checkpoints_total_limit, 0)]:
                shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    accelerator.wait_for_everyone()
