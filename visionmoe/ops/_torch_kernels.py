"""The routing kernels of ``visionmoe._C`` in pure PyTorch, with the same names, arguments and
results (csrc/routing/routing.h), on any device: what :mod:`visionmoe.ops._backend` hands out
when the extension cannot load, so that the routing ops keep working (slower) under a torch the
extension was not built for (the rasteriser's kernels: :mod:`visionmoe.ops._torch_raster`).

The forward kernels follow ``_torch_ref`` (the tests' oracle, written at the level of the public
functions); the backward kernels are the analytic adjoints, or autograd through the forward
where that is simpler (segment moments)."""

from __future__ import annotations

import torch


def topk_route_fwd(logits: torch.Tensor, mask: torch.Tensor, k: int, normalize: bool):
    """-> weights [T, k], indices [T, k] (-1: no allowed expert left), probs [T, E], lse [T]."""
    T, E = logits.shape
    if T and bool((~mask).all(dim=1).any()):
        raise ValueError(f"prior_mask masks every expert of token {int((~mask).all(dim=1).nonzero()[0, 0])}")
    masked = logits.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(masked, dim=1)
    probs = torch.softmax(masked, dim=1) if T else logits.new_zeros(0, E)
    # masked experts rank below every allowed one (probabilities are >= 0)
    vals, idx = torch.topk(probs.masked_fill(~mask, -1.0), k, dim=1)
    valid = vals >= 0
    indices = torch.where(valid, idx, torch.full_like(idx, -1))
    vals = torch.where(valid, vals, torch.zeros_like(vals))
    weights = vals / vals.sum(dim=1, keepdim=True) if normalize else vals
    return weights, indices, probs, lse


def topk_route_bwd(v_weights, v_probs, v_lse, probs, weights, indices, normalize: bool) -> torch.Tensor:
    """-> v_logits [T, E]: through the selected weights, the softmax and the log-sum-exp."""
    g = v_probs.clone() if v_probs is not None else torch.zeros_like(probs)
    if v_weights is not None and indices.numel():
        valid = indices >= 0
        slot = indices.clamp(min=0)
        vw = torch.where(valid, v_weights, torch.zeros_like(v_weights))
        if normalize:  # w_j = p_j / S, S = sum of the selected p: dL/dp_i = (vw_i - <vw, w>) / S
            picked = (probs.gather(1, slot) * valid).sum(dim=1, keepdim=True)
            vw = (vw - (vw * weights).sum(dim=1, keepdim=True)) / torch.where(picked > 0, picked, torch.ones_like(picked))
        g = g.scatter_add(1, slot, torch.where(valid, vw, torch.zeros_like(vw)))
    v_logits = probs * (g - (probs * g).sum(dim=1, keepdim=True))
    if v_lse is not None:
        v_logits = v_logits + v_lse[:, None] * probs
    return v_logits


def routing_plan(indices: torch.Tensor, num_experts: int):
    """Stable sort of the assignments by expert -> order [M], position [T*k], offsets [E+1]."""
    flat = indices.reshape(-1)
    key = torch.where(flat < 0, torch.full_like(flat, num_experts), flat)
    valid = int((flat >= 0).sum())
    order = torch.sort(key, stable=True).indices[:valid]
    position = torch.full_like(flat, -1)
    position[order] = torch.arange(valid, device=flat.device)
    counts = torch.bincount(flat[flat >= 0], minlength=num_experts)
    return order, position, torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def dispatch_fwd(x: torch.Tensor, order: torch.Tensor, k: int, scale: torch.Tensor | None) -> torch.Tensor:
    """out[r] = scale[order[r]] * x[order[r] // k] -> [M, D]."""
    out = x[order // k]
    return out * scale[order].unsqueeze(1) if scale is not None else out


def _gather_slots(y: torch.Tensor, position: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """y's row of every (token, slot) -> [T, k, D] (zeros where dropped) and the valid mask [T, k]."""
    pos = position.view(-1, k)
    valid = pos >= 0
    if y.shape[0] == 0:
        return y.new_zeros(*pos.shape, y.shape[1]), valid
    return y[pos.clamp(min=0)] * valid.unsqueeze(-1).to(y.dtype), valid


def combine_fwd(y: torch.Tensor, position: torch.Tensor, k: int, weights: torch.Tensor | None) -> torch.Tensor:
    """out[t] = sum_s w[t, s] * y[position[t*k + s]] -> [T, D]; ``weights`` None means 1."""
    rows, _ = _gather_slots(y, position, k)
    return rows.sum(dim=1) if weights is None else (rows * weights.unsqueeze(-1)).sum(dim=1)


def combine_bwd(v_out, y, weights, order, position, k: int):
    """-> v_y [M, D] (dispatch of v_out scaled by the weights), v_weights [T, k] (per-slot dots)."""
    v_y = dispatch_fwd(v_out, order, k, weights.reshape(-1))
    rows, _ = _gather_slots(y, position, k)
    return v_y, (rows * v_out.unsqueeze(1)).sum(dim=-1)


def nearest_center_fwd(points: torch.Tensor, centers: torch.Tensor, chunk: int):
    """-> index [N] int64 of the nearest centre, squared distance [N]: a GEMM per chunk for the
    arg-min, the winner's distance recomputed from exact differences."""
    if points.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=points.device), points.new_zeros(0)
    acc = torch.promote_types(points.dtype, torch.float32)  # half types: scores in float32
    p, c = points.to(acc), centers.to(acc)
    c2 = c.pow(2).sum(dim=1)
    index = torch.cat([(c2 - 2 * block @ c.T).argmin(dim=1) for block in p.split(max(1, int(chunk)))])
    return index, (p - c[index]).pow(2).sum(dim=1).to(points.dtype)


def segment_moments_fwd(x: torch.Tensor, weights: torch.Tensor, segment_ids: torch.Tensor, num_segments: int):
    """-> weight sums [S], weighted means [S, D], weighted (biased) covariances [S, D, D]; 0 where empty."""
    D = x.shape[1]
    wsum = x.new_zeros(num_segments).index_add(0, segment_ids, weights)
    safe = torch.where(wsum > 0, wsum, torch.ones_like(wsum))
    mean = x.new_zeros(num_segments, D).index_add(0, segment_ids, weights[:, None] * x) / safe[:, None]
    mean = mean * (wsum > 0)[:, None]
    d = x - mean[segment_ids]
    outer = weights[:, None, None] * d[:, :, None] * d[:, None, :]
    cov = x.new_zeros(num_segments, D, D).index_add(0, segment_ids, outer) / safe[:, None, None]
    return wsum, mean, cov


def segment_moments_bwd(v_wsum, v_mean, v_cov, x, weights, segment_ids, wsum, mean, cov):
    """-> v_x [N, D], v_weights [N], by autograd through :func:`segment_moments_fwd`."""
    del wsum, mean, cov  # recomputed with their graph
    pairs = [(i, g) for i, g in enumerate((v_wsum, v_mean, v_cov)) if g is not None]
    if not pairs:
        return torch.zeros_like(x), torch.zeros_like(weights)
    with torch.enable_grad():
        xg, wg = x.detach().requires_grad_(), weights.detach().requires_grad_()
        outs = segment_moments_fwd(xg, wg, segment_ids, pairs[0][1].shape[0])  # S: any cotangent's rows
        v_x, v_w = torch.autograd.grad([outs[i] for i, _ in pairs], [xg, wg], [g for _, g in pairs], allow_unused=True)
    return (v_x if v_x is not None else torch.zeros_like(x)), (v_w if v_w is not None else torch.zeros_like(weights))
