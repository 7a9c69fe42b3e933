"""PGMS quantisation: every encode rule next to its decode rule, per format version.

``quantize_level`` (encoder, closed loop on the decoded parents) and ``dequantize_level``
(decoder) are built from pairs that mirror each other: fine-tier shapes, coarse-tier shape
prototypes, positions, SH DC, opacity, view-dependent SH. Format 3 codes fine-tier shapes and
every position offset in the decoded parent's frame; 2.x codes them on world axes (absolute
fine-tier shapes); 1.x also leaves the DC residuals colour-correlated. The encoder writes the
current format only; the decoder reads every readable major.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..io import GaussianScene
from . import _frames
from .coders import FormatError

__all__ = [
    "Quantizer", "ShGrid", "Palettes", "Parents", "Tables", "ShapeTable", "DecodedLevel", "LevelMemo",
    "quantize_level", "dequantize_level", "identity_frames", "decorrelate_dc", "correlate_dc",
    "nearest_index", "sigmoid", "PALETTE_CHANNELS", "PALETTE_NONE", "PALETTE_ABSOLUTE", "PALETTE_PREDICTED",
    "MAX_PALETTE", "MAX_ABS_LOG_SCALE", "MAX_ABS_DC_TABLE",
]

#: every decoded log-scale, in the coded frame and after XFRM, lies in [-80, 80]: exp of it is
#: finite in float32 (exp(80) ~ 5.5e34 < 3.4e38), and the encoder clamps inputs to [-30, 30]
MAX_ABS_LOG_SCALE = 80.0
#: PALT tables of DC colours lie in [-1e37, 1e37]: three channels and every SH band the format can
#: hold then sum far below FLT_MAX (a renderer's colour stays finite in float32)
MAX_ABS_DC_TABLE = 1e37


@dataclass(frozen=True)
class Quantizer:
    """Quantiser settings of one encoding (stored in HEAD)."""

    pos_rel: float  # position step as a fraction of a node's geometric-mean scale
    dc_step: float  # SH DC step
    ls_step: float  # log-scale step (fine tier)
    min_step: float  # smallest position step (scene units)
    op_bits: int  # opacity bits (uniform in alpha)
    rot_bits: int  # bits per smallest-three quaternion component (fine tier)

    def __post_init__(self):
        for name in ("pos_rel", "dc_step", "ls_step", "min_step"):
            v = getattr(self, name)
            if not (np.isfinite(v) and 0 < v < 1e6):
                raise FormatError(f"quantiser {name}={v} outside (0, 1e6)")
        if not 1 <= self.op_bits <= 16 or not 2 <= self.rot_bits <= 16:
            raise FormatError(f"quantiser bits out of range (opacity {self.op_bits}, rotation {self.rot_bits})")


@dataclass(frozen=True)
class ShGrid:
    """Per-primitive view-dependent SH (section SHQP): the first ``(degree+1)^2 - 1`` bands of
    each fine-tier node with ``sh_flag`` coded as integers ``round(coefficient / step)``."""

    degree: int
    step: float

    def __post_init__(self):
        if not 1 <= self.degree <= 3 or not (np.isfinite(self.step) and 1e-6 < self.step < 1e3):
            raise FormatError(f"SHQP: degree {self.degree} / step {self.step} out of range (1-3, (1e-6, 1e3))")

    @property
    def coefficients(self) -> int:
        return (self.degree + 1) ** 2 - 1


PALETTE_CHANNELS = ("dc0", "dc1", "dc2", "op", "ls0", "ls1", "ls2")
PALETTE_NONE, PALETTE_ABSOLUTE, PALETTE_PREDICTED = 0, 1, 2
MAX_PALETTE = 4096


@dataclass
class Palettes:
    """Value tables of fine-tier attribute channels that sit on a small set of values (section PALT).

    Scenes decoded from lossy formats (8-bit colour and opacity, codebook scales) hold few
    distinct values per channel; coding the index into the sorted table of those values is
    lossless and cheaper than a uniform step fine enough to keep them. Channels (see
    :data:`PALETTE_CHANNELS`): SH DC per colour (the value), opacity (the logit), log-scale per
    axis. ``mode[ch]``: PALETTE_ABSOLUTE codes the index, PALETTE_PREDICTED (DC only) codes the
    index minus the index nearest the decoded parent's DC value.
    """

    values: dict  # channel -> float32 [K] strictly increasing
    mode: dict  # channel -> PALETTE_ABSOLUTE | PALETTE_PREDICTED

    def subset(self, channels) -> "Palettes | None":
        keep = [c for c in PALETTE_CHANNELS if c in channels and c in self.values]
        if not keep:
            return None
        return Palettes({c: self.values[c] for c in keep}, {c: self.mode[c] for c in keep})

    def gap(self, ch: str, domain=None) -> float:
        """Median spacing of a channel's table (in ``domain(values)`` when given)."""
        v = self.values[ch].astype(np.float64)
        v = domain(v) if domain is not None else v
        return float(np.median(np.diff(v))) if len(v) > 1 else float("inf")


