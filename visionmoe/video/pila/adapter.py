"""``PILAAdapter``: physics-informed latent alignment as a diffusers model.

One call maps a denoising state of a frozen flow-matching video model to a velocity
correction ``dv`` (``v' = v + scale * dv``). It reads only the 16-channel VAE latents
``x_t``, the model's velocity ``v``, the noise level ``sigma`` and, optionally, the text
embeddings that the transformer receives; it never touches transformer hidden states,
which is what lets one adapter serve Wan 2.1-1.3B and Wan 2.2-A14B (same VAE and text
encoder, different transformers).

Stages (module in brackets):
1. anchored field estimation: x0 estimate, latent flow anchor, attribute bank [fields]
2. label-prior masked top-k routing to category operator experts [experts, visionmoe.ops]
3. operational residuals on the refined proxies [residuals]
4. fusion of the refined slots into the bank and a zero-initialised decoder to dv.

An untrained adapter returns ``dv == 0`` exactly. ``forward`` returns a :class:`PILAOutput`
with everything training needs (bank, refined proxies, per-expert refinements, router
losses, residuals per sample, routing mass per category).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from . import residuals as R
from .experts import ExpertsOutput, PhysicsExperts
from .fields import AttributeBank, FieldEstimator, from_grid, to_grid, unpatchify
from .labels import TextCategoryClassifier
from .taxonomy import CATEGORIES, CATEGORY_NAMES, NUM_CATEGORIES, SLOTS


APPLY_TO = ("guided", "each_branch")


@dataclass
class PILAOutput:
    dv: torch.Tensor  # [B, C, F, H, W] velocity correction
    bank: AttributeBank | None = None
    refined_proxies: dict[str, torch.Tensor] = field(default_factory=dict)
    experts: ExpertsOutput | None = None
    aux_loss: torch.Tensor | None = None  # router load balance (1.0 when balanced)
    z_loss: torch.Tensor | None = None  # router z-loss
    residuals: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [B]
    category_logits: torch.Tensor | None = None  # [B, num_categories] learned text classifier

    def residual_loss(self) -> torch.Tensor:
        """Category-weighted residual loss: sum_c mass[b, c] * sum_{r in c.residuals} r[b], mean over b."""
        if self.experts is None or not self.residuals:
            return self.dv.new_zeros(())
        mass = self.experts.category_mass
        total = self.dv.new_zeros(mass.shape[0])
        for ci, cat in enumerate(CATEGORIES):
            for r in cat.residuals:
                if r in self.residuals:
                    total = total + mass[:, ci] * self.residuals[r].to(total)
        return total.mean()


class PILAAdapter(ModelMixin, ConfigMixin):
    """Physics mixture-of-experts adapter on Wan latents (see the module docstring).

    Args:
        latent_channels: VAE latent channels it reads and writes (Wan 2.1 / 2.2 A14B: 16).
        patch_size: spatial patch of the latent per token.
        hidden_dim: token context width.
        slot_dim: feature width of each attribute-bank slot.
        expert_hidden: hidden width of each operator expert.
        experts_per_category: experts per physical category (category-major).
        top_k: experts per token.
        text_dim: width of the text embeddings (UMT5-XXL: 4096) for the learned category
            classifier; ``None`` = no text input.
        flow_window, flow_reg: Lucas-Kanade window and Tikhonov regulariser of the anchor.
        kappa: initial heat diffusivity of the heat residual (learned, positive).
        apply_to: where the pipeline adds the correction, as the adapter was trained (see
            :mod:`visionmoe.video.hooks.pila`): ``"guided"`` (one ``dv`` from the conditional call, added to the
            guided velocity) or ``"each_branch"`` (every transformer call is corrected from its
            own velocity and text; guidance then combines the corrected branches).
        context_blocks: depthwise 3-D convolution + MLP blocks over the token grid in the field
            estimator (each widens the receptive field by one token each way; 1: the shipped one).
        clip_context: add to every token a projection of the clip's mean token (a law relates
            all frames of the clip).
    """

    config_name = "config.json"
    _supports_gradient_checkpointing = False

    @register_to_config
    def __init__(
        self,
        latent_channels: int = 16,
        patch_size: int = 2,
        hidden_dim: int = 256,
        slot_dim: int = 32,
        expert_hidden: int = 256,
        experts_per_category: int = 1,
        top_k: int = 2,
        text_dim: int | None = None,
        flow_window: int = 3,
        flow_reg: float = 1e-2,
        kappa: float = 0.1,
        structure: str = "physics",
        anchor: bool = True,
        single_expert: bool = False,
        plain_blocks: int = 4,
        apply_to: str = "guided",
        context_blocks: int = 1,
        clip_context: bool = False,
    ):
        super().__init__()
        if apply_to not in APPLY_TO:
            raise ValueError(f"apply_to must be one of {APPLY_TO}, got {apply_to!r}")
        if latent_channels < 1 or patch_size < 1:
            raise ValueError(f"latent_channels and patch_size must be positive, got {latent_channels}, {patch_size}")
        if structure not in ("physics", "plain"):
            raise ValueError(f"structure must be 'physics' (fields, experts, residuals) or 'plain' (ablation), got {structure!r}")
        if structure == "plain":
            # ablation: same inputs (x_t, v, sigma, text), no fields, experts, routing or residuals
            self.plain = PlainCorrector(latent_channels, patch_size, hidden_dim, plain_blocks, text_dim)
            self.text_classifier = self.text_prior_weight = None
            self.log_kappa = nn.Parameter(torch.tensor(float(kappa)).log(), requires_grad=False)
            return
        self.plain = None
        self.fields = FieldEstimator(latent_channels, patch_size, hidden_dim, slot_dim, flow_window=flow_window,
                                     flow_reg=flow_reg, use_anchor=anchor, context_blocks=context_blocks,
                                     clip_context=clip_context)
        self.experts = PhysicsExperts(hidden_dim, slot_dim, expert_hidden, experts_per_category, top_k,
                                      single_expert=single_expert)
        self.text_classifier = TextCategoryClassifier(text_dim) if text_dim else None
        self.text_prior_weight = nn.Parameter(torch.zeros(())) if text_dim else None
        n = len(SLOTS) * slot_dim
        self.fuse = nn.Sequential(nn.LayerNorm(n + hidden_dim), nn.Linear(n + hidden_dim, hidden_dim), nn.GELU())
        self.decoder = nn.Linear(hidden_dim, latent_channels * patch_size * patch_size)
        nn.init.zeros_(self.decoder.weight)
        nn.init.zeros_(self.decoder.bias)
        self.log_kappa = nn.Parameter(torch.tensor(float(kappa)).log())

    @property
    def category_names(self) -> tuple[str, ...]:
        return CATEGORY_NAMES

    def classify_text(self, encoder_hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Learned category logits [B, num_categories] from text embeddings (None without a classifier)."""
        if self.text_classifier is None or encoder_hidden_states is None:
            return None
        return self.text_classifier(encoder_hidden_states.to(self.dtype))

    def forward(
        self,
        latents: torch.Tensor,
        velocity: torch.Tensor,
        sigma: torch.Tensor | float,
        encoder_hidden_states: torch.Tensor | None = None,
        category_mask: torch.Tensor | None = None,
        category_scale: torch.Tensor | None = None,
        compute_residuals: bool = True,
    ) -> PILAOutput:
        """Args:
        latents: [B, C, F, H, W] noisy latents x_t.
        velocity: [B, C, F, H, W] the frozen model's (flow-matching) velocity at x_t.
        sigma: [B] or scalar noise level in [0, 1] (x_t = (1 - sigma) x0 + sigma noise).
        encoder_hidden_states: optional [B, L, text_dim] text embeddings.
        category_mask: optional [num_categories] or [B, num_categories] bool prior mask.
        category_scale: optional [num_categories] or [B, num_categories] per-category scale.
        compute_residuals: evaluate the residuals on the refined proxies (training).
        """
        C = self.config.latent_channels
        if latents.dim() != 5 or latents.shape[1] != C:
            raise ValueError(
                f"PILAAdapter expects latents [B, {C}, F, H, W] (its latent_channels={C}), got shape {tuple(latents.shape)}"
            )
        if velocity.shape != latents.shape:
            raise ValueError(f"velocity shape {tuple(velocity.shape)} must equal latents shape {tuple(latents.shape)}")
        B, _, Fr, H, W = latents.shape
        p = self.config.patch_size
        ph, pw = (-H) % p, (-W) % p
        x, v = latents.to(self.dtype), velocity.to(self.dtype)
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph, 0, 0), mode="replicate")
            v = F.pad(v, (0, pw, 0, ph, 0, 0), mode="replicate")
        sigma = torch.as_tensor(sigma, dtype=self.dtype, device=x.device).reshape(-1).expand(B)
        if self.plain is not None:
            dv = self.plain(x, v, sigma, encoder_hidden_states)[..., :H, :W].to(velocity.dtype)
            zero = dv.new_zeros((), dtype=torch.float32)
            return PILAOutput(dv, aux_loss=zero, z_loss=zero)

        bank = self.fields(x, v, sigma)
        logits = self.classify_text(encoder_hidden_states)
        bias = None if logits is None else self.text_prior_weight * logits
        ex = self.experts(bank.slots, bank.hidden, bank.grid, category_mask, category_scale, bias)
        refined = bank.slots + ex.refinement
        refined_proxies = self.fields.proxy_heads(refined, bank.grid, bank.anchors)
        fused = self.fuse(torch.cat([refined.flatten(1), bank.hidden], dim=-1))
        dv = unpatchify(self.decoder(fused), bank.grid, C, p)[..., :H, :W].to(velocity.dtype)
        res = {}
        if compute_residuals:
            proxies = dict(refined_proxies)
            proxies.update(latent=bank.proxies["latent"], occupancy=bank.proxies["occupancy"], kappa=self.log_kappa.exp())
            res = R.bank_residuals(proxies)
        return PILAOutput(dv, bank, refined_proxies, ex, ex.router.aux_loss, ex.router.z_loss, res, logits)

    def residual_guidance(
        self,
        latents: torch.Tensor,
        velocity: torch.Tensor,
        sigma: torch.Tensor | float,
        strength: float,
        encoder_hidden_states: torch.Tensor | None = None,
        category_mask: torch.Tensor | None = None,
        category_scale: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inference-time residual guidance: one normalised gradient step on the velocity.

        ``E(v)`` is :meth:`PILAOutput.residual_loss` (residuals of each routed category,
        weighted by its routing mass) of the bank built from ``(x_t, v)``. Returns
        ``dv_g = -strength * rms(v) * grad_v E / rms(grad_v E)`` (so ``strength`` is the
        step's size relative to the velocity) and ``E(v)``. Works untrained too: the anchored
        proxies then equal the observed-motion anchors of ``x0 = x_t - sigma v``. Keep
        ``strength`` small (about 0.01): it is a first-order step. Returns zeros when the token
        grid is too small for any residual (fewer than 3 tokens along F, h or w).
        """
        if self.plain is not None:
            raise ValueError("residual guidance needs the physics structure; this adapter is structure='plain'")
        with torch.enable_grad():
            v = velocity.detach().to(self.dtype).requires_grad_(True)
            out = self(
                latents.detach(), v, sigma, encoder_hidden_states, category_mask, category_scale, compute_residuals=True
            )
            energy = out.residual_loss()
            if not energy.requires_grad:  # grid too small for any residual (< 3 tokens on an axis)
                return torch.zeros_like(velocity), energy.detach()
            (grad,) = torch.autograd.grad(energy, v)
        rms_v = velocity.float().pow(2).mean().sqrt()
        rms_g = grad.float().pow(2).mean().sqrt()
        dv = -float(strength) * rms_v * grad.float() / (rms_g + 1e-12)
        return dv.to(velocity.dtype), energy.detach()

    def check_compatible(self, *, latent_channels: int, text_dim: int | None = None, where: str = "pipeline") -> None:
        """Raise a ValueError naming the mismatch if this adapter cannot run on the given model."""
        if latent_channels != self.config.latent_channels:
            raise ValueError(
                f"PILA adapter expects {self.config.latent_channels}-channel latents but the {where} uses "
                f"{latent_channels}-channel latents; load an adapter trained for this VAE "
                f"(latent_channels={latent_channels})"
            )
        if self.config.text_dim and text_dim is not None and text_dim != self.config.text_dim:
            raise ValueError(
                f"PILA adapter's text classifier expects {self.config.text_dim}-dim text embeddings but the "
                f"{where} produces {text_dim}-dim ones"
            )


class PlainCorrector(nn.Module):
    """The plain ablation: patch tokens of ``[x0, v]`` with a sigma FiLM and a pooled-text bias,
    ``blocks`` residual blocks (depthwise 3-D convolution over the token grid + MLP), and a
    zero-initialised decoder to ``dv``. No fields, experts, routing or residuals."""

    def __init__(self, latent_channels: int, patch_size: int, hidden_dim: int, blocks: int, text_dim: int | None):
        super().__init__()
        from .fields import _mlp

        self.C, self.p, self.sigma_dim = latent_channels, patch_size, 64
        self.embed = nn.Linear(2 * latent_channels * patch_size * patch_size, hidden_dim)
        self.sigma_film = nn.Sequential(nn.Linear(self.sigma_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, 2 * hidden_dim))
        self.text = nn.Linear(text_dim, hidden_dim) if text_dim else None
        self.norm = nn.LayerNorm(hidden_dim, elementwise_affine=False)
        self.convs = nn.ModuleList(nn.Conv3d(hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim) for _ in range(blocks))
        self.mlps = nn.ModuleList(nn.Sequential(nn.LayerNorm(hidden_dim), _mlp(hidden_dim, 2 * hidden_dim, hidden_dim))
                                  for _ in range(blocks))
        self.decoder = nn.Linear(hidden_dim, latent_channels * patch_size * patch_size)
        nn.init.zeros_(self.decoder.weight)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, x, v, sigma, text=None):
        from .fields import clean_latent, patchify, sigma_embedding

        B, C, Fr, H, W = x.shape
        p = self.p
        grid = (B, Fr, H // p, W // p)
        x0 = clean_latent(x, v, sigma)
        hid = self.embed(torch.cat([patchify(x0, p), patchify(v, p)], dim=1))
        per_tok = hid.shape[0] // B
        scale, shift = self.sigma_film(sigma_embedding(sigma, self.sigma_dim).to(hid.dtype)).chunk(2, dim=-1)
        if self.text is not None and text is not None:
            t = text.to(hid.dtype)
            keep = (t.abs().sum(-1, keepdim=True) > 0).to(t.dtype)
            shift = shift + self.text((t * keep).sum(1) / keep.sum(1).clamp_min(1.0))
        hid = self.norm(hid) * (1 + scale.repeat_interleave(per_tok, 0)) + shift.repeat_interleave(per_tok, 0)
        for conv, mlp in zip(self.convs, self.mlps):
            hid = hid + from_grid(conv(to_grid(hid, grid)))
            hid = hid + mlp(hid)
        return unpatchify(self.decoder(hid), grid, C, p)


def proxies_to_tokens(proxies: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """[B, c, F, h, w] proxy fields -> [T, c] token rows (for token-level losses)."""
    return {k: from_grid(v) for k, v in proxies.items() if torch.is_tensor(v) and v.dim() == 5}


__all__ = ["PILAAdapter", "PILAOutput", "proxies_to_tokens", "to_grid", "NUM_CATEGORIES"]
