"""Stage: tune the cut (how many of the planned splits are coded) against real encoded bytes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..pgms import bitstream as bs
from .pyramid import Pyramid
from .rung import Rung
from .tree import SceneMeta


@dataclass
class Encoding:
    """A .pgms file and what it codes: the rung, the cut (k splits), primitives per level."""

    data: bytes
    rung: Rung
    k: int  # splits of the rung's plan coded
    terminal: list[int]  # terminal primitives per level
    coded: list[int]  # coded nodes per level
    stats: list = field(default_factory=list)  # (level, stream, bytes, coder) of a full encode

    @property
    def nbytes(self) -> int:
        return len(self.data)


def split_masks(pyr: Pyramid, rung: Rung, k: int) -> list[np.ndarray]:
    split = [np.zeros(lv.num_gaussians, bool) for lv in pyr.levels]
    lv_, idx_ = rung.plan.order_level[:k], rung.plan.order_index[:k]
    for lv in range(pyr.num_levels - 1):
        split[lv][idx_[lv_ == lv]] = True
    return split


def coded_masks(pyr: Pyramid, split: list[np.ndarray]) -> list[np.ndarray]:
    """The coded nodes per level: the roots and the children of split nodes."""
    coded = [np.ones(pyr.levels[0].num_gaussians, bool)]
    for lv in range(1, pyr.num_levels):
        coded.append(split[lv - 1][pyr.parent[lv].numpy()])
    return coded


def encode_cut(pyr: Pyramid, rung: Rung, k: int, meta: SceneMeta, *, fast: bool,
               stream_cache: dict | None = None) -> Encoding:
    """The .pgms of the first ``k`` splits of the rung's plan (``fast``: the probe coders only;
    ``stream_cache``: see ``bitstream.write_pgms``)."""
    split = split_masks(pyr, rung, k)
    coded = coded_masks(pyr, split)
    level_symbols, child_counts, terminal = [], [], []
    for lv in range(pyr.num_levels):
        m = coded[lv]
        level_symbols.append({name: v[m] for name, v in rung.symbols[lv].items()})
        cc = np.where(split[lv], pyr.child_count[lv].numpy(), 0)[m]
        child_counts.append(cc)
        terminal.append(int((cc == 0).sum()))
    stats = []
    fm = meta.file_meta(rung.quant, rung.tables.palettes)
    data = bs.write_pgms(fm, rung.tables.shape_codebook, rung.tables.sh_codebook, level_symbols, child_counts,
                         fast=fast, stats=None if fast else stats, stream_cache=stream_cache)
    return Encoding(data, rung, k, terminal, [int(m.sum()) for m in coded], stats)


class CutTuner:
    """Finds the number of splits k whose real file lands in [0.97, 1.0] x target when possible
    (secant steps on the estimated rate curve, bisection as the fallback). Full encodes try every
    coder; probe encodes (raw/rANS only, 4-20x cheaper) steer the search (scaled by the full/probe
    size ratio once one full encode is known), so most tunings need 1-2 full encodes."""

    def __init__(self, pyr: Pyramid, rung: Rung, meta: SceneMeta, target: int):
        self.pyr, self.rung, self.meta, self.target = pyr, rung, meta, target
        self.kmax = len(rung.plan.order_level)
        self.full: dict[int, Encoding] = {}
        self.fast: dict[int, bytes] = {}
        # Cuts a few splits apart code most level streams identically (every root, the levels
        # whose splits did not change): each distinct stream is coded once per tuner.
        self.streams: dict = {}

    def full_size(self, kk: int) -> int:
        if kk not in self.full:
            self.full[kk] = encode_cut(self.pyr, self.rung, kk, self.meta, fast=False, stream_cache=self.streams)
        return self.full[kk].nbytes

    def fast_size(self, kk: int) -> int:
        if kk not in self.fast:
            self.fast[kk] = encode_cut(self.pyr, self.rung, kk, self.meta, fast=True, stream_cache=self.streams).data
        return len(self.fast[kk])

    def _search(self, k: int, size_of, lo: float, hi: float) -> int:
        target, plan = self.target, self.rung.plan
        lo_k, hi_k = 0, self.kmax + 1  # hi_k: smallest k known to be too big (exclusive bound)
        for _ in range(16):
            s = size_of(k)
            if lo * target <= s <= hi * target:
                return k
            if s > hi * target:
                hi_k = k
            else:
                lo_k = k
                if k == self.kmax:
                    return k
            if hi_k - lo_k <= 1:
                return lo_k
            est = plan.rate[k] + self.rung.fixed_bytes
            goal = plan.rate[k] + (target * (lo + hi) / 2 - s) * (plan.rate[k] / max(est, 1))
            k_new = int(np.searchsorted(plan.rate, goal, side="right") - 1)
            if not lo_k < k_new < hi_k:
                k_new = (lo_k + hi_k) // 2
            k = k_new
        return k

    def probe(self, k: int, scale: float | None = None) -> tuple[int, float, bytes]:
        """Tune on probe encodes only: -> (k, probe size, the decodable probe file at k).

        A full encode picks the smallest of a superset of the probe's coders, so the probe size
        is an upper bound of the real one: a probe under the target is a file under it. With
        ``scale`` (full / probe size measured on another encode) the search aims the scaled
        size at the target instead. (Full encodes of multi-MB levels cost 10-20x a probe.)"""
        if scale is None:
            k = self._search(k, self.fast_size, 0.98, 1.0)
        else:
            k = self._search(k, lambda kk: scale * self.fast_size(kk), 0.975, 0.995)
        return k, self.fast_size(k), self.fast[k]

    def finish(self, k: int) -> tuple[int, int]:
        """Tune on full encodes from ``k``: -> (k, real size); ``self.full[k]`` holds the file."""
        if not 0.97 * self.target <= self.full_size(k) <= self.target and len(self.full) == 1:
            # first full encode missed: steer by scaled probe encodes, then confirm with full ones
            scale = self.full_size(k) / max(self.fast_size(k), 1)
            k = self._search(k, lambda kk: scale * self.fast_size(kk), 0.975, 0.995)
        k = self._search(k, self.full_size, 0.97, 1.0)
        if self.full_size(k) > self.target:  # fall back to the largest measured cut under the target
            under = [kk for kk in self.full if self.full[kk].nbytes <= self.target]
            if under:
                k = max(under)
        return k, self.full_size(k)

    def release(self) -> None:
        """Drop the encodes and the quantised symbols (a rung that lost the render check)."""
        self.full, self.fast, self.streams = {}, {}, {}
        self.rung.symbols = []


def tune_cut(pyr: Pyramid, rung: Rung, k: int, meta: SceneMeta, target: int) -> Encoding:
    """Tune the cut size against real encoded bytes from ``k``: -> the chosen encoding."""
    tuner = CutTuner(pyr, rung, meta, target)
    k, _ = tuner.finish(k)
    return tuner.full[k]
