"""PGMS decoding: .pgms bytes (or a prefix holding the first levels) -> GaussianScene.

Re-exported by :mod:`.codec` as the public ``decompress``; the encoder's render checks decode
with it too (so it sits below both)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from . import bitstream as bs
from .io import GaussianScene, SceneError
from .quantize import Parents, dequantize_level

__all__ = ["decode_tree", "decompress", "level_node_counts"]


def decompress(path_or_bytes, level: int | None = None) -> GaussianScene:
    """Decode .pgms (a path, bytes or memoryview) to a GaussianScene at the source's SH degree.

    ``level``: decode only pyramid levels 0..level (progressive: a coarser scene; the bytes
    may be a prefix of the file that holds those levels). Invalid input raises
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
    if level is not None and (not isinstance(level, int) or level < 0):
        raise ValueError(f"level must be a non-negative int or None, got {level!r}")
    levels, terminal, _header = decode_tree(data, level)
    parts = []
    last = len(levels) - 1
    for lv, (sc, term) in enumerate(zip(levels, terminal)):
        parts.append(sc if lv == last else sc.subset(torch.from_numpy(term)))
    out = GaussianScene(**{name: torch.cat([getattr(p, name) for p in parts]) for name in
                           ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest")})
    if out.num_gaussians == 0:
        raise bs.FormatError("corrupt .pgms: the decoded scene holds no Gaussians")
    return out


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
        if n == 0 or (lv == 0 and n != header.level0):
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


def decode_tree(data: bytes | memoryview, level: int | None = None):
    """Decode .pgms bytes -> (list of per-level decoded scenes, per-level terminal masks, header).

    ``level``: stop after that pyramid level (progressive decoding); None decodes all.
    Every node count is checked (against HEAD, the level sections' stream headers and the
    previous level's child counts) before any array is sized by it (docs/ROBUSTNESS.md)."""
    header, books, payloads = bs.read_container(data, level)
    major, _minor = bs.read_preamble(data)
    counts = level_node_counts(header, payloads)
    tables, shape_table = bs.read_tables(header, books, major)
    k_rest = (header.sh_degree + 1) ** 2 - 1
    fine_level = header.num_levels - 1
    decoded_levels, terminal = [], []
    stop = len(payloads) - 1 if level is None else min(level, len(payloads) - 1)
    parents = Parents.root(header.origin, counts[0])
    for lv in range(stop + 1):
        n, where, fine = counts[lv], f"level {lv}", lv == fine_level
        sym = bs.read_level(bs.StreamReader(payloads[lv], where), n, fine, header, tables)
        dec = dequantize_level(sym, parents, fine, header.quant, tables, shape_table, k_rest, major, where)
        cc = sym["child_count"]
        decoded_levels.append(dec.to_scene())
        terminal.append(cc == 0)
        children = int(cc.sum())
        if fine and children:
            raise bs.FormatError(f"{where}: the finest level declares children")
        if not fine and lv + 1 < len(counts) and children != counts[lv + 1]:
            raise bs.FormatError(f"{where}: child counts add up to {children}, level {lv + 1} holds {counts[lv + 1]} nodes")
        if not fine and children == 0:
            raise bs.FormatError(f"{where}: no node has children, but level {lv + 1} follows")
        if lv < stop:  # the encoder's closed loop sees float32 parents
            parents = Parents.of(dec, np.repeat(np.arange(n), cc))
    return decoded_levels, terminal, header
