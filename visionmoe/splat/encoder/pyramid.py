"""The mixture pyramid: a coarse-to-fine tree of moment-matched Gaussian mixture centres.

Leaves are the (pruned) dense Gaussians sorted along a 3D Morton curve. Each coarser level
partitions the level below into groups of spatially adjacent nodes: the nodes sharing an
octree cell at the depth that gives about ``branching`` nodes per cell, cut into runs of at
most ``2 * branching`` along the curve. A group's centre is the contribution-weighted
moment-matched merge of its members (:func:`visionmoe.splat.update.merge`). Because groups are
contiguous runs and parents keep their first child's order, a node's children are a contiguous
range of the level below: the bitstream codes only child counts.

Each node also carries its **distortion**: the contribution-weighted error of rendering the
node instead of the leaves below it (:func:`pair_error`, in squared-colour units), which the
capacity allocator trades against bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._math import SH_C0, covariance
from ..io import GaussianScene
from .update import merge

__all__ = ["Pyramid", "build_pyramid", "drop_leaves", "pair_error", "morton_codes", "GEOMETRY_CONTRAST"]

# Squared colour error charged when a Gaussian's footprint moves off its own place
# (1 - Bhattacharyya overlap). Calibrated against renders of the shared scenes: smaller values
# let the allocator merge too eagerly (a merged blob also covers pixels its members never did).
GEOMETRY_CONTRAST = 0.5
_CHUNK = 1 << 18  # rows per block when a pass over all leaves would need large temporaries


def morton_codes(points: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bits: int = 21) -> torch.Tensor:
    """63-bit Morton codes [N] (int64) of points quantised to ``bits`` per axis inside [lo, hi]."""
    span = (hi - lo).clamp_min(1e-12)
    q = ((points - lo) / span * ((1 << bits) - 1)).round().clamp(0, (1 << bits) - 1).to(torch.int64)
    code = torch.zeros(points.shape[0], dtype=torch.int64)
    for axis in range(3):
        code |= _spread3(q[:, axis]) << axis
    return code


def _spread3(x: torch.Tensor) -> torch.Tensor:
    """Insert two zero bits between the 21 low bits of x (magic-number bit interleaving)."""
    x = x & 0x1FFFFF
    x = (x | (x << 32)) & 0x1F00000000FFFF
    x = (x | (x << 16)) & 0x1F0000FF0000FF
    x = (x | (x << 8)) & 0x100F00F00F00F00F
    x = (x | (x << 4)) & 0x10C30C30C30C30C3
    x = (x | (x << 2)) & 0x1249249249249249
    return x


def pair_error(a: GaussianScene, b: GaussianScene, *, sh_b_degree: int | None = None) -> torch.Tensor:
    """Per-row error [N] of rendering Gaussian ``b[i]`` in place of ``a[i]`` (squared colour units).

    Colour: mean over view directions of the squared SH colour difference (every real
    orthonormal SH basis function has mean square SH_C0^2). Geometry: GEOMETRY_CONTRAST x
    (1 - Bhattacharyya coefficient) of isotropic approximations, plus the opacity change.
    ``sh_b_degree`` truncates b's view-dependent bands (a lower-degree tier).
    """
    return _pair_error_terms(_terms(a), _terms(b, sh_b_degree))


def _terms(s: GaussianScene, sh_degree: int | None = None) -> dict:
    """The per-Gaussian quantities :func:`pair_error` compares (computed once per side)."""
    sh = s.sh.float()
    if sh_degree is not None:
        sh = sh.clone()
        sh[:, (sh_degree + 1) ** 2:] = 0
    ls = s.log_scales.float()
    return {"sh": sh, "var": torch.exp(2 * ls).mean(1), "means": s.means.float(),
            "ls_sorted": torch.sort(ls, 1).values, "alpha": torch.sigmoid(s.opacity_logits.float())}


def _pair_error_terms(ta: dict, tb: dict) -> torch.Tensor:
    colour = (ta["sh"] - tb["sh"]).pow(2).sum((1, 2)) * SH_C0**2
    va, vb = ta["var"], tb["var"]
    d2 = (ta["means"] - tb["means"]).pow(2).sum(1)
    bc = (2 * torch.sqrt(va * vb) / (va + vb)).pow(1.5) * torch.exp(-d2 / (4 * (va + vb)))
    # anisotropic shape change: relative log-scale change on each (sorted) axis
    shape = (ta["ls_sorted"] - tb["ls_sorted"]).pow(2).mean(1)
    dalpha = ta["alpha"] - tb["alpha"]
    geom = (1 - bc).clamp(0, 1) + shape.clamp(max=1) * 0.25 + dalpha.pow(2)
    return colour + GEOMETRY_CONTRAST * geom


@dataclass
class Pyramid:
    levels: list[GaussianScene]  # level 0 (coarsest) ... levels[-1] = leaves (dense, Morton order)
    weight: list[torch.Tensor]  # [n_l] summed image-space contribution of the leaves below
    parent: list[torch.Tensor]  # [n_l] index of the parent in level l-1 (level 0: empty)
    child_count: list[torch.Tensor]  # [n_l] children in level l+1 (leaves: 0)
    distortion: list[torch.Tensor]  # [n_l] contribution-weighted error vs the leaves below
    leaf_order: torch.Tensor  # [N] index into the input scene of each leaf
    leaf_weight: torch.Tensor  # [N] leaf contributions
    copies: torch.Tensor | None = None  # [N] int64, the source rows each leaf stands for (None: one each)

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    def ancestors(self, level: int) -> torch.Tensor:
        """Index [N] of each leaf's ancestor at ``level``."""
        idx = torch.arange(self.levels[-1].num_gaussians)
        for lv in range(self.num_levels - 1, level, -1):
            idx = self.parent[lv][idx]
        return idx


