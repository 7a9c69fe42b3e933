"""Routing ops: top-k routing under a prior mask, dispatch/combine, nearest centre, segment moments.

The mixture-of-experts path follows megablocks/tutel: ``topk_route`` picks experts per token,
``routing_plan`` counting-sorts the assignments by expert (histogram, cumsum, bins),
``dispatch`` gathers tokens into an expert-contiguous buffer, experts run on contiguous
slices, and ``combine`` scatters their outputs back with the routing weights. ``dispatch``
and ``combine`` are adjoints: each one's backward is the other's kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from . import _backend
from ._validate import FLOATING, check_same_device, check_same_dtype, check_tensor


class RouterOutput(NamedTuple):
    weights: torch.Tensor  # [T, k] routing weights (0 where a slot is empty)
    indices: torch.Tensor  # [T, k] int64 expert ids, -1 where fewer than k experts are allowed
    aux_loss: torch.Tensor  # [] Switch load-balance loss, E * sum_e f_e * P_e (1.0 when balanced)
    z_loss: torch.Tensor  # [] router z-loss, mean_t logsumexp(logits_t)^2 over allowed experts
    probs: torch.Tensor  # [T, E] softmax over the allowed experts


class RoutingPlan(NamedTuple):
    order: torch.Tensor  # [M] flat assignment ids (t * k + slot), grouped by expert, stable in t
    position: torch.Tensor  # [T * k] row of each assignment in the buffer, -1 if dropped
    offsets: torch.Tensor  # [E + 1] bin boundaries: expert e owns rows offsets[e]:offsets[e+1]
    top_k: int

    @property
    def counts(self) -> torch.Tensor:  # [E]
        return self.offsets.diff()

    @property
    def num_tokens(self) -> int:
        return self.position.numel() // self.top_k


class SegmentMoments(NamedTuple):
    weight_sum: torch.Tensor  # [S]
    mean: torch.Tensor  # [S, D] weighted mean (0 for empty segments)
    cov: torch.Tensor  # [S, D, D] weighted (biased) covariance (0 for empty segments)


# --------------------------------------------------------------------------- top-k routing


def expand_prior_mask(prior_mask: torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor:
    """Broadcast a [E] or [T, E] bool prior mask to [T, E] (a view, no copy); None allows all."""
    T, E = logits.shape
    if prior_mask is None:
        return torch.ones(1, 1, dtype=torch.bool, device=logits.device).expand(T, E)
    check_tensor("prior_mask", prior_mask, dtypes=(torch.bool,))
    if prior_mask.shape not in ((E,), (T, E)):
        raise ValueError(f"prior_mask must have shape ({E},) or ({T}, {E}), got {tuple(prior_mask.shape)}")
    if prior_mask.device != logits.device:
        raise ValueError(f"prior_mask is on {prior_mask.device} but logits are on {logits.device}")
    mask = prior_mask.expand(T, E)
    if T > 0:
        empty = ~mask.any(dim=1)
        if bool(empty.any()):
            token = int(empty.nonzero()[0, 0])
            raise ValueError(
                f"prior_mask masks every expert of token {token} ({int(empty.sum())} such tokens); "
                "allow at least one expert per token"
            )
    return mask


class _TopkRoute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, mask, k, normalize):
        weights, indices, probs, lse = _backend.kernels(logits.device).topk_route_fwd(logits, mask, k, normalize)
        ctx.save_for_backward(probs, weights, indices)
        ctx.normalize = normalize
        ctx.mark_non_differentiable(indices)
        ctx.set_materialize_grads(False)
        return weights, indices, probs, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v_weights, _v_indices, v_probs, v_lse):
        probs, weights, indices = ctx.saved_tensors
        v_logits = _backend.kernels(probs.device).topk_route_bwd(
            v_weights, v_probs, v_lse, probs, weights, indices, ctx.normalize
        )
        return v_logits, None, None, None


def router_losses(probs: torch.Tensor, indices: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Switch load-balance loss and ST-MoE z-loss from routing probabilities and choices."""
    T, E = probs.shape
    if T == 0:
        zero = probs.sum() * 0
        return zero, zero
    chosen = indices[indices >= 0]
    acc = torch.promote_types(probs.dtype, torch.float32)  # half types accumulate in float32
    fraction = torch.bincount(chosen, minlength=E).to(acc) / max(chosen.numel(), 1)
    aux = E * (fraction * probs.to(acc).mean(dim=0)).sum()
    z = lse.to(acc).pow(2).mean()
    return aux.to(probs.dtype), z.to(probs.dtype)


