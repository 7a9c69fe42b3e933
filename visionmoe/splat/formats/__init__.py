"""Scene file formats besides the INRIA ``.ply`` and ``.pgms``: read any, write any, by extension.

| extension | format | read | write |
|---|---|---|---|
| ``.ply`` | INRIA 3DGS ``.ply`` (float, SH 0-3) | yes | yes |
| ``.compressed.ply`` (or a ``.ply`` with a ``chunk`` element) | PlayCanvas compressed ``.ply`` | yes | yes |
| ``.splat`` | antimatter15 ``.splat`` (32 bytes per Gaussian, no SH) | yes | yes |
| ``.spz`` | Niantic SPZ, versions 2-4 (:mod:`.spz`; writes version 4) | yes | yes |
| ``.sog`` | PlayCanvas SOG version 2, bundled (a zip; :mod:`.sog`) | yes | yes |
| ``meta.json`` | PlayCanvas SOG version 2, unbundled (the textures beside it) | yes | yes |
| ``.ksplat`` | mkkellogg GaussianSplats3D (:mod:`.ksplat`) | yes | no |
| ``.pgms`` | PGMS bitstream (:mod:`visionmoe.splat.pgms`) | yes (:func:`read_any`) | via ``compress`` |

Every scene :func:`read_any` returns, and every scene :func:`write_any` is given, passes the one
finiteness rule (:func:`visionmoe.splat.scene_check.check_finite`).

::

    from visionmoe.splat.formats import read_any, write_any
    scene = read_any("scene.spz")               # or .ply, .compressed.ply, .splat, .sog, meta.json, .ksplat, .pgms
    write_any(scene, "scene.sog")               # or .ply, .compressed.ply, .splat, .spz, meta.json
"""

from __future__ import annotations

import os
from pathlib import Path

from ..io import GaussianScene, SceneError
from ..scene_check import check_finite
from .compressed_ply import compressed_ply_bytes, is_compressed_ply, read_compressed_ply, write_compressed_ply
from .ksplat import read_ksplat
from .sog import is_sog_meta, read_sog, sog_bytes, write_sog
from .splat_file import read_splat, splat_bytes, write_splat
from .spz import read_spz, spz_bytes, write_spz

__all__ = [
    "READ_FORMATS",
    "WRITE_FORMATS",
    "compressed_ply_bytes",
    "format_of",
    "is_compressed_ply",
    "read_any",
    "read_compressed_ply",
    "read_ksplat",
    "read_sog",
    "read_splat",
    "read_spz",
    "sog_bytes",
    "splat_bytes",
    "spz_bytes",
    "write_any",
    "write_compressed_ply",
    "write_sog",
    "write_splat",
    "write_spz",
]

#: format name -> description, for help texts and error messages
READ_FORMATS = {"ply": "INRIA 3DGS .ply", "compressed.ply": "PlayCanvas compressed .ply",
                "splat": "antimatter15 .splat", "spz": "Niantic .spz", "sog": "PlayCanvas SOG bundle",
                "meta.json": "PlayCanvas SOG, unbundled", "ksplat": "GaussianSplats3D .ksplat",
                "pgms": "PGMS bitstream"}
WRITE_FORMATS = {"ply": "INRIA 3DGS .ply", "compressed.ply": "PlayCanvas compressed .ply",
                 "splat": "antimatter15 .splat", "spz": "Niantic .spz", "sog": "PlayCanvas SOG bundle",
                 "meta.json": "PlayCanvas SOG, unbundled"}


def format_of(path: str | os.PathLike) -> str:
    """The format a file name asks for: a key of :data:`READ_FORMATS` (``"compressed.ply"``,
    ``"ply"``, ``"splat"``, ``"spz"``, ``"sog"``, ``"meta.json"``, ``"ksplat"`` or ``"pgms"``).

    Raises :class:`SceneError` for any other extension.
    """
    name = Path(path).name.lower()
    if name.endswith(".compressed.ply"):
        return "compressed.ply"
    if is_sog_meta(name):
        return "meta.json"
    for ext in ("ply", "splat", "spz", "sog", "ksplat", "pgms"):
        if name.endswith("." + ext):
            return ext
    raise SceneError(f"{path}: unknown scene format; expected one of "
                     + ", ".join(e if e == "meta.json" else f".{e}" for e in READ_FORMATS))


def _read(path: str | os.PathLike, fmt: str, nonfinite: str) -> GaussianScene:
    if fmt == "splat":
        return read_splat(path, nonfinite=nonfinite)
    if fmt == "spz":
        return read_spz(path)
    if fmt in ("sog", "meta.json"):
        return read_sog(path)
    if fmt == "ksplat":
        return read_ksplat(path)
    if fmt == "pgms":
        from ..pgms.decode import decompress

        return decompress(path)
    if fmt == "compressed.ply" or is_compressed_ply(path):
        return read_compressed_ply(path)
    from ..io import read_ply

    return read_ply(path, nonfinite=nonfinite)


def read_any(path: str | os.PathLike, *, nonfinite: str = "reject") -> GaussianScene:
    """Read a scene from any supported file, chosen by extension.

    A ``.ply`` whose header has PlayCanvas's ``chunk`` element is read as a compressed
    ``.ply`` whatever its name; a ``.pgms`` is decoded at its full level. Gaussians with
    values that are not finite after activation raise :class:`SceneError`, or are dropped
    (with a warning) under ``nonfinite="drop"``.
    """
    if nonfinite not in ("reject", "drop"):
        raise ValueError(f"nonfinite must be 'reject' or 'drop', got {nonfinite!r}")
    scene = _read(path, format_of(path), nonfinite)
    return check_finite(scene, str(path), nonfinite=nonfinite)[0]


def write_any(scene: GaussianScene, path: str | os.PathLike) -> Path:
    """Write a scene in the format its file name asks for (a key of :data:`WRITE_FORMATS`),
    atomically. A scene with values that are not finite after activation is refused."""
    fmt = format_of(path)
    if fmt == "pgms":
        raise SceneError(f"{path}: cannot write .pgms with write_any; use visionmoe.splat.compress")
    if fmt not in WRITE_FORMATS:
        raise SceneError(f"{path}: cannot write {READ_FORMATS[fmt]} files (read only); write one of "
                         + ", ".join(e if e == "meta.json" else f".{e}" for e in WRITE_FORMATS))
    check_finite(scene, str(path), nonfinite="reject")
    if fmt == "splat":
        return write_splat(scene, path)
    if fmt == "spz":
        return write_spz(scene, path)
    if fmt in ("sog", "meta.json"):
        return write_sog(scene, path)
    if fmt == "compressed.ply":
        return write_compressed_ply(scene, path)
    from ..io import write_ply

    return write_ply(scene, path)  # through the one atomic writer, which refuses special files
