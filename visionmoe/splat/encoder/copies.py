"""Exact duplicate Gaussians, coded once with a copy count.

Generator exports often repeat Gaussians bit for bit (one scene here: 28% of its rows). Coding
every copy spends a whole primitive's bits on a value the decoder already has; a peer that
sorts its rows (SOG) gets them almost free from its image coder. The encoder therefore codes
each group of identical rows once, as a leaf with a copy count (format 5.1, fine-tier stream
``copies``), and the decoder repeats the leaf: the decoded scene renders as the source does,
copies included. Rows that differ in any bit (a -0.0 against a 0.0 too) are not copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..io import GaussianScene
from ..pgms.bitstream import MAX_COPIES

_CHUNK = 1 << 16  # rows hashed at once (bounded temporaries on multi-million scenes)


@dataclass(frozen=True)
class Copies:
    """One coded row per group of up to ``MAX_COPIES`` identical source rows."""

    rows: torch.Tensor  # [U] the coded rows' indices in the source (ascending)
    count: torch.Tensor  # [U] int64, how many source rows each coded row stands for (1-MAX_COPIES)
    entry: torch.Tensor  # [N] the coded row each source row is a copy of (index into ``rows``)

    def sum_per_entry(self, values: torch.Tensor) -> torch.Tensor:
        """Per coded row, the sum of ``values`` [N] over its copies (e.g. contributions)."""
        return torch.zeros(len(self.rows), dtype=values.dtype).index_add_(0, self.entry, values)


def _row_words(scene: GaussianScene, rows) -> np.ndarray:
    """The ``rows`` (a slice or an index array) of every attribute as float32 bit patterns
    [R, D] (uint32)."""
    parts = [scene.means, scene.quats, scene.log_scales, scene.opacity_logits.reshape(-1, 1), scene.sh_dc,
             scene.sh_rest.reshape(scene.num_gaussians, -1)]
    if not isinstance(rows, slice):
        rows = torch.from_numpy(rows)
    return np.ascontiguousarray(np.concatenate([p[rows].detach().cpu().float().numpy() for p in parts], 1)).view(np.uint32)


def find_copies(scene: GaussianScene) -> Copies | None:
    """The groups of bitwise-identical rows of ``scene``; None where every row is distinct.

    Rows are hashed (64-bit, two odd multipliers per column), sorted by hash, and a row joins
    the group of the run's first row only where every bit matches it (a hash collision between
    different rows leaves them distinct). Groups above ``MAX_COPIES`` rows are coded as several
    entries."""
    n = scene.num_gaussians
    if n < 2:
        return None
    d = _row_words(scene, slice(0, 1)).shape[1]
    mult = (np.random.default_rng(0x9E3779B9).integers(1, 1 << 62, size=(2, d), dtype=np.int64) * 2 + 1).astype(np.uint64)
    h = np.empty(n, np.uint64)
    with np.errstate(over="ignore"):
        for a in range(0, n, _CHUNK):
            w = _row_words(scene, slice(a, min(n, a + _CHUNK))).astype(np.uint64)
            h[a: a + len(w)] = (w * mult[0]).sum(1) ^ ((w * mult[1]).sum(1) >> np.uint64(29))
    order = np.argsort(h, kind="stable")
    hs = h[order]
    same_hash = np.zeros(n, bool)
    same_hash[1:] = hs[1:] == hs[:-1]
    if not same_hash.any():
        return None
    run_first = order[np.maximum.accumulate(np.where(same_hash, 0, np.arange(n)))]  # per sorted row
    cand = np.flatnonzero(same_hash)
    equal = np.zeros(n, bool)
    for a in range(0, len(cand), _CHUNK):
        c = cand[a: a + _CHUNK]
        rows, firsts = order[c], run_first[c]
        equal[c] = (_row_words(scene, rows) == _row_words(scene, firsts)).all(1)
    if not equal.any():
        return None
    # the group of a sorted row: its run's first row where it equals it, else itself
    group_of = np.where(equal, run_first, order)
    owner = np.empty(n, np.int64)
    owner[order] = group_of  # per source row: the first row of its group (stable sort: the lowest index)
    # rank within the group (source order), entries of at most MAX_COPIES rows
    by_group = np.lexsort((np.arange(n), owner))
    g_sorted = owner[by_group]
    start = np.ones(n, bool)
    start[1:] = g_sorted[1:] != g_sorted[:-1]
    rank = np.arange(n) - np.maximum.accumulate(np.where(start, np.arange(n), 0))
    is_head = rank % MAX_COPIES == 0
    head = by_group[np.maximum.accumulate(np.where(is_head, np.arange(n), 0))]  # per sorted row: its entry's first
    entry_head = np.empty(n, np.int64)
    entry_head[by_group] = head
    rows = np.flatnonzero(entry_head == np.arange(n))
    entry = np.searchsorted(rows, entry_head)
    count = np.bincount(entry, minlength=len(rows))
    return Copies(torch.from_numpy(rows), torch.from_numpy(count.astype(np.int64)), torch.from_numpy(entry))