def topk_route(
    logits: torch.Tensor, k: int, prior_mask: torch.Tensor | None = None, *, normalize: bool = True
) -> RouterOutput:
    """Per-token top-k routing with a label-prior mask.

    Args:
        logits: [T, E] router logits.
        k: experts per token, 1 <= k <= E.
        prior_mask: [E] or [T, E] bool; False experts are never selected. A token whose every
            expert is masked raises ValueError. Tokens with fewer than k allowed experts get
            index -1 and weight 0 in the remaining slots.
        normalize: renormalise the k selected probabilities to sum to 1 (Mixtral style);
            otherwise weights are the softmax probabilities themselves (Switch style).
    """
    check_tensor("logits", logits, dim=2, dtypes=FLOATING)
    T, E = logits.shape
    if E == 0:
        raise ValueError("logits must have at least one expert column, got shape (T, 0)")
    if not isinstance(k, int) or not 1 <= k <= E:
        raise ValueError(f"k must be an int in [1, {E}] (the number of experts), got {k!r}")
    if T and bool(torch.isnan(logits).any()):
        token = int(torch.isnan(logits).any(dim=1).nonzero()[0, 0])
        raise ValueError(f"logits contain NaN (first at token {token}); check the router's inputs and weights")
    mask = expand_prior_mask(prior_mask, logits)
    weights, indices, probs, lse = _TopkRoute.apply(logits, mask, k, bool(normalize))
    aux, z = router_losses(probs, indices, lse)
    return RouterOutput(weights, indices, aux, z, probs)


# --------------------------------------------------------------------------- dispatch / combine


def routing_plan(indices: torch.Tensor, num_experts: int) -> RoutingPlan:
    """Counting-sort assignments [T, k] by expert: the bins dispatch and combine share."""
    check_tensor("indices", indices, dim=2, dtypes=(torch.int64,))
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    if indices.shape[1] == 0:
        raise ValueError(f"indices must have at least one slot per token, got shape {tuple(indices.shape)}")
    if indices.numel():
        lo, hi = int(indices.min()), int(indices.max())
        if lo < -1 or hi >= num_experts:
            raise ValueError(f"indices must lie in [-1, {num_experts - 1}] (num_experts={num_experts}), found [{lo}, {hi}]")
    order, position, offsets = _backend.kernels(indices.device).routing_plan(indices, num_experts)
    return RoutingPlan(order, position, offsets, int(indices.shape[1]))


def _plan_for(indices, num_experts, plan, num_tokens):
    if plan is None:
        plan = routing_plan(indices, num_experts)
    elif indices is not None and tuple(indices.shape) != (plan.num_tokens, plan.top_k):
        raise ValueError(f"indices shape {tuple(indices.shape)} does not match the plan's ({plan.num_tokens}, {plan.top_k})")
    if plan.num_tokens != num_tokens:
        raise ValueError(f"the routing has {plan.num_tokens} tokens but the input has {num_tokens} rows")
    return plan


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, order, position, k):
        ctx.save_for_backward(position)
        ctx.k = k
        return _backend.kernels(x.device).dispatch_fwd(x, order, k, None)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v_out):
        (position,) = ctx.saved_tensors
        # Adjoint of a gather into the buffer: combine with unit weights.
        return _backend.kernels(v_out.device).combine_fwd(v_out, position, ctx.k, None), None, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, weights, order, position, k):
        ctx.save_for_backward(y, weights, order, position)
        ctx.k = k
        return _backend.kernels(y.device).combine_fwd(y, position, k, weights)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v_out):
        y, weights, order, position = ctx.saved_tensors
        # v_y is dispatch of v_out scaled by the weights; v_weights are per-slot dot products.
        v_y, v_w = _backend.kernels(y.device).combine_bwd(v_out, y, weights, order, position, ctx.k)
        return v_y, v_w, None, None, None


def dispatch(
    x: torch.Tensor, indices: torch.Tensor | None, num_experts: int | None = None, *, plan: RoutingPlan | None = None
) -> tuple[torch.Tensor, RoutingPlan]:
    """Gather tokens x [T, D] into an expert-contiguous buffer [M, D] (M = valid assignments).

    Returns the buffer and the plan; expert e's rows are ``buffer[plan.offsets[e]:plan.offsets[e+1]]``.
    Pass ``plan=`` to reuse a plan across calls (then ``indices`` may be None).
    """
    check_tensor("x", x, dim=2, dtypes=FLOATING)
    if plan is None and indices is None:
        raise ValueError("dispatch needs indices [T, k] (with num_experts) or a plan")
    plan = _plan_for(indices, num_experts, plan, x.shape[0])
    check_same_device(x=x, order=plan.order)
    return _Dispatch.apply(x, plan.order, plan.position, plan.top_k), plan


