"""Physics-category operator experts with label-prior masked top-k routing.

Experts are grouped by category (``experts_per_category`` each, category-major order). A
per-token router scores every expert from the token's bank and context features (plus an
optional per-category bias from the learned text classifier); the category prior masks the
experts of categories the prompt does not involve, and ``visionmoe.ops.topk_route`` picks
the top-k allowed experts. Tokens are gathered into an expert-contiguous buffer with
``visionmoe.ops.dispatch``; each expert refines only the bank slots its category acts on
(taxonomy.Category.slots); ``visionmoe.ops.combine`` scatters the weighted refinements back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from visionmoe.ops import RouterOutput, combine, dispatch, topk_route

from .taxonomy import NUM_CATEGORIES, SLOTS, slot_mask


@dataclass
class ExpertsOutput:
    refinement: torch.Tensor  # [T, S, d] combined slot refinements
    router: RouterOutput  # weights/indices [T, k], aux_loss, z_loss, probs [T, E]
    expert_outputs: torch.Tensor  # [M, S*d] per-assignment refinements (buffer order)
    expert_counts: torch.Tensor  # [E] tokens routed to each expert
    category_mass: torch.Tensor  # [B, num_categories] mean routing weight per sample


class OperatorExpert(nn.Module):
    """One expert: a two-layer operator on [context, all slots] -> refinement of its slots."""

    def __init__(self, in_dim: int, hidden: int, num_slots: int, slot_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.fc2 = nn.Linear(hidden, num_slots * slot_dim)
        self.act = nn.GELU()

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class PhysicsExperts(nn.Module):
    def __init__(
        self,
        hidden_dim: int,
        slot_dim: int,
        expert_hidden: int = 256,
        experts_per_category: int = 1,
        top_k: int = 2,
        num_categories: int = NUM_CATEGORIES,
        single_expert: bool = False,
    ):
        super().__init__()
        # single_expert (ablation): one expert refines every slot for every token; no routing
        self.single = single_expert
        if single_expert:
            num_categories, experts_per_category, top_k = 1, 1, 1
        self.num_categories, self.per_cat = num_categories, experts_per_category
        self.num_experts = num_categories * experts_per_category
        if not 1 <= top_k <= self.num_experts:
            raise ValueError(f"top_k must lie in [1, {self.num_experts}] (number of experts), got {top_k}")
        self.top_k, self.slot_dim = top_k, slot_dim
        in_dim = len(SLOTS) * slot_dim + hidden_dim
        self.in_norm = nn.LayerNorm(in_dim)
        self.router = nn.Linear(in_dim, self.num_experts)
        nn.init.normal_(self.router.weight, std=0.02)
        nn.init.zeros_(self.router.bias)
        self.experts = nn.ModuleList(
            OperatorExpert(in_dim, expert_hidden, len(SLOTS), slot_dim) for _ in range(self.num_experts)
        )
        # [E, S*d] 0/1: expert e (category e // per_cat) refines only its category's slots
        sm = torch.ones(1, len(SLOTS)) if single_expert else slot_mask()
        m = sm.repeat_interleave(experts_per_category, 0).repeat_interleave(slot_dim, 1)
        self.register_buffer("slot_gate", m, persistent=False)

    def expert_mask(self, category_mask: torch.Tensor | None, grid) -> torch.Tensor | None:
        """Category prior [C] / [B, C] bool -> expert mask [E] or per-token [T, E]."""
        if category_mask is None:
            return None
        if category_mask.shape[-1] != self.num_categories:
            raise ValueError(
                f"category mask must have {self.num_categories} entries per sample, got shape {tuple(category_mask.shape)}"
            )
        m = category_mask.bool().repeat_interleave(self.per_cat, dim=-1)
        if m.dim() == 1:
            return m
        B, Fr, h, w = grid
        if m.shape[0] != B:
            raise ValueError(f"category mask has {m.shape[0]} rows but the batch has {B} samples")
        return m.repeat_interleave(Fr * h * w, dim=0)

    def forward(
        self,
        slots: torch.Tensor,  # [T, S, d]
        hidden: torch.Tensor,  # [T, hidden]
        grid,
        category_mask: torch.Tensor | None = None,  # [C] or [B, C] bool
        category_scale: torch.Tensor | None = None,  # [C] or [B, C] float
        category_bias: torch.Tensor | None = None,  # [B, C] router logit bias (learned text prior)
    ) -> ExpertsOutput:
        T, S, d = slots.shape
        if self.single:  # no categories to mask, scale or bias
            category_mask = category_scale = category_bias = None
        x = self.in_norm(torch.cat([slots.flatten(1), hidden], dim=-1))
        logits = self.router(x)
        if category_bias is not None:
            per_tok = T // category_bias.shape[0]
            logits = logits + category_bias.repeat_interleave(self.per_cat, -1).repeat_interleave(per_tok, 0)
        route = topk_route(logits, self.top_k, self.expert_mask(category_mask, grid))
        weights = route.weights
        if category_scale is not None:
            cs = category_scale.to(weights).repeat_interleave(self.per_cat, -1)
            if cs.dim() == 2:
                cs = cs.repeat_interleave(T // cs.shape[0], 0)
                slot_scale = cs.gather(1, route.indices.clamp_min(0))
            else:
                slot_scale = cs[route.indices.clamp_min(0)]
            weights = weights * slot_scale
        buffer, plan = dispatch(x, route.indices, self.num_experts)
        counts = plan.counts
        outs = [
            expert(chunk) * self.slot_gate[e]
            for e, (expert, chunk) in enumerate(zip(self.experts, buffer.split(counts.tolist())))
        ]
        y = torch.cat(outs) if outs else buffer.new_zeros(0, S * d)
        # Under autocast the router (bf16/fp16) and the gated expert outputs (promoted by the
        # float32 gate) disagree in dtype; combine in the experts' dtype.
        refinement = combine(y, weights.to(y.dtype), None, plan=plan).view(T, S, d)
        dense = torch.zeros_like(route.probs).scatter_add_(1, route.indices.clamp_min(0), route.weights)
        B = grid[0]
        mass = dense.view(B, -1, self.num_categories, self.per_cat).sum(-1).mean(1)
        if self.single:  # one expert serves every category alike
            mass = mass.new_full((B, NUM_CATEGORIES), 1.0 / NUM_CATEGORIES)
        return ExpertsOutput(refinement, route, y, counts, mass)
