"""Deterministic sampling for training: batches and noise levels are pure functions of
``(seed, micro-step, process index)``, so a resumed run continues exactly where it stopped."""

from __future__ import annotations

from typing import List

import torch

from .config import TrainConfig

__all__ = ["batch_indices", "sample_sigmas"]


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