def combine(
    y: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor | None,
    num_experts: int | None = None,
    *,
    plan: RoutingPlan | None = None,
) -> torch.Tensor:
    """Weighted scatter-add of expert outputs y [M, D] back to tokens: out [T, D]."""
    check_tensor("y", y, dim=2, dtypes=FLOATING)
    check_tensor("weights", weights, dim=2, dtypes=FLOATING)
    plan = _plan_for(indices, num_experts, plan, weights.shape[0])
    if tuple(weights.shape) != (plan.num_tokens, plan.top_k):
        raise ValueError(f"weights must have shape ({plan.num_tokens}, {plan.top_k}), got {tuple(weights.shape)}")
    if y.shape[0] != plan.order.numel():
        raise ValueError(f"y must have {plan.order.numel()} rows (one per routed assignment), got {y.shape[0]}")
    check_same_dtype(y=y, weights=weights)
    check_same_device(y=y, weights=weights, order=plan.order)
    return _Combine.apply(y, weights, plan.order, plan.position, plan.top_k)


def moe_apply(
    x: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    experts: Sequence[Callable[[torch.Tensor], torch.Tensor]],
) -> torch.Tensor:
    """Run ``experts[e]`` on the tokens routed to e and combine: the whole MoE layer in one call."""
    buffer, plan = dispatch(x, indices, len(experts))
    chunks = buffer.split(plan.counts.tolist())
    outputs = [expert(chunk) for expert, chunk in zip(experts, chunks)]
    return combine(torch.cat(outputs), weights, None, plan=plan)


# --------------------------------------------------------------------------- clustering ops


def nearest_center(
    points: torch.Tensor, centers: torch.Tensor, *, chunk: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Index [N] (int64) of the nearest centre of each point and its squared distance [N].

    Distances come from one BLAS GEMM per chunk of ``chunk`` points (default: ~64 MB of
    scores on the CPU, ~256 MB on a GPU, where small GEMMs leave it idle) with a fused arg-min;
    the winner's distance is recomputed exactly. Not differentiable.
    """
    check_tensor("points", points, dim=2, dtypes=FLOATING)
    check_tensor("centers", centers, dim=2, dtypes=FLOATING)
    if points.shape[1] != centers.shape[1]:
        raise ValueError(
            f"points and centers must share the feature dimension: points {tuple(points.shape)}, centers {tuple(centers.shape)}"
        )
    if centers.shape[0] == 0:
        raise ValueError("centers must hold at least one centre, got shape (0, D)")
    check_same_dtype(points=points, centers=centers)
    check_same_device(points=points, centers=centers)
    if chunk is None:
        chunk = max(256, (1 << (26 if points.is_cuda else 24)) // centers.shape[0])
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    with torch.no_grad():
        return _backend.kernels(points.device).nearest_center_fwd(points, centers, int(chunk))


class _SegmentMoments(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weights, segment_ids, num_segments):
        wsum, mean, cov = _backend.kernels(x.device).segment_moments_fwd(x, weights, segment_ids, num_segments)
        ctx.save_for_backward(x, weights, segment_ids, wsum, mean, cov)
        ctx.set_materialize_grads(False)
        return wsum, mean, cov

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v_wsum, v_mean, v_cov):
        x, weights, segment_ids, wsum, mean, cov = ctx.saved_tensors
        v_x, v_w = _backend.kernels(x.device).segment_moments_bwd(
            v_wsum, v_mean, v_cov, x, weights, segment_ids, wsum, mean, cov
        )
        return v_x, v_w, None, None


def segment_moments(
    x: torch.Tensor, weights: torch.Tensor, segment_ids: torch.Tensor, num_segments: int
) -> SegmentMoments:
    """Per-segment weight sums [S], weighted means [S, D] and weighted covariances [S, D, D].

    The moment-matched merge of a mixture: segment s's Gaussian has mean ``mean[s]`` and
    covariance ``cov[s]`` (add the members' own covariances for a full mixture merge).
    Differentiable in x and weights; weights must be non-negative.
    """
    check_tensor("x", x, dim=2, dtypes=FLOATING)
    check_tensor("weights", weights, shape=(x.shape[0],), dtypes=FLOATING)
    check_tensor("segment_ids", segment_ids, shape=(x.shape[0],), dtypes=(torch.int64,))
    check_same_dtype(x=x, weights=weights)
    check_same_device(x=x, weights=weights, segment_ids=segment_ids)
    if not isinstance(num_segments, int) or num_segments < 0:
        raise ValueError(f"num_segments must be a non-negative int, got {num_segments!r}")
    if segment_ids.numel():
        lo, hi = int(segment_ids.min()), int(segment_ids.max())
        if lo < 0 or hi >= num_segments:
            raise ValueError(f"segment_ids must lie in [0, {num_segments - 1}], found [{lo}, {hi}]")
        if bool((weights < 0).any()):
            raise ValueError("weights must be non-negative")
    return SegmentMoments(*_SegmentMoments.apply(x, weights, segment_ids, num_segments))
