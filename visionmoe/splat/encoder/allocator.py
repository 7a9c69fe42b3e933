"""Rate-adaptive capacity allocator: the tiered budget under a byte target, by RD optimisation.

Decisions, per encoding:

* the **quality preset**: a rung of :data:`GEOMETRY_LADDER` (position step relative to each
  primitive's scale, colour/scale/rotation/opacity precision, size of the scale-rotation
  codebook of the coarse tiers) and a rung of :data:`APPEARANCE_LADDER` (the fraction of fine
  primitives that keep view-dependent SH, ranked by contribution so low-contribution ones
  drop to degree 0, and the SH degree and size of the appearance codebook);
* the **cut** through the pyramid: which nodes are split into their children, hence how many
  primitives each tier (pyramid level) contributes.

Distortion is contribution-weighted: a node's cost as a terminal primitive is its merge error
against the dense leaves below it (``Pyramid.distortion``) plus its quantisation error under
the preset, both in summed squared colour over the rendered pixels, so ``distortion /
pixels`` is an MSE proxy. Rate is each node's empirical entropy under the level's symbol
statistics (the static models the rANS coder stores). For each preset the cut is grown
greedily by distortion reduction per byte, made monotone down the tree so the chosen set
of splits is always a valid (ancestor-closed) cut; the preset with the least distortion
within the budget wins (coordinate-wise hill climbing over the two ladders). The codec then
tunes the cut size against real encoded bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Preset", "GEOMETRY_LADDER", "CLIMB_START_GEOMETRY", "APPEARANCE_LADDER", "geometry_rung", "appearance_rung",
           "make_preset", "CutPlan", "plan_cut", "symbol_bits"]


@dataclass(frozen=True)
class Preset:
    pos_rel: float  # position step / primitive geometric-mean scale
    dc_step: float  # SH DC quantisation step
    ls_step: float  # log-scale step
    op_bits: int  # opacity bits
    rot_bits: int  # bits per smallest-three quaternion component
    sh_fraction: float  # fraction of fine primitives (by contribution) keeping view-dependent SH
    sh_degree: int  # max SH degree of the appearance prototypes
    sh_codebook: int  # appearance codebook size cap
    shape_codebook: int  # scale-rotation codebook size cap (coarse tiers)
    geometry: float = -1  # rung indices this preset was made from (either may be fractional)
    appearance: float = -1
    sh_step: float = 0.0  # > 0: per-primitive SH quantised at this step instead of a codebook
    bits_from: int | None = None  # the geometry rung whose bit depths a fractional one holds (geometry_rung)
    palettes_from: float | None = None  # the geometry rung whose steps choose the source palettes (rung.active_palettes)

    def __post_init__(self):
        if not (0 < self.pos_rel and 0 < self.dc_step and 0 < self.ls_step and 0 <= self.sh_fraction <= 1):
            raise ValueError(f"invalid preset {self}")


# Two ladders, coarse to fine; a preset is one rung of each (the allocator picks the pair).
# Geometry: (pos_rel, dc_step, ls_step, op_bits, rot_bits, shape codebook cap). The colour
# step of rungs 1-6 is coarse for their geometry: measured per attribute (plant, rung 2), an
# exact colour bought 0.01 dB for 30% more bytes, and 1/4 instead of 1/8 saved 5.5% for 0.06 dB,
# while coarser positions, opacities or rotations cost 0.4-1.3 dB per % saved.
GEOMETRY_LADDER: tuple[tuple, ...] = (
    (2.00, 1 / 4, 0.8, 2, 3, 256),
    (1.40, 1 / 4, 0.6, 3, 3, 512),
    (1.00, 1 / 5, 0.45, 3, 4, 512),
    (0.80, 1 / 6, 0.38, 4, 4, 1024),
    (0.60, 1 / 8, 0.30, 4, 5, 1024),
    (0.45, 1 / 10, 0.22, 5, 5, 1024),
    (0.35, 1 / 14, 0.16, 5, 6, 1024),
    (0.25, 1 / 32, 0.12, 6, 7, 2048),
    (0.18, 1 / 48, 0.08, 6, 7, 2048),
    (0.12, 1 / 64, 0.06, 7, 8, 4096),
    (0.085, 1 / 80, 0.055, 7, 8, 4096),
    (0.06, 1 / 96, 0.05, 8, 8, 4096),
    (0.045, 1 / 128, 0.04, 8, 9, 8192),
    (0.035, 1 / 192, 0.03, 9, 9, 8192),
    (0.026, 1 / 320, 0.021, 10, 10, 8192),
    (0.02, 1 / 512, 0.015, 10, 11, 8192),
    (0.0155, 1 / 724, 0.011, 10, 11, 8192),
    (0.012, 1 / 1024, 0.008, 11, 12, 8192),
)
# The fine rungs are where every leaf fits (about 5x on real scenes, below on small ones):
# there a rung that cannot fill the budget keeps every leaf and the next finer one must merge,
# so the byte gap between two rungs is rate the encoder cannot spend (merged primitives render
# far worse than coarser steps). Hence no step between neighbours coarsens the position step by
# more than 1.5x: the rungs at 0.085, 0.026 and 0.0155 are their neighbours' geometric means
# (bit depths in between), and 0.012 one step past the former top; none was fitted to a scene.
# The hill climb starts at this rung whatever the ladder's length.
CLIMB_START_GEOMETRY = 7
# Appearance: (fraction of fine primitives keeping view-dependent SH, SH degree, codebook size
# [, per-primitive step]). The last rungs code each primitive's SH on a uniform grid (no
# codebook): near-lossless appearance when the budget allows.
APPEARANCE_LADDER: tuple[tuple, ...] = (
    (0.00, 0, 0),
    (0.25, 1, 32),
    (0.50, 1, 64),
    (0.75, 2, 128),
    (1.00, 3, 128),
    (1.00, 3, 256),
    (1.00, 3, 512),
    (1.00, 3, 1024),
    (1.00, 3, 2048),
    (1.00, 3, 4096),
    (1.00, 3, 0, 1 / 24),
    (1.00, 3, 0, 1 / 64),
    (1.00, 3, 0, 1 / 128),
    (1.00, 3, 0, 1 / 256),
)


# A fractional geometry rung g + t (0 < t < 1) lies between rungs g and g + 1: its steps are
# their geometric interpolation, its bit depths and codebook cap round the linear one. The
# encoder moves a file that keeps every leaf short of its target to one (encoder/rung_search.py
# _fill_between_rungs): the byte gap to the next ladder rung, which would have to merge, is rate
# the file could not otherwise spend. A bit depth that rounds up adds its cost at once (guitar at
# SOG's size: rotations 8 -> 9 bits at t = 0.5, +2.8% of the file, over the target from a file
# at 97.9% of it), so ``bits_from`` (g or g + 1) can hold the bit depths of one end while the
# steps and the codebook cap move: rung g's bits with finer steps fill the sizes the rounding
# jumps over.
def geometry_rung(geometry: float, bits_from: int | None = None) -> tuple:
    """The geometry rung's parameters, for an integer or a fractional index (``bits_from``: the
    ladder rung whose opacity and rotation bit depths it uses; default: the rounded interpolation)."""
    g = int(geometry)
    t = float(geometry) - g
    if bits_from is not None and bits_from not in (g, math.ceil(geometry)):
        raise ValueError(f"preset rungs: bits_from must be a ladder rung next to the geometry rung {geometry}, "
                         f"got {bits_from!r}")
    if t == 0:
        return GEOMETRY_LADDER[g]
    lo, hi = GEOMETRY_LADDER[g], GEOMETRY_LADDER[g + 1]
    steps = tuple(a if a == b else float(a ** (1 - t) * b ** t) for a, b in zip(lo[:3], hi[:3]))
    ints = tuple(int(math.floor(a + t * (b - a) + 0.5)) for a, b in zip(lo[3:], hi[3:]))
    if bits_from is not None:
        ints = tuple(GEOMETRY_LADDER[bits_from][3:5]) + ints[2:]
    return steps + ints


# A fractional appearance rung a + t lies between two per-primitive SH rungs (a grid step each):
# its step is their geometric interpolation, rounded to float32 as section SHQP stores it (the
# decoder then dequantises with the encoder's step). At the finest geometry rung it is the only
# way left to spend a budget that every leaf leaves short (fruit_drops_minimal at SOG's size:
# every leaf at (17, 12) took 93.6% of it, at (17, 13) 105%). Between codebook rungs there is
# no such interpolation.
def appearance_rung(appearance: float) -> tuple:
    """The appearance rung's parameters, for an integer index or a fractional one between two
    per-primitive SH rungs (ValueError elsewhere)."""
    a = int(appearance)
    t = float(appearance) - a
    if t == 0:
        return APPEARANCE_LADDER[a]
    lo, hi = APPEARANCE_LADDER[a], APPEARANCE_LADDER[a + 1] if a + 1 < len(APPEARANCE_LADDER) else ()
    if len(lo) < 4 or len(hi) < 4:
        raise ValueError(f"preset rungs: a fractional appearance rung must lie between two per-primitive SH rungs "
                         f"({_first_grid_rung()}-{len(APPEARANCE_LADDER) - 1}), got {appearance}")
    return lo[:3] + (float(np.float32(lo[3] ** (1 - t) * hi[3] ** t)),)


def _first_grid_rung() -> int:
    return next(i for i, r in enumerate(APPEARANCE_LADDER) if len(r) == 4)


def make_preset(geometry: float, appearance: float, bits_from: int | None = None,
                palettes_from: float | None = None) -> Preset:
    """The preset of rungs ``(geometry, appearance)`` (``bits_from``: :func:`geometry_rung`;
    ``palettes_from``: the geometry rung whose steps decide which of the source's value tables
    are used, default ``geometry``)."""
    if not (0 <= geometry <= len(GEOMETRY_LADDER) - 1 and 0 <= appearance <= len(APPEARANCE_LADDER) - 1):
        raise ValueError(f"preset rungs must be in [0, {len(GEOMETRY_LADDER) - 1}] x [0, {len(APPEARANCE_LADDER) - 1}], "
                         f"got ({geometry}, {appearance})")
    if palettes_from is not None and not 0 <= palettes_from <= len(GEOMETRY_LADDER) - 1:
        raise ValueError(f"preset rungs: palettes_from must be a geometry rung in [0, {len(GEOMETRY_LADDER) - 1}], "
                         f"got {palettes_from!r}")
    pos_rel, dc_step, ls_step, op_bits, rot_bits, shape_cb = geometry_rung(geometry, bits_from)
    frac, deg, sh_cb, *step = appearance_rung(appearance)
    return Preset(pos_rel, dc_step, ls_step, op_bits, rot_bits, frac, deg, sh_cb, shape_cb, geometry, appearance,
                  step[0] if step else 0.0, bits_from, palettes_from)


def symbol_bits(values: np.ndarray) -> np.ndarray:
    """Per-symbol cost in bits [N] of an integer stream under its own empirical distribution."""
    v = np.asarray(values).reshape(-1)
    if v.size == 0:
        return np.zeros(0)
    lo, hi = int(v.min()), int(v.max())
    if hi - lo <= 4 * v.size + 1024:  # a histogram, not a sort: the same bits, 5-10x less time
        at = v.astype(np.intp, copy=False) - lo
        counts = np.bincount(at, minlength=hi - lo + 1)
        with np.errstate(divide="ignore"):  # values absent from the stream are never looked up
            return -np.log2(counts / v.size)[at]
    uniq, inv, counts = np.unique(v, return_inverse=True, return_counts=True)
    p = counts / v.size
    return -np.log2(p)[inv]


@dataclass
class CutPlan:
    """Greedy split order for one preset: splitting order[:k] gives rate[k] bytes, distortion[k]."""

    order_level: np.ndarray  # [S] level of the k-th split node
    order_index: np.ndarray  # [S] index within its level
    rate: np.ndarray  # [S + 1] estimated payload bytes after k splits
    distortion: np.ndarray  # [S + 1] contribution-weighted distortion after k splits
    primitives: np.ndarray  # [S + 1] terminal primitives after k splits

    def best_within(self, budget: float) -> int:
        """Largest k whose estimated rate fits ``budget`` (0 if even the roots do not)."""
        return int(max(np.searchsorted(self.rate, budget, side="right") - 1, 0))


def plan_cut(child_count: list[torch.Tensor], parent: list[torch.Tensor], cost: list[np.ndarray],
             node_bytes: list[np.ndarray]) -> CutPlan:
    """Order the pyramid's splits by distortion reduction per byte, monotone down the tree.

    ``cost[l][i]``: distortion if node i of level l is a terminal primitive;
    ``node_bytes[l][i]``: its estimated coded size.
    """
    L = len(cost)
    gains, extra_bytes, pri = [], [], []
    for lv in range(L - 1):
        n = len(cost[lv])
        par = parent[lv + 1].numpy()
        child_cost = np.zeros(n)
        np.add.at(child_cost, par, cost[lv + 1])
        child_bytes = np.zeros(n)
        np.add.at(child_bytes, par, node_bytes[lv + 1])
        gain = cost[lv] - child_cost
        gains.append(gain)
        extra_bytes.append(child_bytes)
        pri.append(gain / np.maximum(child_bytes, 1e-9))
    # monotone priority: a node is never split before its parent
    for lv in range(1, L - 1):
        pri[lv] = np.minimum(pri[lv], pri[lv - 1][parent[lv].numpy()])
    if L == 1:
        z = np.zeros(0, np.int64)
        return CutPlan(z, z, np.array([node_bytes[0].sum()]), np.array([cost[0].sum()]), np.array([len(cost[0])]))
    all_pri = np.concatenate(pri)
    all_lv = np.concatenate([np.full(len(p), lv) for lv, p in enumerate(pri)])
    all_idx = np.concatenate([np.arange(len(p)) for p in pri])
    all_gain = np.concatenate(gains)
    all_bytes = np.concatenate(extra_bytes)
    all_children = np.concatenate([child_count[lv].numpy() for lv in range(L - 1)])
    # Internal nodes without children cannot be split (none exist by construction).
    order = np.lexsort((all_idx, all_lv, -all_pri))
    order = order[all_children[order] > 0]
    rate = np.concatenate([[node_bytes[0].sum()], node_bytes[0].sum() + np.cumsum(all_bytes[order])])
    dist = np.concatenate([[cost[0].sum()], cost[0].sum() - np.cumsum(all_gain[order])])
    prims = np.concatenate([[len(cost[0])], len(cost[0]) + np.cumsum(all_children[order] - 1)])
    return CutPlan(all_lv[order], all_idx[order], rate, dist, prims)
