"""Section XFRM of the .pgms format (5.x): the similarity from the coded (canonical) frame back
to the scene's, with the SH band rotations every decoder applies (docs/FORMAT.md)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .coders import FormatError

__all__ = ["XFRM", "FileTransform"]

XFRM = struct.Struct("<9d")  # quaternion w x y z, translation x y z, scale, log(scale), then SH bands
XFRM_SCALE_RANGE = (1e-30, 1e30)
XFRM_MAX_TRANSLATION = 1e30


@dataclass(frozen=True)
class FileTransform:
    """Section XFRM (format 5+): the coded scene is in a canonical frame; each decoded Gaussian
    maps back by ``x = scale * R(quat) @ x' + translation``, its orientation by ``quat * q'``,
    its log-scales by ``+ log_scale`` and its SH band l by ``c = D_l c'`` (the float32 [2l+1,
    2l+1] matrices stored here, for l = 1..the HEAD's SH degree, so that every decoder computes
    the same values with + and * alone). Absent: the coded frame is the scene's."""

    quat: tuple  # (w, x, y, z), unit, float64
    translation: tuple  # (x, y, z) float64
    scale: float
    log_scale: float  # log(scale), stored so that no decoder computes a logarithm
    sh_bands: tuple = ()  # float32 [2l+1, 2l+1] arrays, l = 1..sh_degree

    def pack(self) -> bytes:
        bands = b"".join(np.asarray(D, "<f4").tobytes() for D in self.sh_bands)
        return XFRM.pack(*self.quat, *self.translation, self.scale, self.log_scale) + bands

    @classmethod
    def unpack(cls, payload: bytes, sh_degree: int) -> FileTransform:
        need = XFRM.size + 4 * sum((2 * l + 1) ** 2 for l in range(1, sh_degree + 1))
        if len(payload) != need:
            raise FormatError(f"XFRM: section has {len(payload)} bytes, expected {need} for SH degree {sh_degree}")
        v = XFRM.unpack_from(payload, 0)
        if not all(np.isfinite(v)):
            raise FormatError("XFRM: non-finite transform")
        q, t, s, ls = v[:4], v[4:7], v[7], v[8]
        if abs(float(np.linalg.norm(q)) - 1.0) > 1e-9:
            raise FormatError(f"XFRM: rotation quaternion of norm {float(np.linalg.norm(q)):.12g}, expected 1")
        if not XFRM_SCALE_RANGE[0] <= s <= XFRM_SCALE_RANGE[1] or max(abs(x) for x in t) > XFRM_MAX_TRANSLATION:
            raise FormatError(f"XFRM: scale {s:.6g} or translation {t} out of range")
        if abs(np.log(s) - ls) > 1e-9 * max(1.0, abs(ls)):
            raise FormatError(f"XFRM: log-scale {ls:.12g} is not the log of the scale {s:.12g}")
        bands, pos = [], XFRM.size
        for l in range(1, sh_degree + 1):
            n = 2 * l + 1
            D = np.frombuffer(payload, "<f4", n * n, pos).reshape(n, n)
            pos += 4 * n * n
            if not np.isfinite(D).all() or np.abs(D.astype(np.float64) @ D.T - np.eye(n)).max() > 1e-5:
                raise FormatError(f"XFRM: SH band {l} matrix is not a rotation")
            bands.append(D)
        return cls(tuple(q), tuple(t), float(s), float(ls), tuple(bands))
