"""PGMS decoding: .pgms bytes (or a prefix holding the first levels) -> GaussianScene.

The public ``decompress`` (``visionmoe.splat.decompress``) and ``info``; the encoder's render
checks decode with it too (so it sits below the encoder).

Memory (docs/ROBUSTNESS.md): every count is checked before it sizes anything, the decode's
peak is estimated from the checked counts before the first level is decoded (and refused above
the budget), and the finest decoded level is dequantised in chunks straight into the output
arrays, so a decode holds the symbols of one level, the output and a chunk's temporaries."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..io import GaussianScene, SceneError
from ..scene_check import check_finite
from . import bitstream as bs
from .file_transform import apply_file_transform_
from .quantize import MAX_ABS_LOG_SCALE, DecodedLevel, Parents, ShGrid, dequantize_level

__all__ = ["DecodeMemoryError", "TRUSTED", "decode_budget", "decode_bytes_needed", "decompress", "level_node_counts",
           "memory_needed", "info"]

MiB = 1 << 20
# Nodes dequantised at a time on the decoded scene's last level: bounds the float64 temporaries
# (parent frames, positions) at a few tens of MB whatever the scene's size.
CHUNK_NODES = 1 << 15
# Peak bytes per decoded node above the output, measured with VmPeak (docs/ROBUSTNESS.md):
# the level's int64 symbols and the previous level's parents. The output itself is 14 + 3 K
# float32 per node (K view-dependent SH coefficients per channel).
_WORK_BYTES_PER_NODE = 200
_GRID_BYTES_PER_COEFFICIENT = 4 * 3  # a per-primitive SH grid's symbols: int32 per channel
_FIXED_BYTES = 24 * MiB  # stream buffers, codebooks, chunk temporaries
TRUSTED = 1 << 62  # ``max_memory`` for bytes the caller wrote itself (the encoder's render checks)


class DecodeMemoryError(bs.FormatError):
    """A (possibly valid) file that would need more memory to decode than its size justifies:
    a decompression bomb unless the caller trusts it and raises ``max_memory``."""


# Default decode budget: max(64 MiB, BUDGET_PER_FILE_BYTE x file size). Real files need up to
# about 90 bytes per file byte (SH3 at 0.2 nodes per byte); 64 refused a playbot 50x encode (SH2,
# 0.148 nodes per byte: 104 MiB for a 1.6 MB file). A zip bomb needs thousands.
BUDGET_PER_FILE_BYTE = 256


def decode_budget(file_size: int) -> int:
    """Bytes a decode of ``file_size`` bytes may need by default: max(64 MiB, 256 x file size)."""
    return max(64 * MiB, BUDGET_PER_FILE_BYTE * int(file_size))


def decode_bytes_needed(nodes: int, sh_degree: int, grid_coefficients: int = 0) -> int:
    """The decoder's peak estimate for ``nodes`` decoded nodes (an upper bound, see the measured
    per-node figures above)."""
    k_rest = (sh_degree + 1) ** 2 - 1
    per_node = 4 * (14 + 3 * k_rest) + _WORK_BYTES_PER_NODE + _GRID_BYTES_PER_COEFFICIENT * grid_coefficients
    return _FIXED_BYTES + nodes * per_node


def decompress(path_or_bytes, level: int | None = None, *, max_memory: int | None = None) -> GaussianScene:
    """Decode .pgms (a path, bytes or memoryview) to a GaussianScene at the source's SH degree.

    ``level``: decode only pyramid levels 0..level (progressive: a coarser scene; the bytes
    may be a prefix of the file that holds those levels). ``max_memory``: the bytes the decode
    may need (default :func:`decode_budget` of the input's size); a file that needs more raises
    :class:`DecodeMemoryError` before anything is allocated. Invalid input raises
    ``bitstream.FormatError`` (a ``SceneError``) saying what is wrong.
    """
    if isinstance(path_or_bytes, (str, os.PathLike)):
        p = Path(path_or_bytes)
        if not p.is_file():
            raise SceneError(f"{p}: no such file")
        data = p.read_bytes()
    elif isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        data = bytes(path_or_bytes)
    else:
        raise TypeError(f"expected a path or bytes, got {type(path_or_bytes).__name__}")
    if level is not None and (not isinstance(level, int) or isinstance(level, bool) or level < 0):
        raise ValueError(f"level must be a non-negative int or None, got {level!r}")
    if max_memory is not None and (not isinstance(max_memory, int) or isinstance(max_memory, bool) or max_memory <= 0):
        raise ValueError(f"max_memory must be a positive int (bytes) or None, got {max_memory!r}")
    return _decode(data, level, max_memory)


def decode_coded(data: bytes) -> GaussianScene:
    """The encoder's own decode of a file it just wrote: the scene in the file's coded frame
    (its XFRM section, if any, not applied: the encoder's references live in that frame), with
    no memory limit (:data:`TRUSTED`)."""
    return _decode(bytes(data), None, TRUSTED, coded_frame=True)


def level_node_counts(header: bs.Header, payloads: list[bytes]) -> list[int]:
    """Each level section's node count, from its first stream's header alone (nothing decoded),
    checked against HEAD before anything is sized by it: level 0 holds ``level0`` nodes, no
    level is empty, the counts never add up to more than ``total_nodes``, and exactly to it when
    every level is present. The memory budget of a decode rests on this: no buffer is sized by
    a count that these checks (and, level by level, the child counts) have not confirmed."""
    counts = []
    for lv, payload in enumerate(payloads):
        if len(payload) < bs.STREAM_HEAD.size:
            raise bs.FormatError(f"level {lv}: section of {len(payload)} bytes holds no stream")
        n = bs.STREAM_HEAD.unpack_from(payload, 0)[4]
        # only the finest level may be empty (a cut that keeps every node of the levels above)
        if (n == 0 and lv != header.num_levels - 1) or (lv == 0 and n != header.level0):
            raise bs.FormatError(f"level {lv}: its streams hold {n} nodes, "
                              + (f"HEAD declares {header.level0} in level 0" if lv == 0 else "expected at least 1"))
        counts.append(n)
        if sum(counts) > header.total_nodes:
            raise bs.FormatError(f"corrupt .pgms: levels 0-{lv} hold {sum(counts)} nodes, more than the "
                              f"{header.total_nodes} HEAD declares")
    if len(payloads) == header.num_levels and sum(counts) != header.total_nodes:
        raise bs.FormatError(f"corrupt .pgms: HEAD declares {header.total_nodes} nodes, the level sections hold "
                          f"{sum(counts)}")
    return counts


def memory_needed(data: bytes) -> int:
    """The decoder's peak estimate for a full decode of ``data`` (compare with
    :func:`decode_budget`); from the checked counts, nothing decoded."""
    header, books, payloads = bs.read_container(data)
    major, _minor = bs.read_preamble(data)
    tables, _ = bs.read_tables(header, books, major)
    counts = level_node_counts(header, payloads)
    extra = 0
    if header.copies:  # the repeated fine-tier nodes (format 5.1): read from the fine tier's streams
        sym = bs.read_level(bs.StreamReader(payloads[-1], "fine level", major), counts[-1], True, header, tables)
        extra = int(sym["copies"].sum())
    return _needed(header, tables, sum(counts) + extra)


def _needed(header: bs.Header, tables, nodes: int) -> int:
    grid = tables.sh_codebook.coefficients if isinstance(tables.sh_codebook, ShGrid) else 0
    return decode_bytes_needed(nodes, header.sh_degree, grid)


def _check_memory(header: bs.Header, tables, nodes: int, file_size: int, max_memory: int | None) -> None:
    need = _needed(header, tables, nodes)
    limit = decode_budget(file_size) if max_memory is None else max_memory
    if need > limit:
        why = (f"the limit for a file of this size, max(64 MiB, {BUDGET_PER_FILE_BYTE} x its size)" if max_memory is None
               else "max_memory")
        raise DecodeMemoryError(f"decoding {nodes} nodes from {file_size} bytes needs about {need / MiB:.0f} MiB, "
                                f"more than {why} ({limit / MiB:.0f} MiB); raise max_memory (--max-memory) "
                                "only for a file you trust")


def _check_children(cc: np.ndarray, lv: int, fine_level: int, counts: list[int]) -> None:
    """A level's child counts must add up to the next level's node count before anything is
    expanded by them."""
    where, children = f"level {lv}", int(cc.sum())
    if lv == fine_level:
        if children:
            raise bs.FormatError(f"{where}: the finest level declares children")
        return
    if lv + 1 < len(counts) and children != counts[lv + 1]:
        raise bs.FormatError(f"{where}: child counts add up to {children}, level {lv + 1} holds {counts[lv + 1]} nodes")
    if children == 0 and lv + 1 != fine_level:  # an empty level can only be the finest
        raise bs.FormatError(f"{where}: no node has children, but level {lv + 1} follows")


class _Output:
    """The decoded scene's arrays, allocated once and filled level by level (no final copy)."""

    def __init__(self, n: int, k_rest: int):
        self.means = np.empty((n, 3), np.float32)
        self.quats = np.empty((n, 4), np.float32)
        self.log_scales = np.empty((n, 3), np.float32)
        self.opacity = np.empty(n, np.float32)
        self.dc = np.empty((n, 3), np.float32)
        self.rest = np.empty((n, k_rest, 3), np.float32)

    def put(self, at: int, dec: DecodedLevel, rows=slice(None)) -> int:
        """Write ``dec``'s ``rows`` at row ``at``; -> the next free row."""
        means = dec.means[rows]
        end = at + len(means)
        self.means[at:end] = means
        self.quats[at:end] = dec.quats[rows]
        self.log_scales[at:end] = dec.log_scales[rows]
        self.opacity[at:end] = dec.opacity_logits(rows)
        self.dc[at:end] = dec.dc[rows]
        self.rest[at:end] = dec.rest[rows]
        return end

    def scene(self) -> GaussianScene:
        t = torch.from_numpy
        return GaussianScene(means=t(self.means), quats=t(self.quats), log_scales=t(self.log_scales),
                             opacity_logits=t(self.opacity), sh_dc=t(self.dc), sh_rest=t(self.rest))


def _decode(data: bytes, level: int | None, max_memory: int | None, coded_frame: bool = False) -> GaussianScene:
    header, books, payloads = bs.read_container(data, level)
    major, _minor = bs.read_preamble(data)
    counts = level_node_counts(header, payloads)
    tables, shape_table = bs.read_tables(header, books, major)
    stop = len(payloads) - 1 if level is None else min(level, len(payloads) - 1)
    _check_memory(header, tables, sum(counts[: stop + 1]), len(data), max_memory)
    k_rest = (header.sh_degree + 1) ** 2 - 1
    fine_level = header.num_levels - 1
    kept: list[tuple[DecodedLevel, np.ndarray]] = []  # the coarse levels' terminal nodes
    prev, parent_row = None, None  # the previous level (as parents) and each node's row in it

    def parents(a: int, b: int) -> Parents:
        return Parents.root(header.origin, b - a) if prev is None else prev.take(parent_row[a:b])

    def dequantize(sym: dict, a: int, b: int, fine: bool, where: str) -> DecodedLevel:
        part = sym if (a, b) == (0, len(sym["op"])) else {k: v[a:b] for k, v in sym.items()}
        return dequantize_level(part, parents(a, b), fine, header.quant, tables, shape_table, k_rest, major, where)

    for lv in range(stop + 1):
        n, fine, where = counts[lv], lv == fine_level, f"level {lv}"
        sym = bs.read_level(bs.StreamReader(payloads[lv], where, major), n, fine, header, tables)
        cc = sym["child_count"]
        _check_children(cc, lv, fine_level, counts)
        if lv < stop:
            dec = dequantize(sym, 0, n, fine, where)
            kept.append((dec, np.flatnonzero(cc == 0)))
            # the encoder's closed loop sees float32 parents
            prev, parent_row = Parents.of(dec, slice(None)), np.repeat(np.arange(n, dtype=np.int64), cc)
            continue
        # format 5.1: a fine-tier node coded once for several identical source rows is repeated
        copies = sym.get("copies") if fine else None
        extra = 0 if copies is None else int(copies.sum())
        if extra:
            _check_memory(header, tables, sum(counts[: stop + 1]) + extra, len(data), max_memory)
        out = _Output(sum(len(rows) for _, rows in kept) + n + extra, k_rest)
        at = 0
        for dec, rows in kept:
            at = out.put(at, dec, rows)
        kept.clear()
        for a in range(0, n, CHUNK_NODES):
            b = min(n, a + CHUNK_NODES)
            rows = slice(None) if not extra else np.repeat(np.arange(b - a), copies[a:b] + 1)
            at = out.put(at, dequantize(sym, a, b, fine, where), rows)
    if out.means.shape[0] == 0:
        raise bs.FormatError("corrupt .pgms: the decoded scene holds no Gaussians")
    back = bs.read_transform(header, books)
    if back is not None and not coded_frame:  # the file codes the scene in its canonical frame: map it back
        with np.errstate(over="ignore", invalid="ignore"):
            apply_file_transform_(out.means, out.quats, out.log_scales, out.rest, back)
        if not np.isfinite(out.means).all():
            raise bs.FormatError("corrupt .pgms: positions are not finite in the scene's frame (XFRM)")
        if not (np.abs(out.log_scales) <= MAX_ABS_LOG_SCALE).all():  # NaN fails too
            raise bs.FormatError(f"corrupt .pgms: log-scales leave [-{MAX_ABS_LOG_SCALE:g}, {MAX_ABS_LOG_SCALE:g}] "
                                 "in the scene's frame (XFRM)")
    return _finite(out.scene())


def _finite(scene: GaussianScene) -> GaussianScene:
    """The one finiteness rule of every reader (``scene_check``): a decoded scene is finite after
    activation in float32 or the file is corrupt. The format's bounds imply it; this states it."""
    try:
        return check_finite(scene, "decoded scene")[0]
    except SceneError as exc:
        raise bs.FormatError(f"corrupt .pgms: {str(exc).split(' (use nonfinite=')[0]}") from None


def info(path_or_bytes) -> dict:
    """Header fields and section sizes of a .pgms, without decoding the levels."""
    data = Path(path_or_bytes).read_bytes() if isinstance(path_or_bytes, (str, os.PathLike)) else bytes(path_or_bytes)
    major, minor = bs.read_preamble(data)
    secs = list(bs.iter_sections(data))
    sections = [(s.tag, s.level, len(s.payload)) for s in secs]
    header = bs.parse_header(secs[0].payload, len(data), (major, minor))
    back = bs.read_transform(header, {s.tag: s.payload for s in secs if s.level == bs.GLOBAL_LEVEL})
    return {
        "bytes": len(data), "version": f"{major}.{minor}", "levels": header.num_levels,
        "sh_degree": header.sh_degree, "nodes": header.total_nodes, "source_gaussians": header.source_gaussians,
        "reference_bytes": header.reference_bytes,
        "ratio": round(header.reference_bytes / len(data), 3) if header.reference_bytes else None,
        "shape_codebook": header.shape_codebook_size, "sh_codebook": header.sh_codebook_size,
        "sh_codebook_degree": header.sh_codebook_degree,
        "quantizer": vars(header.quant),
        # the coded frame -> the scene's (None: coded as given)
        "frame": None if back is None else {"quat": list(back.quat), "translation": list(back.translation),
                                            "scale": back.scale},
        "sections": [{"tag": t, "level": (None if lv == bs.GLOBAL_LEVEL else lv), "bytes": b} for t, lv, b in sections],
    }
