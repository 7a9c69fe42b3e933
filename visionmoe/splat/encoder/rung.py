"""A quality rung on a tree: its codebooks, its rate-distortion estimate, its closed-loop symbols.

``estimate_rung`` predicts per-node cost and bytes from a sample of nodes (open loop on exact
parents) for the allocator; ``quantize_tree`` quantises every node (closed loop on decoded
parents) for the cut encoder.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from ..pgms.prototypes import shape_features
from ..pgms.quantize import LevelMemo, Palettes, Parents, Quantizer, ShGrid, Tables, quantize_level, sigmoid
from .allocator import CutPlan, Preset, geometry_rung, symbol_bits
from .kmeans import build_codebook
from .pyramid import Pyramid, pair_error
from .tree import SceneMeta


@dataclass
class Rung:
    """One preset on one tree: quantiser, tables, RD estimate per node, cut plan, symbols."""

    preset: Preset
    quant: Quantizer
    tables: Tables  # shape/SH codebooks, the leaves with SH, the palettes used
    cost: list[np.ndarray]  # per level [N_l]: distortion if the node is a terminal primitive ([] once planned)
    node_bytes: list[np.ndarray]  # per level [N_l]: its estimated coded size ([] once planned)
    fixed_bytes: int  # estimated size of everything but the nodes
    plan: CutPlan | None = None
    symbols: list[dict] = field(default_factory=list)  # per level: closed-loop symbols (quantize_tree)

    @property
    def index(self) -> tuple:
        """(geometry, appearance), then ``bits_from`` where the bits or palettes are held, then
        ``palettes_from`` where the palettes are (the arguments of :func:`make_preset`)."""
        p = self.preset
        if p.palettes_from is not None:
            return p.geometry, p.appearance, p.bits_from, p.palettes_from
        return (p.geometry, p.appearance) if p.bits_from is None else (p.geometry, p.appearance, p.bits_from)


@dataclass
class CodebookCache:
    """Codebooks trained on one tree, shared by the rungs tried on it (and, ``codebooks_only``,
    by the pinned pruning variants on a subtree)."""

    sh_order: np.ndarray | None = None  # leaves by weight, descending (per tree)
    shape_feats: torch.Tensor | None = None  # shape features of the interior nodes (per tree)
    shape: dict = field(default_factory=dict)  # codebook size -> [K, 9] prototypes
    sh: dict = field(default_factory=dict)  # (SH fraction, degree, size) -> [K, k, 3] prototypes

    def codebooks_only(self) -> CodebookCache:
        return CodebookCache(shape=dict(self.shape), sh=dict(self.sh))


@dataclass
class TreeMemo:
    """Per level, the preset-independent quantisation steps (:class:`LevelMemo`) of the sample
    nodes (``estimate_rung``) and of every node (``quantize_tree``)."""

    sample: dict = field(default_factory=dict)  # level -> LevelMemo
    full: dict = field(default_factory=dict)  # level -> LevelMemo

    def level(self, table: dict, lv: int) -> LevelMemo:
        return table.setdefault(lv, LevelMemo())

    def copy(self) -> TreeMemo:
        return TreeMemo({k: v.copy() for k, v in self.sample.items()}, {k: v.copy() for k, v in self.full.items()})


# a palette is used from the rung whose uniform step is within this factor of its spacing
PALETTE_STEP_RATIO = 1.25


def active_palettes(pal: Palettes | None, preset: Preset) -> Palettes | None:
    """The source's value tables this preset uses: a channel group is coded losslessly by its
    palette when the preset's uniform step would be about as fine as the table's spacing (then
    the table has no error, for a few more bits: statue_st_peter's colours from geometry rung
    8.64 took 5.5% more of the file, a jump the fill at a byte target crosses by holding the
    palettes of a coarser rung, ``preset.palettes_from``)."""
    if pal is None:
        return None
    if preset.palettes_from is None:
        dc_step, ls_step, op_bits = preset.dc_step, preset.ls_step, preset.op_bits
    else:
        _, dc_step, ls_step, op_bits, _, _ = geometry_rung(preset.palettes_from)
    chans = []
    for c in range(3):
        if f"dc{c}" in pal.values and dc_step <= PALETTE_STEP_RATIO * pal.gap(f"dc{c}"):
            chans.append(f"dc{c}")
        if f"ls{c}" in pal.values and ls_step <= PALETTE_STEP_RATIO * pal.gap(f"ls{c}"):
            chans.append(f"ls{c}")
    if "op" in pal.values and 1 / ((1 << op_bits) - 1) <= PALETTE_STEP_RATIO * pal.gap("op", sigmoid):
        chans.append("op")
    return pal.subset(chans)


def _sh_keep_mask(pyr: Pyramid, fraction: float, cache: CodebookCache) -> np.ndarray:
    n = pyr.levels[-1].num_gaussians
    keep = np.zeros(n, bool)
    k = int(round(fraction * n))
    if k > 0:
        if cache.sh_order is None:  # one sort per pyramid, not per rung (playbot: 58 x 50 ms)
            cache.sh_order = torch.argsort(pyr.weight[-1], descending=True, stable=True).numpy()
        keep[cache.sh_order[:k]] = True
    return keep


def _shape_codebook(pyr: Pyramid, preset: Preset, seed: int, cache: CodebookCache) -> np.ndarray:
    """Scale-rotation prototypes of the coarse tiers."""
    L = pyr.num_levels
    if L == 1:
        shape_cb = np.zeros((1, 9), np.float32)
        shape_cb[0, 3] = shape_cb[0, 7] = 1
        return shape_cb
    n_int = sum(pyr.levels[lv].num_gaussians for lv in range(L - 1))
    size = min(preset.shape_codebook, max(8, n_int // 8))
    if size not in cache.shape:
        if cache.shape_feats is None:
            cache.shape_feats = torch.cat(
                [shape_features(pyr.levels[lv].log_scales, pyr.levels[lv].quats) for lv in range(L - 1)])
        wts = torch.cat([pyr.weight[lv] for lv in range(L - 1)])
        cb = build_codebook(cache.shape_feats, wts, size, seed=seed, max_train=16384)
        cache.shape[size] = cb.numpy().astype(np.float16).astype(np.float32)
    return cache.shape[size]


def _sh_tables(pyr: Pyramid, preset: Preset, sh_degree: int, seed: int, cache: CodebookCache):
    """Appearance prototypes (or the per-primitive grid) of the fine tier: -> (codebook, keep)."""
    cb_degree = min(preset.sh_degree, sh_degree)
    if not (sh_degree > 0 and cb_degree > 0 and preset.sh_fraction > 0):
        return None, None
    keep = _sh_keep_mask(pyr, preset.sh_fraction, cache)
    if not keep.any():
        return None, None
    if preset.sh_step > 0:
        return ShGrid(cb_degree, preset.sh_step), keep  # per-primitive SH, no codebook
    k_cb = (cb_degree + 1) ** 2 - 1
    size = min(preset.sh_codebook, max(4, int(keep.sum()) // 2))
    key = (preset.sh_fraction, cb_degree, size)
    if key not in cache.sh:
        km = torch.from_numpy(keep)
        rows = pyr.levels[-1].sh_rest[km, :k_cb].reshape(int(keep.sum()), -1)
        cb = build_codebook(rows, pyr.weight[-1][km], size, seed=seed + 1, max_train=16384)
        cache.sh[key] = cb.numpy().reshape(-1, k_cb, 3).astype(np.float16).astype(np.float32)
    return cache.sh[key], keep


def rung_tables(pyr: Pyramid, preset: Preset, meta: SceneMeta, seed: int, cache: CodebookCache) -> Tables:
    sh_cb, keep = _sh_tables(pyr, preset, meta.sh_degree, seed, cache)
    return Tables(_shape_codebook(pyr, preset, seed, cache), sh_cb, keep, active_palettes(meta.palettes, preset))


def _node_bits(sym: dict, n: int, keep) -> np.ndarray:
    bits = np.zeros(n)
    for name, v in sym.items():
        if name in ("sh_idx", "sh_q"):
            continue
        v2 = v.reshape(n, -1)
        for col in range(v2.shape[1]):
            bits += symbol_bits(v2[:, col])
    if "sh_idx" in sym and keep is not None and keep.any():
        b = np.zeros(n)
        b[keep] = symbol_bits(sym["sh_idx"][keep])
        bits += b
    if "sh_q" in sym and keep is not None and keep.any():
        b = np.zeros(n)
        rows = sym["sh_q"][keep].reshape(int(keep.sum()), -1)
        for col in range(rows.shape[1]):
            b[keep] += symbol_bits(rows[:, col])
        bits += b
    return bits


def sample_nodes(pyr: Pyramid, per_level: int, seed: int) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    out = []
    for lv in pyr.levels:
        n = lv.num_gaussians
        out.append(np.arange(n) if n <= per_level else np.sort(g.choice(n, per_level, replace=False)))
    return out


@dataclass
class _SampleLevel:
    """What a rung estimate reads of one level's sample nodes, whatever the preset: the nodes,
    their weights and their exact parents' rows (None at level 0)."""

    nodes: object  # GaussianScene
    weight: np.ndarray
    parents: tuple | None  # (means float64, sh_dc, quats, log_scales) of each node's parent


