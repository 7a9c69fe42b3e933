"""PGMS decoding: .pgms bytes (or a prefix holding the first levels) -> GaussianScene.

Re-exported by :mod:`.codec` as the public ``decompress``; the encoder's render checks decode
with it too (so it sits below both)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from . import bitstream as bs
from .io import GaussianScene, SceneError

__all__ = ["decompress"]


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
    levels, terminal, _header = bs.decode_tree(data, level)
    parts = []
    last = len(levels) - 1
    for lv, (sc, term) in enumerate(zip(levels, terminal)):
        parts.append(sc if lv == last else sc.subset(torch.from_numpy(term)))
    out = GaussianScene(**{name: torch.cat([getattr(p, name) for p in parts]) for name in
                           ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest")})
    if out.num_gaussians == 0:
        raise bs.FormatError("corrupt .pgms: the decoded scene holds no Gaussians")
    return out
