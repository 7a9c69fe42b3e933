"""Section HEAD of a .pgms file: the format's version and its 68-byte header (docs/FORMAT.md, "HEAD")."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .coders import FormatError
from .quantize import Quantizer

VERSION = (5, 0)
VERSION_COPIES = (5, 1)  # written when the fine tier codes copy counts (HEAD flag FLAG_COPIES)
HEAD = struct.Struct("<BBBBIIIIffffBBHIIfffQ")
MAX_NODES = 1 << 28
MAX_CHILDREN = 255
FLAG_COPIES = 1  # HEAD flags (offset 38, format 5.1+): the fine tier ends with the stream `copies`
MAX_COPIES = 16  # source rows one fine-tier node may stand for


@dataclass
class Header:
    num_levels: int
    sh_degree: int
    level0: int
    total_nodes: int
    source_gaussians: int
    shape_codebook_size: int
    sh_codebook_size: int
    has_sh_codebook: bool
    sh_codebook_degree: int
    origin: np.ndarray
    quant: Quantizer
    reference_bytes: int
    copies: bool = False  # the fine tier codes copy counts (FLAG_COPIES)


def parse_header(payload: bytes, file_size: int, version: tuple[int, int] = VERSION) -> Header:
    if len(payload) != HEAD.size:
        raise FormatError(f"HEAD section has {len(payload)} bytes, expected {HEAD.size}")
    (n_levels, sh_degree, op_bits, rot_bits, level0, total, source, k_shape, pos_rel, dc_step, ls_step, min_step,
     has_sh, cb_degree, flags, k_sh, r3, ox, oy, oz, ref) = HEAD.unpack(payload)
    if r3 or flags & ~(FLAG_COPIES if version >= VERSION_COPIES else 0):
        raise FormatError("HEAD reserved fields are not zero")
    if not 1 <= n_levels <= 32:
        raise FormatError(f"HEAD declares {n_levels} levels, expected 1-32")
    if sh_degree > 3:
        raise FormatError(f"HEAD declares SH degree {sh_degree}, expected 0-3")
    if not 0 < level0 <= total <= min(MAX_NODES, 64 * file_size):
        raise FormatError(f"HEAD node counts (level 0: {level0}, total: {total}) are impossible for a {file_size}-byte file")
    if not 1 <= k_shape <= 1 << 16 or k_sh > 1 << 16 or has_sh not in (0, 1) or (has_sh and (k_sh == 0 or sh_degree == 0)):
        raise FormatError(f"HEAD codebook sizes invalid (shape {k_shape}, SH {k_sh}, flag {has_sh})")
    if (has_sh and not 1 <= cb_degree <= sh_degree) or (not has_sh and (cb_degree or k_sh)):
        raise FormatError(f"HEAD SH codebook degree {cb_degree} invalid for SH degree {sh_degree}")
    origin = np.array([ox, oy, oz], np.float64)
    if not np.isfinite(origin).all():
        raise FormatError("HEAD origin is not finite")
    quant = Quantizer(pos_rel, dc_step, ls_step, min_step, op_bits, rot_bits)
    return Header(n_levels, sh_degree, level0, total, source, k_shape, k_sh, bool(has_sh), cb_degree, origin, quant, ref,
                  bool(flags & FLAG_COPIES))