def _sample_level(pyr: Pyramid, lv: int, idx: np.ndarray) -> _SampleLevel:
    rows = torch.from_numpy(idx)
    parents = None
    if lv > 0:
        par = pyr.parent[lv][rows]
        up = pyr.levels[lv - 1]
        parents = (up.means[par].double().numpy(), up.sh_dc[par].numpy(), up.quats[par].numpy(),
                   up.log_scales[par].numpy())
    return _SampleLevel(pyr.levels[lv].subset(rows), pyr.weight[lv][rows].numpy().astype(np.float64), parents)


def _sample_parents(level: _SampleLevel, quant: Quantizer, meta: SceneMeta) -> Parents:
    """The exact (not decoded) parents of a level's sample nodes."""
    if level.parents is None:
        return Parents.root(meta.origin, level.weight.shape[0])
    means, sh_dc, quats, log_scales = level.parents
    return Parents(means, np.round(sh_dc / quant.dc_step).astype(np.int64), quats, log_scales)


def _fixed_bytes(tables: Tables, levels: int) -> int:
    sh_cb = tables.sh_codebook
    fixed = 600 + 2 * tables.shape_codebook.size + (2 * sh_cb.size if isinstance(sh_cb, np.ndarray) else 0) + 16 * 20 * levels
    if isinstance(sh_cb, ShGrid):
        fixed += 20 * 3 * ((sh_cb.degree + 1) ** 2 - 1)
    if tables.palettes is not None:
        fixed += sum(4 * len(v) + 20 for v in tables.palettes.values.values())
    return fixed