def nearest_index(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index [N] of the nearest entry of a sorted table to each x."""
    t = table.astype(np.float64)
    x = np.asarray(x, np.float64)
    j = np.clip(np.searchsorted(t, x), 1, max(len(t) - 1, 1))
    if len(t) == 1:
        return np.zeros(len(x), np.int64)
    left = t[j - 1]
    right = t[j]
    return np.where(np.abs(x - left) <= np.abs(right - x), j - 1, j).astype(np.int64)


# --------------------------------------------------------------------------- the data a level's rules share


def identity_frames(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rotation and log-scales of the level-0 nodes' virtual parent (format 3)."""
    q = np.zeros((n, 4), np.float32)
    q[:, 0] = 1
    return q, np.zeros((n, 3), np.float32)


@dataclass
class Parents:
    """The decoded parents of one level's nodes, row by row (level 0: the origin, identity frames)."""

    means: np.ndarray  # [N, 3] float64
    dcq: np.ndarray  # [N, 3] int64, quantised DC
    quats: np.ndarray  # [N, 4] float32
    log_scales: np.ndarray  # [N, 3] float32

    @classmethod
    def root(cls, origin: np.ndarray, n: int) -> Parents:
        quats, log_scales = identity_frames(n)
        return cls(np.tile(np.asarray(origin, np.float64), (n, 1)), np.zeros((n, 3), np.int64), quats, log_scales)

    @classmethod
    def of(cls, decoded: DecodedLevel, index: np.ndarray) -> Parents:
        """The parents of the next level's nodes: ``index`` [M] is each child's parent row."""
        means = decoded.means_exact if decoded.means_exact is not None else decoded.means.astype(np.float64)
        return cls(means[index], decoded.dcq[index], decoded.quats[index], decoded.log_scales[index])

    def take(self, index) -> Parents:
        return Parents(self.means[index], self.dcq[index], self.quats[index], self.log_scales[index])


@dataclass
class Tables:
    """The tables one encoding quantises against: scale-rotation prototypes (coarse tiers) and,
    for the fine tier, the SH codebook (or per-primitive SH grid), which leaves carry SH, and the
    channels coded by value tables."""

    shape_codebook: np.ndarray  # [K, 9] float32 (float16-exact)
    sh_codebook: np.ndarray | ShGrid | None = None  # [K, k, 3] prototypes, or the per-primitive grid
    sh_keep: np.ndarray | None = None  # [N_fine] bool: leaves with view-dependent SH
    palettes: Palettes | None = None


@dataclass(frozen=True)
class ShapeTable:
    """The decoded log-scales and rotations of the scale-rotation prototypes."""

    log_scales: np.ndarray  # [K, 3]
    quats: np.ndarray  # [K, 4]

    @classmethod
    def from_codebook(cls, codebook: np.ndarray, portable: bool = True) -> ShapeTable:
        """Decode CBSR rows. ``portable`` (format 4, what the writer writes): the exact float64
        rule of docs/FORMAT.md, which any language reproduces bit for bit; else (formats 1-3)
        PyTorch float32, whose rounding depends on the CPU's fused multiply-adds."""
        if portable:
            return cls(*decode_shape_rows(codebook))
        from .prototypes import shape_from_features

        ls, q = shape_from_features(torch.from_numpy(codebook).float())
        return cls(ls.numpy(), q.numpy())


def decode_shape_rows(codebook: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CBSR rows [K, 9] (log-scales, first two rotation columns) -> (log-scales [K, 3], unit wxyz
    quats [K, 4], w >= 0), float32, by format 4's rule: elementwise float64 in a fixed order."""
    f = np.asarray(codebook, np.float32).astype(np.float64).reshape(-1, 9)
    a, b = f[:, 3:6], f[:, 6:9]

    def unit3(v):
        n = np.sqrt((v[:, 0] * v[:, 0] + v[:, 1] * v[:, 1]) + v[:, 2] * v[:, 2])
        return v / np.maximum(n, 1e-12)[:, None]

    c1 = unit3(a)
    d = (b[:, 0] * c1[:, 0] + b[:, 1] * c1[:, 1]) + b[:, 2] * c1[:, 2]
    c2 = unit3((b - d[:, None] * c1) + 1e-9 * np.roll(c1, 1, axis=1))
    c3 = np.stack([c1[:, 1] * c2[:, 2] - c1[:, 2] * c2[:, 1], c1[:, 2] * c2[:, 0] - c1[:, 0] * c2[:, 2],
                   c1[:, 0] * c2[:, 1] - c1[:, 1] * c2[:, 0]], 1)
    quats = _frames.rotmat_to_quat(np.stack([c1, c2, c3], 2)).astype(np.float32)
    return np.ascontiguousarray(f[:, :3], np.float32), quats


@dataclass
class DecodedLevel:
    """One level's nodes as a decoder sees them (the encoder's closed loop uses the same)."""

    means: np.ndarray  # [N, 3] float32
    log_scales: np.ndarray  # [N, 3] float32
    quats: np.ndarray  # [N, 4] float32
    dcq: np.ndarray  # [N, 3] int64
    dc: np.ndarray  # [N, 3] float32
    alpha: np.ndarray  # [N] float32
    rest: np.ndarray | None  # [N, K, 3] float32 (None: not quantised, quantize_level(sh=False))
    op_logit: np.ndarray | None = None  # [N] the opacity palette's logits (exact), if one is used
    means_exact: np.ndarray | None = None  # formats 1-2: the float64 positions their children start from

    def opacity_logits(self, rows=slice(None)) -> np.ndarray:
        """The opacity logits of ``rows``: the palette's exact logits, else logit(alpha) in float64."""
        if self.op_logit is not None:
            return self.op_logit[rows]
        a = self.alpha[rows].astype(np.float64)
        return np.log(a / (1 - a))

    def to_scene(self) -> GaussianScene:
        logit = self.opacity_logits()
        t = torch.from_numpy
        return GaussianScene(
            means=t(np.ascontiguousarray(self.means, np.float32)),
            quats=t(np.ascontiguousarray(self.quats, np.float32)),
            log_scales=t(np.ascontiguousarray(self.log_scales, np.float32)),
            opacity_logits=t(np.ascontiguousarray(logit, np.float32)),
            sh_dc=t(np.ascontiguousarray(self.dc, np.float32)),
            sh_rest=t(np.ascontiguousarray(self.rest, np.float32)),
        )


def _digest(a: np.ndarray) -> tuple:
    a = np.ascontiguousarray(a)
    return a.dtype.str, a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).digest()


@dataclass
class LevelMemo:
    """The preset-independent steps of quantising one level's nodes, kept by the encoder across
    the rungs it tries (same nodes, shared codebooks, often the same decoded parents): the
    relabelling to the parents' axes (the last one only: seven floats per node), the
    nearest-prototype searches. Safe to share between two threads: no step assumes that an entry
    it stored is still there."""

    relabel: tuple | None = None  # (key, (relative quats, log-scales))
    shapes: dict = field(default_factory=dict)  # codebook digest -> prototype index [N]
    sh: dict = field(default_factory=dict)  # (codebook digest, keep digest) -> prototype index [M]

    def copy(self) -> LevelMemo:
        return LevelMemo(self.relabel, dict(self.shapes), dict(self.sh))

    def relabelled(self, key: tuple, compute: Callable):
        slot = self.relabel
        if slot is not None and slot[0] == key:
            return slot[1]
        value = compute()
        self.relabel = (key, value)
        return value

    @staticmethod
    def lookup(table: dict, key, compute: Callable):
        value = table.get(key)
        if value is None:
            value = compute()
            table[key] = value
        return value


# --------------------------------------------------------------------------- rotations, steps


def _q_rot(quats: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Smallest-three quaternion coding: -> (index of the largest component, the others quantised)."""
    q = quats / np.maximum(np.linalg.norm(quats, axis=1, keepdims=True), 1e-12)
    big = np.argmax(np.abs(q), axis=1)
    q = q * np.where(q[np.arange(len(q)), big] < 0, -1.0, 1.0)[:, None]
    idx = np.arange(4)[None, :].repeat(len(q), 0)
    others = q[idx != big[:, None]].reshape(len(q), 3)
    s = 1 / np.sqrt(2)
    levels = (1 << bits) - 1
    u = np.clip(np.round((others + s) / (2 * s) * levels), 0, levels).astype(np.int64)
    return big.astype(np.int64), u


def _dq_rot(big: np.ndarray, u: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`_q_rot`."""
    s = 1 / np.sqrt(2)
    others = u.astype(np.float64) / ((1 << bits) - 1) * 2 * s - s
    largest = np.sqrt(np.clip(1 - (others**2).sum(1), 0, 1))
    q = np.zeros((len(u), 4))
    idx = np.arange(4)[None, :].repeat(len(u), 0)
    keep = idx != big[:, None]
    q[keep] = others.reshape(-1)
    q[np.arange(len(u)), big] = largest
    return q.astype(np.float32)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _pos_step(log_scales: np.ndarray, quant: Quantizer) -> np.ndarray:
    return np.maximum(quant.pos_rel * np.exp(log_scales.astype(np.float64).mean(1)), quant.min_step)[:, None]


def _relative_log_scales(parent_ls: np.ndarray, lsq: np.ndarray, step: float) -> np.ndarray:
    return (parent_ls.astype(np.float64) + lsq * step).astype(np.float32)


def _child_means(parent_means: np.ndarray, parent_quats: np.ndarray, off: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Format 3: position offsets are quantised along the decoded parent's axes."""
    return parent_means + _frames.from_parent_frame(parent_quats, off * step)


def _palette(pal: Palettes | None, channel: str) -> np.ndarray | None:
    return None if pal is None else pal.values.get(channel)


# --------------------------------------------------------------------------- fine-tier shapes


def encode_fine_shape(nodes, parents: Parents, quant: Quantizer, pal: Palettes | None, memo: LevelMemo | None):
    """Log-scales relative to the parent's (per axis, or indices into a value table) and the
    rotation relative to the parent's frame: -> (symbols, decoded log-scales, decoded quats)."""
    ls_palette = pal is not None and any(f"ls{a}" in pal.values for a in range(3))

    def relabel():  # scale tables are per axis: keep the axis order when one is used
        return _frames.relabel_to_parent(parents.quats, nodes.quats.numpy(), nodes.log_scales.numpy(),
                                         allow_permute=not ls_palette)

    rel_q, ls_in = relabel() if memo is None else memo.relabelled((_digest(parents.quats), not ls_palette), relabel)
    lsq = np.round((ls_in - parents.log_scales) / quant.ls_step).astype(np.int64)
    log_scales = _relative_log_scales(parents.log_scales, lsq, quant.ls_step)
    for a in range(3):
        tab = _palette(pal, f"ls{a}")
        if tab is not None:
            lsq[:, a] = nearest_index(tab, ls_in[:, a])
            log_scales[:, a] = tab[lsq[:, a]]
    big, u = _q_rot(rel_q, quant.rot_bits)
    quats = _frames.compose(parents.quats, _dq_rot(big, u, quant.rot_bits)).astype(np.float32)
    return {"ls": lsq, "rot_i": big, "rot_q": u}, log_scales, quats


def decode_fine_shape(sym: dict, parents: Parents, quant: Quantizer, pal: Palettes | None, major: int):
    """Inverse of :func:`encode_fine_shape`; formats 1-2: absolute log-scales and rotations."""
    lsq = sym["ls"]
    log_scales = np.zeros((len(lsq), 3), np.float32)
    for a in range(3):
        tab = _palette(pal, f"ls{a}")
        if tab is not None:
            log_scales[:, a] = tab[lsq[:, a]]
        elif major >= 3:
            log_scales[:, a] = _relative_log_scales(parents.log_scales[:, a], lsq[:, a], quant.ls_step)
        else:
            log_scales[:, a] = lsq[:, a] * quant.ls_step
    quats = _dq_rot(sym["rot_i"], sym["rot_q"], quant.rot_bits)
    if major >= 3:
        quats = _frames.compose(parents.quats, quats).astype(np.float32)
    return log_scales, quats


# --------------------------------------------------------------------------- coarse-tier shapes


def encode_coarse_shape(nodes, codebook: np.ndarray, memo: LevelMemo | None):
    """The nearest scale-rotation prototype: -> (symbols, decoded log-scales, decoded quats)."""
    from .prototypes import assign, shape_features

    def search():
        return assign(shape_features(nodes.log_scales, nodes.quats), torch.from_numpy(codebook)).numpy()

    idx = search() if memo is None else memo.lookup(memo.shapes, _digest(codebook), search)
    table = ShapeTable.from_codebook(codebook)
    return {"shape": idx}, table.log_scales[idx], table.quats[idx]


def decode_coarse_shape(sym: dict, table: ShapeTable):
    """Inverse of :func:`encode_coarse_shape` (every format)."""
    idx = sym["shape"]
    return table.log_scales[idx], table.quats[idx]


# --------------------------------------------------------------------------- positions


def encode_positions(means: np.ndarray, parents: Parents, log_scales: np.ndarray, quant: Quantizer):
    """Offsets from the decoded parent along its axes, in steps that scale with the node's own
    decoded size: -> (offsets [N, 3], decoded means float32)."""
    step = _pos_step(log_scales, quant)
    off = np.round(_frames.to_parent_frame(parents.quats, means - parents.means) / step).astype(np.int64)
    return off, _child_means(parents.means, parents.quats, off, step).astype(np.float32)


def decode_positions(off: np.ndarray, parents: Parents, log_scales: np.ndarray, quant: Quantizer, major: int):
    """Inverse of :func:`encode_positions` -> float64 means; formats 1-2: world-axis offsets."""
    if major >= 3:
        return _child_means(parents.means, parents.quats, off, _pos_step(log_scales, quant))
    return parents.means + off * _pos_step(log_scales, quant)


# --------------------------------------------------------------------------- SH DC


def decorrelate_dc(r: np.ndarray) -> np.ndarray:
    """Colour-decorrelate integer DC residuals (format 2): (g, r - g, b - g); exact and invertible."""
    r = np.asarray(r, np.int64)
    return np.stack([r[:, 1], r[:, 0] - r[:, 1], r[:, 2] - r[:, 1]], 1)


def correlate_dc(d: np.ndarray) -> np.ndarray:
    """Inverse of :func:`decorrelate_dc`."""
    d = np.asarray(d, np.int64)
    return np.stack([d[:, 1] + d[:, 0], d[:, 0], d[:, 2] + d[:, 0]], 1)


def _dc_palettes(pal: Palettes | None) -> bool:
    return pal is not None and any(f"dc{c}" in pal.values for c in range(3))


def encode_dc(dc_in: np.ndarray, parent_dcq: np.ndarray, quant: Quantizer, pal: Palettes | None):
    """Uniform DC residuals against the parent's quantised DC (colour-decorrelated), or indices
    into value tables (minus the parent's, PALETTE_PREDICTED): -> (symbols, dcq, decoded dc)."""
    dcq = np.round(dc_in / quant.dc_step).astype(np.int64)
    res = dcq - parent_dcq
    dc = (dcq * quant.dc_step).astype(np.float32)
    for c in range(3):
        tab = _palette(pal, f"dc{c}")
        if tab is not None:
            idx = nearest_index(tab, dc_in[:, c])
            dc[:, c] = tab[idx]
            pred = nearest_index(tab, parent_dcq[:, c] * quant.dc_step) if pal.mode[f"dc{c}"] == PALETTE_PREDICTED else 0
            res[:, c] = idx - pred
    if not _dc_palettes(pal):
        res = decorrelate_dc(res)
    return res, dcq, dc


def decode_dc(res: np.ndarray, parent_dcq: np.ndarray, quant: Quantizer, pal: Palettes | None, major: int,
              where: str):
    """Inverse of :func:`encode_dc` -> (dcq, dc); format 1 has no colour decorrelation."""
    if major >= 2 and not _dc_palettes(pal):
        res = correlate_dc(res)
    dcq = parent_dcq + res
    dc = (dcq * quant.dc_step).astype(np.float32)
    for c in range(3):
        tab = _palette(pal, f"dc{c}")
        if tab is not None:
            idx = res[:, c].copy()
            if pal.mode[f"dc{c}"] == PALETTE_PREDICTED:
                idx += nearest_index(tab, parent_dcq[:, c] * quant.dc_step)
            if len(idx) and (idx.min() < 0 or idx.max() >= len(tab)):
                raise FormatError(f"{where}: stream 'dc{c}' indexes outside its {len(tab)}-entry palette")
            dc[:, c] = tab[idx]
    return dcq, dc


# --------------------------------------------------------------------------- opacity


def _alpha_from_q(opq: np.ndarray, bits: int) -> np.ndarray:
    levels_op = (1 << bits) - 1
    return np.clip(opq.astype(np.float64) / levels_op, 0.25 / levels_op, 0.995).astype(np.float32)


def encode_opacity(logit_in: np.ndarray, quant: Quantizer, pal: Palettes | None):
    """Uniform in alpha (``op_bits``), or the index into the logit table: -> (symbols, alpha, logit or None)."""
    levels_op = (1 << quant.op_bits) - 1
    logit_in = logit_in.astype(np.float64)
    opq = np.clip(np.round(sigmoid(logit_in) * levels_op), 0, levels_op).astype(np.int64)
    tab = _palette(pal, "op")
    if tab is None:
        return opq, _alpha_from_q(opq, quant.op_bits), None
    opq = nearest_index(tab, logit_in)
    op_logit = tab[opq]
    return opq, sigmoid(op_logit.astype(np.float64)).astype(np.float32), op_logit


def decode_opacity(opq: np.ndarray, quant: Quantizer, pal: Palettes | None):
    """Inverse of :func:`encode_opacity` -> (alpha, logit or None)."""
    tab = _palette(pal, "op")
    return _alpha_from_q(opq, quant.op_bits), (None if tab is None else tab[opq])


# --------------------------------------------------------------------------- view-dependent SH


_SH_ROWS = 1 << 16  # rows per block of the per-primitive SH grid


def encode_sh(sh_rest: torch.Tensor, tables: Tables | None, memo: LevelMemo | None):
    """Fine tier: per-primitive SH on a grid, or the nearest SH prototype, for the leaves in
    ``tables.sh_keep`` (the rest have none): -> (symbols, decoded rest [N, K, 3])."""
    n = sh_rest.shape[0]
    rest = np.zeros((n, sh_rest.shape[1], 3), np.float32)
    cb = None if tables is None else tables.sh_codebook
    keep = None if tables is None else tables.sh_keep
    sym = {}
    if isinstance(cb, ShGrid) and keep is not None:
        k_cb = cb.coefficients
        sym["sh_flag"] = keep.astype(np.int64)
        # int32, as the decoder reads them (the format bounds them to 2^20): the encoder holds
        # several rungs' [N, 45] grids at once at scale. int64 only if a value would not fit.
        shq = np.zeros((n, k_cb, 3), np.int32)
        src = sh_rest[:, :k_cb].numpy()
        for s in range(0, n, _SH_ROWS):  # in row blocks: whole, the float64 temporaries took ~3x [N, 45] int64
            e = min(s + _SH_ROWS, n)
            q = np.round(src[s:e].astype(np.float64) / cb.step).astype(np.int64)
            q[~keep[s:e]] = 0
            if shq.dtype != np.int64 and q.size and np.abs(q).max() >= 2**31:
                shq = shq.astype(np.int64)
            shq[s:e] = q
            rest[s:e][keep[s:e], :k_cb] = (q[keep[s:e]] * cb.step).astype(np.float32)
        sym["sh_q"] = shq
    elif cb is not None and keep is not None:
        from .prototypes import assign

        k_cb = cb.shape[1]
        sym["sh_flag"] = keep.astype(np.int64)
        sym["sh_idx"] = np.zeros(n, np.int64)
        if keep.any():
            def search():
                rows = sh_rest[torch.from_numpy(keep), :k_cb].reshape(int(keep.sum()), -1)
                return assign(rows, torch.from_numpy(cb.reshape(len(cb), -1))).numpy()

            key = (_digest(cb), _digest(keep))
            sidx = search() if memo is None else memo.lookup(memo.sh, key, search)
            sym["sh_idx"][keep] = sidx
            rest[keep, :k_cb] = cb[sidx]
    return sym, rest


def decode_sh(sym: dict, sh_codebook: np.ndarray | ShGrid | None, n: int, k_rest: int) -> np.ndarray:
    """Inverse of :func:`encode_sh` -> rest [N, k_rest, 3] (zeros where a leaf has no SH)."""
    rest = np.zeros((n, k_rest, 3), np.float32)
    if sh_codebook is None or "sh_flag" not in sym:
        return rest
    flag = sym["sh_flag"].astype(bool)
    if isinstance(sh_codebook, ShGrid):
        kq = sh_codebook.coefficients
        if flag.any():
            rest[flag, :kq] = (sym["sh_q"][flag] * sh_codebook.step).astype(np.float32)
    else:
        rest[flag, : sh_codebook.shape[1]] = sh_codebook[sym["sh_idx"][flag]]
    return rest


# --------------------------------------------------------------------------- one level


def quantize_level(nodes, parents: Parents, fine: bool, quant: Quantizer, tables: Tables,
                   memo: LevelMemo | None = None, sh: bool = True) -> tuple[dict, DecodedLevel]:
    """Quantise one level's nodes (closed loop on the decoded parents): -> (symbols by stream, decoded level).

    Fine tier (``fine``): shapes in the parent's frame, the palettes and the SH of ``tables``;
    coarser tiers: scale-rotation prototypes. Every position offset is coded in the parent's
    frame (:mod:`._frames`). ``memo``: kept by the caller for these same ``nodes`` across rungs
    (see :class:`LevelMemo`). ``sh=False`` skips the SH bands (no SH symbols, decoded ``rest``
    None): for a caller that reads only the other decoded values (no child depends on them)."""
    pal = tables.palettes if fine else None
    if fine:
        sym, log_scales, quats = encode_fine_shape(nodes, parents, quant, pal, memo)
    else:
        sym, log_scales, quats = encode_coarse_shape(nodes, tables.shape_codebook, memo)
    sym["pos"], means = encode_positions(nodes.means.numpy().astype(np.float64), parents, log_scales, quant)
    sym["dc"], dcq, dc = encode_dc(nodes.sh_dc.numpy(), parents.dcq, quant, pal)
    sym["op"], alpha, op_logit = encode_opacity(nodes.opacity_logits.numpy(), quant, pal)
    sh_sym, rest = encode_sh(nodes.sh_rest, tables if fine else None, memo) if sh else ({}, None)
    sym.update(sh_sym)
    return sym, DecodedLevel(means, log_scales, quats, dcq, dc, alpha, rest, op_logit)


def dequantize_level(sym: dict, parents: Parents, fine: bool, quant: Quantizer, tables: Tables,
                     shape_table: ShapeTable, k_rest: int, major: int, where: str) -> DecodedLevel:
    """Inverse of :func:`quantize_level` for format ``major`` (1-3); ``sym`` as the streams hold
    them (``bitstream.read_level``). Raises :class:`FormatError` for out-of-range values."""
    pal = tables.palettes if fine else None
    if fine:
        log_scales, quats = decode_fine_shape(sym, parents, quant, pal, major)
    else:
        log_scales, quats = decode_coarse_shape(sym, shape_table)
    if not np.isfinite(log_scales).all() or np.abs(log_scales).max(initial=0) > MAX_ABS_LOG_SCALE:
        raise FormatError(f"{where}: decoded log-scales out of range")
    means = decode_positions(sym["pos"], parents, log_scales, quant, major)
    dcq, dc = decode_dc(sym["dc"], parents.dcq, quant, pal, major, where)
    alpha, op_logit = decode_opacity(sym["op"], quant, pal)
    rest = decode_sh(sym, tables.sh_codebook if fine else None, len(alpha), k_rest)
    dec = DecodedLevel(means.astype(np.float32), log_scales, quats, dcq, dc, alpha, rest, op_logit,
                       means_exact=None if major >= 3 else means)
    if not np.isfinite(dec.means).all() or not np.isfinite(dec.dc).all():
        raise FormatError(f"{where}: decoded positions or colours are not finite")
    return dec