def _group(codes: torch.Tensor, branching: int) -> torch.Tensor:
    """Group ids [n] (non-decreasing) for Morton-sorted codes: octree cells at the depth giving
    ~``branching`` nodes per cell, split into runs of at most 2 * branching."""
    n = codes.shape[0]
    target = max(n / branching, 1.0)
    best_t, best_gap = 0, float("inf")
    for t in range(0, 22):
        prefix = codes >> (3 * (21 - t))
        count = 1 + int((prefix[1:] != prefix[:-1]).sum()) if n > 1 else 1
        gap = abs(count - target) / target
        if count >= target or gap < best_gap:
            if gap < best_gap:
                best_t, best_gap = t, gap
        if count >= target:
            break
    prefix = codes >> (3 * (21 - best_t))
    new_cell = torch.ones(n, dtype=torch.bool)
    new_cell[1:] = prefix[1:] != prefix[:-1]
    pos = torch.arange(n)
    cell_start = torch.cummax(torch.where(new_cell, pos, torch.zeros_like(pos)), 0).values
    start = new_cell | ((pos - cell_start) % (2 * branching) == 0)
    return torch.cumsum(start.to(torch.int64), 0) - 1


def build_pyramid(scene: GaussianScene, weights: torch.Tensor, *, branching: int = 8, min_root: int = 64,
                  max_levels: int = 8) -> Pyramid:
    """Build the pyramid over ``scene`` (already pruned) with per-Gaussian contributions ``weights``."""
    scene = scene.to("cpu")
    weights = weights.detach().float().cpu()
    lo, hi = scene.means.min(0).values, scene.means.max(0).values
    codes = morton_codes(scene.means.float(), lo, hi)
    order = torch.argsort(codes, stable=True)
    leaves = scene.subset(order)
    w_leaf = weights[order]
    codes = codes[order]
    levels, wts, parents = [leaves], [w_leaf], []
    cov = covariance(leaves.quats, leaves.log_scales, torch.float64)
    current, w_cur = leaves, w_leaf
    while current.num_gaussians > min_root and len(levels) < max_levels:
        gid = _group(codes, branching)
        g = int(gid[-1]) + 1
        if g > 0.75 * current.num_gaussians:  # no real reduction left
            break
        merged, wsum, cov = merge(current, w_cur, gid, g, cov=cov)
        first = torch.ones(gid.shape[0], dtype=torch.bool)
        first[1:] = gid[1:] != gid[:-1]
        codes = codes[first]
        parents.append(gid)
        levels.append(merged)
        wts.append(torch.zeros(g).index_add_(0, gid, w_cur))
        current, w_cur = merged, wts[-1]
    levels.reverse()
    wts.reverse()
    parents = [torch.zeros(0, dtype=torch.int64)] + parents[::-1]
    child_count = [torch.bincount(parents[lv + 1], minlength=levels[lv].num_gaussians) for lv in range(len(levels) - 1)]
    child_count.append(torch.zeros(levels[-1].num_gaussians, dtype=torch.int64))
    pyr = Pyramid(levels, wts, parents, child_count, [], order, w_leaf)
    # distortion of each internal node vs the leaves below it: chunks of leaves (bounded
    # temporaries on multi-million scenes), the leaf-side terms computed once for all levels
    L = len(levels)
    anc = [torch.arange(leaves.num_gaussians)]  # each leaf's ancestor per level, finest first
    for lv in range(L - 1, 0, -1):
        anc.insert(0, parents[lv][anc[0]])
    dist = [torch.zeros(levels[lv].num_gaussians, dtype=torch.float64) for lv in range(L - 1)]
    for s in range(0, leaves.num_gaussians, _CHUNK):
        ta = _terms(leaves.subset(slice(s, s + _CHUNK)))
        wl = w_leaf[s: s + _CHUNK]
        for lv in range(L - 1):
            a = anc[lv][s: s + _CHUNK]
            err = _pair_error_terms(ta, _terms(levels[lv].subset(a))) * wl
            dist[lv].index_add_(0, a, err.double())
    pyr.distortion = [d.float() for d in dist] + [torch.zeros(levels[-1].num_gaussians)]
    return pyr