def estimate_rung(pyr: Pyramid, preset: Preset, meta: SceneMeta, samples: list, seed: int, books: CodebookCache,
                  memo: TreeMemo | None = None, sample_cache: dict | None = None) -> Rung:
    """RD estimate of a preset from a sample of nodes per level (open loop on exact parents):
    per-node cost = merge distortion + weight x mean quantisation error per unit weight of its
    level (and SH tier); per-node bytes = mean entropy of its level (and SH tier).
    ``sample_cache``: level -> the sample nodes' preset-free rows, kept across the rungs of one
    search (``samples`` and ``pyr`` fixed; gathering them took 10% of a `fast` encode)."""
    L = pyr.num_levels
    quant = meta.quantizer(preset)
    tables = rung_tables(pyr, preset, meta, seed, books)
    keep = tables.sh_keep
    cost, node_bytes = [], []
    for lv in range(L):
        fine = lv == L - 1
        idx = samples[lv]
        level = None if sample_cache is None else sample_cache.get(lv)
        if level is None:
            level = _sample_level(pyr, lv, idx)
            if sample_cache is not None:
                sample_cache[lv] = level
        nodes, w = level.nodes, level.weight
        kk = keep[idx] if (fine and keep is not None) else None
        sym, dec = quantize_level(nodes, _sample_parents(level, quant, meta), fine, quant,
                                  dataclasses.replace(tables, sh_keep=kk),
                                  None if memo is None else memo.level(memo.sample, lv))
        err = pair_error(nodes, dec.to_scene()).numpy().astype(np.float64)
        bits = _node_bits(sym, len(idx), kk) / 8 + (0.0 if fine else 0.25)
        n = pyr.levels[lv].num_gaussians
        per_w = np.zeros(n)
        per_b = np.zeros(n)
        groups = [(np.ones(len(idx), bool), np.ones(n, bool))] if kk is None else [(kk, keep), (~kk, ~keep)]
        for gs, gfull in groups:
            if gs.any():
                per_w[gfull] = (err[gs] * w[gs]).sum() / max(w[gs].sum(), 1e-30)
                per_b[gfull] = bits[gs].mean()
        cost.append(pyr.distortion[lv].numpy().astype(np.float64) + per_w * pyr.weight[lv].numpy())
        node_bytes.append(per_b)
    return Rung(preset, quant, tables, cost, node_bytes, _fixed_bytes(tables, L))


def quantize_tree(pyr: Pyramid, rung: Rung, meta: SceneMeta, memo: TreeMemo | None = None,
                  parents_out: list | None = None) -> None:
    """Quantise every pyramid node with the rung's preset (closed loop on decoded parents) into
    ``rung.symbols``. ``memo``: kept across the presets tried on this pyramid. ``parents_out``:
    receives, per level, the decoded :class:`Parents` of its nodes."""
    L = pyr.num_levels
    parents = Parents.root(meta.origin, pyr.levels[0].num_gaussians)
    symbols = []
    for lv in range(L):
        fine = lv == L - 1
        if parents_out is not None:
            parents_out.append(parents)
        sym, dec = quantize_level(pyr.levels[lv], parents, fine, rung.quant, rung.tables,
                                  None if memo is None else memo.level(memo.full, lv))
        if fine and pyr.copies is not None:  # format 5.1: the fine tier codes each leaf's copies
            sym = {**sym, "copies": (pyr.copies - 1).numpy().astype(np.int64)}
        symbols.append(sym)
        if not fine:
            parents = Parents.of(dec, pyr.parent[lv + 1].numpy())
    rung.symbols = symbols
