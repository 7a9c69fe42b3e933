"""Codebook training: contribution-weighted k-means on attribute vectors (the encoder's
prototypes stage).

:func:`build_codebook` is a deterministic weighted Lloyd iteration, trained on a
contribution-weighted subsample and then applied to all rows (:mod:`visionmoe.splat.pgms.prototypes`
assigns each row its nearest prototype, the same exact search the training uses)."""

from __future__ import annotations

import warnings

import torch

from ..pgms.prototypes import nearest_center

__all__ = ["build_codebook", "segment_sum"]


def segment_sum(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """sum_i w_i x_i per segment -> [k, D] (one sparse-dense product; deterministic)."""
    n = x.shape[0]
    with warnings.catch_warnings():  # torch 2.11 warns about the unchecked invariants it was told to skip
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        S = torch.sparse_coo_tensor(torch.stack([ids, torch.arange(n)]), w.float(), (k, n), check_invariants=False)
    return torch.sparse.mm(S.coalesce(), x.float())


def build_codebook(
    x: torch.Tensor, weights: torch.Tensor, size: int, *, iters: int = 8, max_train: int = 32768, seed: int = 0
) -> torch.Tensor:
    """Weighted k-means codebook [min(size, N), D] for rows x [N, D] (deterministic for a seed)."""
    x = x.float()
    n = x.shape[0]
    if n == 0:
        return x.new_zeros(0, x.shape[1])
    w = weights.float().clamp_min(0) + 1e-12
    g = torch.Generator().manual_seed(seed)
    if n > max_train:  # contribution-weighted subsample (with replacement: heavy rows may repeat)
        idx = torch.multinomial(w, max_train, replacement=True, generator=g)
        x, w = x[idx], torch.ones(max_train)
        n = max_train
    k = min(size, n)
    centers = x[torch.randperm(n, generator=g)[:k]].clone()
    for _ in range(iters):
        a, _ = nearest_center(x, centers)
        wsum = torch.zeros(k).index_add_(0, a, w)
        acc = segment_sum(x, w, a, k)
        live = wsum > 0
        centers[live] = acc[live] / wsum[live, None]
        if not bool(live.all()):  # re-seed empty clusters on the worst-fit rows
            _, d = nearest_center(x, centers)
            dead = (~live).nonzero().squeeze(1)
            centers[dead] = x[torch.topk(d * w, dead.numel()).indices]
    return centers
