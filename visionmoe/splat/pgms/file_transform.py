"""Section XFRM of the .pgms format (5.x): the similarity from the coded (canonical) frame back
to the scene's, with the SH band rotations every decoder applies (docs/FORMAT.md)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import torch

from .coders import FormatError

__all__ = ["XFRM", "FileTransform", "rotmat_from_quat", "apply_file_transform_"]

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
        with np.errstate(over="ignore"):  # a huge component overflows the norm to inf: refused below
            norm = float(np.linalg.norm(q))
        if abs(norm - 1.0) > 1e-9:
            raise FormatError(f"XFRM: rotation quaternion of norm {norm:.12g}, expected 1")
        if not XFRM_SCALE_RANGE[0] <= s <= XFRM_SCALE_RANGE[1] or max(abs(x) for x in t) > XFRM_MAX_TRANSLATION:
            raise FormatError(f"XFRM: scale {s:.6g} or translation {t} out of range")
        if abs(np.log(s) - ls) > 1e-9 * max(1.0, abs(ls)):
            raise FormatError(f"XFRM: log-scale {ls:.12g} is not the log of the scale {s:.12g}")
        bands, pos = [], XFRM.size
        for l in range(1, sh_degree + 1):
            n = 2 * l + 1
            D = np.frombuffer(payload, "<f4", n * n, pos).reshape(n, n)
            pos += 4 * n * n
            D64 = D.astype(np.float64)
            # orthogonal within 1e-5 and determinant +1 (the encoder writes rotations only: a band
            # matrix of a proper rotation); |det| is then within 1e-4 of 1, so its sign is robust
            if not np.isfinite(D).all() or np.abs(D64 @ D64.T - np.eye(n)).max() > 1e-5 or np.linalg.det(D64) <= 0:
                raise FormatError(f"XFRM: SH band {l} matrix is not a rotation (orthogonal within 1e-5, determinant +1)")
            bands.append(D)
        return cls(tuple(q), tuple(t), float(s), float(ls), tuple(bands))


def rotmat_from_quat(q) -> torch.Tensor:
    """[3, 3] float64 rotation matrix of a unit (w, x, y, z) quaternion, taken as given (not
    normalised again: the decoders rebuild a file's rotation from its stored quaternion)."""
    w, x, y, z = torch.as_tensor(q, dtype=torch.float64).reshape(4).tolist()
    return torch.tensor([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                         [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                         [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]], dtype=torch.float64)


def apply_file_transform_(means, quats, log_scales, sh_rest, back, chunk: int = 1 << 16) -> None:
    """Map a decoder's float32 arrays (in place) from the file's coded frame to the scene's by
    its XFRM section ``back`` (:class:`FileTransform`). Elementwise
    float64 arithmetic in a fixed order, rounded to float32 once per value: the browser decoder
    (web/src/pgms.js) repeats it operation for operation and gets the same bits."""
    w, x, y, z = back.quat
    R = rotmat_from_quat(back.quat).numpy()
    tx, ty, tz = back.translation
    s = back.scale
    ls = np.float32(back.log_scale)
    k_rest = sh_rest.shape[1]
    for a in range(0, means.shape[0], chunk):
        b = min(means.shape[0], a + chunk)
        m = means[a:b].astype(np.float64)
        m0, m1, m2 = m[:, 0], m[:, 1], m[:, 2]
        for i, t in enumerate((tx, ty, tz)):
            means[a:b, i] = s * (R[i, 0] * m0 + R[i, 1] * m1 + R[i, 2] * m2) + t
        q = quats[a:b].astype(np.float64)
        bw, bx, by, bz = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
        quats[a:b, 0] = w * bw - x * bx - y * by - z * bz
        quats[a:b, 1] = w * bx + x * bw + y * bz - z * by
        quats[a:b, 2] = w * by - x * bz + y * bw + z * bx
        quats[a:b, 3] = w * bz + x * by - y * bx + z * bw
        log_scales[a:b] += ls
        if k_rest:
            rest = sh_rest[a:b].astype(np.float64)
            for band, D in enumerate(back.sh_bands, start=1):
                lo = band * band - 1
                D = D.astype(np.float64)
                for i in range(D.shape[0]):
                    acc = D[i, 0] * rest[:, lo]
                    for j in range(1, D.shape[1]):
                        acc = acc + D[i, j] * rest[:, lo + j]
                    sh_rest[a:b, lo + i] = acc
