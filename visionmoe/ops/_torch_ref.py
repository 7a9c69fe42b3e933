"""Pure-PyTorch references of the compiled ops: same signatures, same semantics, slow.

Tests compare every kernel against these (forward values and autograd gradients). They
are written for clarity, not speed, and use plain autograd for their gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .routing import RouterOutput, RoutingPlan, SegmentMoments, expand_prior_mask


def topk_route(logits, k, prior_mask=None, *, normalize=True) -> RouterOutput:
    T, E = logits.shape
    mask = expand_prior_mask(prior_mask, logits)
    masked = logits.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(masked, dim=1)
    probs = torch.softmax(masked, dim=1) if T else logits.new_zeros(0, E)
    # Masked experts get -1 so that they rank below every allowed one (probabilities >= 0).
    vals, idx = torch.topk(probs.masked_fill(~mask, -1.0), k, dim=1)
    valid = vals >= 0
    idx = torch.where(valid, idx, torch.full_like(idx, -1))
    vals = torch.where(valid, vals, torch.zeros_like(vals))
    weights = vals / vals.sum(dim=1, keepdim=True) if normalize else vals
    if T == 0:
        zero = logits.sum() * 0
        return RouterOutput(weights, idx, zero, zero, probs)
    one_hot = torch.nn.functional.one_hot(idx.clamp(min=0), E) * valid.unsqueeze(-1)
    acc = torch.promote_types(logits.dtype, torch.float32)
    fraction = one_hot.sum(dim=(0, 1)).to(acc) / valid.sum().clamp(min=1)
    aux = E * (fraction * probs.to(acc).mean(dim=0)).sum()
    z = lse.to(acc).pow(2).mean()
    return RouterOutput(weights, idx, aux.to(logits.dtype), z.to(logits.dtype), probs)


def routing_plan(indices, num_experts) -> RoutingPlan:
    flat = indices.reshape(-1)
    key = torch.where(flat < 0, torch.full_like(flat, num_experts), flat)
    order = torch.sort(key, stable=True).indices
    valid = int((flat >= 0).sum())
    order = order[:valid]
    position = torch.full_like(flat, -1)
    position[order] = torch.arange(valid, device=flat.device)
    counts = torch.bincount(flat[flat >= 0], minlength=num_experts)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    return RoutingPlan(order, position, offsets, int(indices.shape[1]))


def dispatch(x, indices, num_experts=None, *, plan=None):
    plan = plan or routing_plan(indices, num_experts)
    return x[plan.order // plan.top_k], plan


def combine(y, weights, indices, num_experts=None, *, plan=None):
    plan = plan or routing_plan(indices, num_experts)
    w = weights.reshape(-1)[plan.order].unsqueeze(1)
    out = y.new_zeros(weights.shape[0], y.shape[1])
    return out.index_add(0, plan.order // plan.top_k, y * w)


def moe_apply(x, weights, indices, experts: Sequence[Callable[[torch.Tensor], torch.Tensor]]):
    buffer, plan = dispatch(x, indices, len(experts))
    outputs = [e(c) for e, c in zip(experts, buffer.split(plan.counts.tolist()))]
    return combine(torch.cat(outputs), weights, None, plan=plan)


def nearest_center(points, centers, *, chunk=None):
    chunk = chunk or 4096
    index, dist = [], []
    for block in points.split(chunk):
        d2 = (block.unsqueeze(1) - centers.unsqueeze(0)).pow(2).sum(-1)  # exact differences
        best = d2.min(dim=1)
        index.append(best.indices)
        dist.append(best.values)
    if not index:
        return points.new_zeros(0, dtype=torch.int64), points.new_zeros(0)
    return torch.cat(index), torch.cat(dist)


def segment_moments(x, weights, segment_ids, num_segments) -> SegmentMoments:
    D = x.shape[1]
    wsum = x.new_zeros(num_segments).index_add(0, segment_ids, weights)
    safe = torch.where(wsum > 0, wsum, torch.ones_like(wsum))
    mean = x.new_zeros(num_segments, D).index_add(0, segment_ids, weights[:, None] * x) / safe[:, None]
    mean = mean * (wsum > 0)[:, None]
    d = x - mean[segment_ids]
    outer = weights[:, None, None] * d[:, :, None] * d[:, None, :]
    cov = x.new_zeros(num_segments, D, D).index_add(0, segment_ids, outer) / safe[:, None, None]
    return SegmentMoments(wsum, mean, cov)
