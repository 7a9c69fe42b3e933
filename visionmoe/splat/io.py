"""GaussianScene and INRIA-layout .ply reading/writing (via plyfile); files are written with
:func:`visionmoe.common.files.atomic_write`."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch
from plyfile import PlyData, PlyElement

from ..common.files import atomic_write
from ._finite import verdict

logger = logging.getLogger(__name__)


class SceneError(ValueError):
    """A scene file or scene tensor is not what a 3DGS .ply must be; the message says why."""


def sh_coeffs(degree: int) -> int:
    return (degree + 1) ** 2


@dataclass
class GaussianScene:
    """A trained 3DGS scene in the INRIA parameterisation (activations not applied)."""

    means: torch.Tensor  # [N, 3]
    quats: torch.Tensor  # [N, 4] (w, x, y, z), not necessarily normalised
    log_scales: torch.Tensor  # [N, 3]
    opacity_logits: torch.Tensor  # [N]
    sh_dc: torch.Tensor  # [N, 3]
    sh_rest: torch.Tensor  # [N, K-1, 3], K = (sh_degree + 1)^2

    def __post_init__(self):
        n = self.means.shape[0]
        expected = {
            "means": (n, 3), "quats": (n, 4), "log_scales": (n, 3), "opacity_logits": (n,), "sh_dc": (n, 3),
        }
        for name, shape in expected.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise SceneError(f"GaussianScene.{name} must have shape {shape}, got {got}")
        rest = tuple(self.sh_rest.shape)
        if len(rest) != 3 or rest[0] != n or rest[2] != 3 or rest[1] not in (0, 3, 8, 15):
            raise SceneError(f"GaussianScene.sh_rest must have shape ({n}, K-1, 3) with K-1 in (0, 3, 8, 15), got {rest}")

    @property
    def num_gaussians(self) -> int:
        return int(self.means.shape[0])

    def __len__(self) -> int:
        return self.num_gaussians

    @property
    def sh_degree(self) -> int:
        return int(round(math.sqrt(self.sh_rest.shape[1] + 1))) - 1

    @property
    def sh(self) -> torch.Tensor:  # [N, K, 3]
        return torch.cat([self.sh_dc.unsqueeze(1), self.sh_rest], dim=1)

    @property
    def device(self) -> torch.device:
        return self.means.device

    def to(self, *args, **kwargs) -> GaussianScene:
        return replace(self, **{f.name: getattr(self, f.name).to(*args, **kwargs) for f in fields(self)})

    def subset(self, index: torch.Tensor) -> GaussianScene:
        """Gaussians selected by a bool mask [N] or an index tensor."""
        return replace(self, **{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def with_sh_degree(self, degree: int) -> GaussianScene:
        """Truncate (or zero-pad) the view-dependent SH bands to ``degree``."""
        k = sh_coeffs(degree) - 1
        rest = self.sh_rest[:, :k]
        if rest.shape[1] < k:
            pad = rest.new_zeros(rest.shape[0], k - rest.shape[1], 3)
            rest = torch.cat([rest, pad], dim=1)
        return replace(self, sh_rest=rest)

    def float_ply_bytes(self) -> int:
        """Size of this scene as a binary float32 INRIA .ply at its native SH degree (payload)."""
        per = 3 + 3 + 3 + 3 * (sh_coeffs(self.sh_degree) - 1) + 1 + 3 + 4  # xyz, normals, dc, rest, op, scale, rot
        return self.num_gaussians * per * 4


_REQUIRED = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity",
             "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]

_PLY_SIZES = {
    "char": 1, "int8": 1, "uchar": 1, "uint8": 1, "short": 2, "int16": 2, "ushort": 2, "uint16": 2,
    "int": 4, "int32": 4, "uint": 4, "uint32": 4, "float": 4, "float32": 4, "double": 8, "float64": 8,
}
_PLY_FLOATS = {"float", "float32", "double", "float64"}
_MAX_HEADER = 1 << 20  # bytes; real 3DGS headers are ~2 KB
MAX_GAUSSIANS = 1 << 28  # 268M: far above any real scene, low enough to refuse absurd headers


@dataclass
class _PlyHeader:
    fmt: str  # "ascii" | "binary_little_endian" | "binary_big_endian"
    elements: list  # [(name, count, [(prop_name, type or None for list)])]
    body_offset: int


def _scan_header(path: Path, raw: bytes) -> _PlyHeader:
    """Parse and sanity-check a .ply header before plyfile allocates anything."""
    if not raw.startswith(b"ply"):
        raise SceneError(f"{path}: not a .ply file (first bytes {raw[:8]!r}, expected 'ply')")
    end = raw.find(b"end_header")
    if end < 0:
        what = "the file ends" if len(raw) < _MAX_HEADER else f"the first {_MAX_HEADER} bytes end"
        raise SceneError(f"{path}: truncated or corrupt .ply header ({what} before 'end_header')")
    nl = raw.find(b"\n", end)
    if nl < 0:
        raise SceneError(f"{path}: truncated .ply (nothing after 'end_header')")
    try:
        lines = raw[:end].decode("ascii").splitlines()
    except UnicodeDecodeError:
        raise SceneError(f"{path}: .ply header is not ASCII text") from None
    fmt, elements = None, []
    for lineno, line in enumerate(lines[1:], start=2):
        tok = line.split()
        if not tok or tok[0] in ("comment", "obj_info"):
            continue
        if tok[0] == "format":
            if len(tok) < 2 or tok[1] not in ("ascii", "binary_little_endian", "binary_big_endian"):
                raise SceneError(f"{path}: header line {lineno}: unknown format {line.strip()!r}")
            fmt = tok[1]
        elif tok[0] == "element":
            if len(tok) != 3 or not tok[2].isdigit():
                raise SceneError(f"{path}: header line {lineno}: expected 'element <name> <count>', got {line.strip()!r}")
            elements.append((tok[1], int(tok[2]), []))
        elif tok[0] == "property":
            if not elements:
                raise SceneError(f"{path}: header line {lineno}: property before any element")
            if len(tok) == 3 and tok[1] in _PLY_SIZES:
                elements[-1][2].append((tok[2], tok[1]))
            elif len(tok) == 5 and tok[1] == "list":
                elements[-1][2].append((tok[4], None))
            else:
                raise SceneError(f"{path}: header line {lineno}: unknown property declaration {line.strip()!r}")
        else:
            raise SceneError(f"{path}: header line {lineno}: unexpected {line.strip()!r}")
    if fmt is None:
        raise SceneError(f"{path}: .ply header has no 'format' line")
    return _PlyHeader(fmt, elements, nl + 1)


def _check_header(path: Path, header: _PlyHeader, file_size: int) -> int:
    """Validate the vertex element against the INRIA layout and the file size; return N."""
    vertex = next((e for e in header.elements if e[0] == "vertex"), None)
    if vertex is None:
        raise SceneError(f"{path}: no 'vertex' element; a 3DGS .ply stores Gaussians as vertices")
    _, n, props = vertex
    types = dict(props)
    missing = [name for name in _REQUIRED if name not in types]
    if missing:
        raise SceneError(f"{path}: missing vertex properties {missing}; expected an INRIA-layout 3DGS .ply")
    for name, typ in props:
        if (name in _REQUIRED or name.startswith("f_rest_")) and typ not in _PLY_FLOATS:
            raise SceneError(
                f"{path}: vertex property {name} has type {'list' if typ is None else typ}, expected float or double"
            )
    if n == 0:
        raise SceneError(f"{path}: the scene holds zero Gaussians")
    if n > MAX_GAUSSIANS:
        raise SceneError(f"{path}: header claims {n} Gaussians, more than the {MAX_GAUSSIANS} this reader accepts")
    if header.fmt != "ascii":
        offset = header.body_offset
        for name, count, eprops in header.elements:
            if any(t is None for _, t in eprops):
                break  # list properties: sizes unknown until read; plyfile checks the rest
            need = count * sum(_PLY_SIZES[t] for _, t in eprops)
            if name == "vertex" and offset + need > file_size:
                raise SceneError(
                    f"{path}: truncated .ply: the header declares {n} Gaussians ({need} bytes of vertex data) "
                    f"but only {max(file_size - offset, 0)} bytes follow the header"
                )
            offset += need
    return n


_NP_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1", "short": "i2", "int16": "i2", "ushort": "u2",
    "uint16": "u2", "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4", "float": "f4", "float32": "f4",
    "double": "f8", "float64": "f8",
}


def _read_binary_fast(path: Path, header: _PlyHeader):
    """Vertex records of a binary .ply whose elements before 'vertex' have no list properties,
    read in one go (plyfile reads row by row without a memory map). None: use plyfile."""
    if header.fmt == "ascii":
        return None
    order = "<" if header.fmt == "binary_little_endian" else ">"
    offset = header.body_offset
    for name, count, props in header.elements:
        if any(t is None for _, t in props):
            return None
        dtype = np.dtype([(p, order + _NP_TYPES[t]) for p, t in props])
        if name == "vertex":
            with open(path, "rb") as f:
                f.seek(offset)
                raw = f.read(count * dtype.itemsize)
            if len(raw) != count * dtype.itemsize:
                raise SceneError(f"{path}: truncated .ply: vertex data ends after {len(raw)} of {count * dtype.itemsize} bytes")
            return np.frombuffer(raw, dtype=dtype, count=count)
        offset += count * dtype.itemsize
    return None


def read_ply(path: str | os.PathLike, *, nonfinite: str = "reject") -> GaussianScene:
    """Read an INRIA-layout 3DGS .ply (ascii or binary, either endianness, SH degree 0-3).

    Extra properties and elements are ignored; the attribute properties must be float or
    double. Every problem raises :class:`SceneError` naming the file and what was expected:
    a header that is not a .ply, missing or mistyped properties, zero Gaussians, a body
    shorter than the header declares. ``nonfinite``: "reject" raises SceneError on values that
    are not finite after activation in float32 (:func:`.scene_check.check_finite`); "drop"
    removes those Gaussians and logs how many.
    """
    if nonfinite not in ("reject", "drop"):
        raise ValueError(f"nonfinite must be 'reject' or 'drop', got {nonfinite!r}")
    path = Path(path)
    if not path.is_file():
        raise SceneError(f"{path}: no such file")
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(_MAX_HEADER)
    header = _scan_header(path, head)
    _check_header(path, header, file_size)
    data = _read_binary_fast(path, header)
    if data is None:
        try:
            ply = PlyData.read(str(path), mmap=False)  # a memory map turns a file truncated meanwhile into SIGBUS
        except Exception as exc:  # plyfile raises several types for malformed bodies
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SceneError(f"{path}: malformed or truncated .ply body ({type(exc).__name__}: {msg})") from None
        data = ply["vertex"].data
    names = set(data.dtype.names)
    rest_names = sorted((nm for nm in names if nm.startswith("f_rest_")), key=lambda s: int(s.split("_")[-1]))
    if len(rest_names) not in (0, 9, 24, 45) or rest_names != [f"f_rest_{i}" for i in range(len(rest_names))]:
        raise SceneError(
            f"{path}: {len(rest_names)} f_rest_* properties; expected f_rest_0..f_rest_K-1 with "
            "K in 0, 9, 24, 45 (SH degree 0-3)"
        )
    n = len(data)
    if n == 0:
        raise SceneError(f"{path}: the scene holds zero Gaussians")

    def column(name: str) -> np.ndarray:
        col = data[name]
        if col.dtype.kind != "f":
            raise SceneError(f"{path}: property {name} has type {col.dtype}, expected float or double")
        return np.asarray(col, dtype=np.float32)

    def stack(cols) -> np.ndarray:
        return np.stack([column(c) for c in cols], axis=1) if cols else np.zeros((n, 0), np.float32)

    with np.errstate(over="ignore", invalid="ignore"):  # doubles beyond float32 range become inf: reported below
        means = stack(["x", "y", "z"])
        dc = stack(["f_dc_0", "f_dc_1", "f_dc_2"])
        k = len(rest_names) // 3
        rest = stack(rest_names).reshape(n, 3, k).transpose(0, 2, 1)  # file is channel-major
        opacity = column("opacity")
        scales = stack(["scale_0", "scale_1", "scale_2"])
        quats = stack(["rot_0", "rot_1", "rot_2", "rot_3"])

    # the one finiteness rule (scene_check's, on the arrays: scene_check imports this module)
    keep, error = verdict({"means": means, "quats": quats, "log_scales": scales, "opacity_logits": opacity,
                           "sh_dc": dc, "sh_rest": rest}, str(path), nonfinite)
    if error:
        raise SceneError(error)
    if keep is not None:
        means, dc, rest, opacity, scales, quats = (a[keep] for a in (means, dc, rest, opacity, scales, quats))

    def t(a):  # contiguous and writable (a column of a small file can be a read-only view; torch warns)
        return torch.from_numpy(np.require(a, requirements=["C", "W"]))

    return GaussianScene(means=t(means), quats=t(quats), log_scales=t(scales), opacity_logits=t(opacity), sh_dc=t(dc),
                         sh_rest=t(rest))


def write_ply(scene: GaussianScene, path: str | os.PathLike, *, ascii: bool = False, byte_order: str = "<") -> Path:
    """Write an INRIA-layout float32 .ply atomically (temp file in the same folder + rename).

    ``byte_order``: "<" (little-endian, the INRIA default) or ">" for binary files.
    """
    if byte_order not in ("<", ">"):
        raise ValueError(f"byte_order must be '<' or '>', got {byte_order!r}")
    path = Path(path)
    s = scene.to("cpu")
    n, k = s.num_gaussians, s.sh_rest.shape[1]
    rest_names = [f"f_rest_{i}" for i in range(3 * k)]
    names = (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"] + rest_names
             + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])
    rest = s.sh_rest.detach().float().numpy().transpose(0, 2, 1).reshape(n, 3 * k)
    cols = np.concatenate([
        s.means.detach().float().numpy(), np.zeros((n, 3), np.float32), s.sh_dc.detach().float().numpy(), rest,
        s.opacity_logits.detach().float().numpy()[:, None], s.log_scales.detach().float().numpy(),
        s.quats.detach().float().numpy(),
    ], axis=1)
    data = np.empty(n, dtype=[(name, "<f4") for name in names])
    for i, name in enumerate(names):
        data[name] = cols[:, i]
    ply = PlyData([PlyElement.describe(data, "vertex")], text=ascii, byte_order=byte_order)
    return atomic_write(path, ply.write)