def drop_leaves(pyr: Pyramid, keep: torch.Tensor) -> tuple[Pyramid, list[torch.Tensor]]:
    """The pyramid without the leaves outside ``keep`` [N] (bool), and without the interior nodes
    left with no leaf below: -> (pyramid, index of each kept node in ``pyr`` per level).

    Kept interior nodes keep their merged parameters (the moments of every original leaf below,
    the dropped ones included): only leaves are dropped, so a cut through every leaf renders
    exactly the kept leaves, and the tree's codes for the surviving nodes do not change (the
    pruning search reuses the base's quantisation). Weights, child counts and distortions
    (error against the kept leaves) are those of the smaller tree. ``leaf_order`` indexes the
    kept leaves' source rows in ascending order (``pyr.leaf_order[keep]`` sorted)."""
    keep = keep.to(torch.bool)
    if keep.shape != (pyr.levels[-1].num_gaussians,):
        raise ValueError(f"keep must have shape ({pyr.levels[-1].num_gaussians},), got {tuple(keep.shape)}")
    L = pyr.num_levels
    alive = [keep]
    for lv in range(L - 1, 0, -1):
        up = torch.zeros(pyr.levels[lv - 1].num_gaussians, dtype=torch.bool)
        up[pyr.parent[lv][alive[0]]] = True
        alive.insert(0, up)
    index = [a.nonzero().squeeze(1) for a in alive]
    remap = [torch.cumsum(a.to(torch.int64), 0) - 1 for a in alive]
    parents = [torch.zeros(0, dtype=torch.int64)] + [remap[lv - 1][pyr.parent[lv][index[lv]]] for lv in range(1, L)]
    levels = [pyr.levels[lv].subset(index[lv]) for lv in range(L)]
    wts = [pyr.weight[-1][index[-1]]]
    for lv in range(L - 1, 0, -1):
        wts.insert(0, torch.zeros(len(index[lv - 1])).index_add_(0, parents[lv], wts[0]))
    child_count = [torch.bincount(parents[lv + 1], minlength=len(index[lv])) for lv in range(L - 1)]
    child_count.append(torch.zeros(len(index[-1]), dtype=torch.int64))
    # the dropped leaves' share of each surviving ancestor's distortion
    dist = [pyr.distortion[lv].double().clone() for lv in range(L - 1)]
    gone = (~keep).nonzero().squeeze(1)
    leaves, w_leaf = pyr.levels[-1], pyr.weight[-1]
    for s in range(0, len(gone), _CHUNK):
        g = gone[s: s + _CHUNK]
        ta, anc = _terms(leaves.subset(g)), g
        for lv in range(L - 2, -1, -1):
            anc = pyr.parent[lv + 1][anc]
            err = _pair_error_terms(ta, _terms(pyr.levels[lv].subset(anc))) * w_leaf[g]
            dist[lv].index_add_(0, anc, -err.double())
    distortion = [dist[lv][index[lv]].clamp_min(0).float() for lv in range(L - 1)]
    distortion.append(torch.zeros(len(index[-1])))
    src = pyr.leaf_order[index[-1]]
    leaf_order = torch.searchsorted(torch.sort(src).values, src)
    copies = None if pyr.copies is None else pyr.copies[index[-1]]
    return Pyramid(levels, wts, parents, child_count, distortion, leaf_order, wts[-1], copies), index
