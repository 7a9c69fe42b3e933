"""Scene file formats besides the INRIA ``.ply`` and ``.pgms``: read any, write any, by extension.

| extension | format | read | write |
|---|---|---|---|
| ``.ply`` | INRIA 3DGS ``.ply`` (float, SH 0-3) | yes | yes |
| ``.compressed.ply`` (or a ``.ply`` with a ``chunk`` element) | PlayCanvas compressed ``.ply`` | yes | yes |
| ``.splat`` | antimatter15 ``.splat`` (32 bytes per Gaussian, no SH) | yes | yes |
| ``.pgms`` | PGMS bitstream (:mod:`visionmoe.splat.pgms`) | yes (:func:`read_any`) | via ``compress`` |

::

    from visionmoe.splat.formats import read_any, write_any
    scene = read_any("scene.splat")             # or .ply, .compressed.ply, .pgms
    write_any(scene, "scene.compressed.ply")    # or .ply, .splat
"""

from __future__ import annotations

import os
from pathlib import Path

from ..io import GaussianScene, SceneError
from .compressed_ply import compressed_ply_bytes, is_compressed_ply, read_compressed_ply, write_compressed_ply
from .splat_file import read_splat, splat_bytes, write_splat

__all__ = [
    "READ_FORMATS",
    "WRITE_FORMATS",
    "compressed_ply_bytes",
    "format_of",
    "is_compressed_ply",
    "read_any",
    "read_compressed_ply",
    "read_splat",
    "splat_bytes",
    "write_any",
    "write_compressed_ply",
    "write_splat",
]

#: format name -> description, for help texts and error messages
READ_FORMATS = {"ply": "INRIA 3DGS .ply", "compressed.ply": "PlayCanvas compressed .ply",
                "splat": "antimatter15 .splat", "pgms": "PGMS bitstream"}
WRITE_FORMATS = {"ply": "INRIA 3DGS .ply", "compressed.ply": "PlayCanvas compressed .ply",
                 "splat": "antimatter15 .splat"}


def format_of(path: str | os.PathLike) -> str:
    """The format a file name asks for: ``"compressed.ply"``, ``"ply"``, ``"splat"`` or ``"pgms"``.

    Raises :class:`SceneError` for any other extension.
    """
    name = Path(path).name.lower()
    if name.endswith(".compressed.ply"):
        return "compressed.ply"
    for ext in ("ply", "splat", "pgms"):
        if name.endswith("." + ext):
            return ext
    raise SceneError(f"{path}: unknown scene format; expected one of "
                     + ", ".join(f".{e}" for e in READ_FORMATS))


def read_any(path: str | os.PathLike, *, nonfinite: str = "reject") -> GaussianScene:
    """Read a scene from any supported file, chosen by extension.

    A ``.ply`` whose header has PlayCanvas's ``chunk`` element is read as a compressed
    ``.ply`` whatever its name; a ``.pgms`` is decoded at its full level.
    """
    fmt = format_of(path)
    if fmt == "splat":
        return read_splat(path, nonfinite=nonfinite)
    if fmt == "pgms":
        from ..pgms.decode import decompress

        return decompress(path)
    if fmt == "compressed.ply" or is_compressed_ply(path):
        return read_compressed_ply(path)
    from ..io import read_ply

    return read_ply(path, nonfinite=nonfinite)


def write_any(scene: GaussianScene, path: str | os.PathLike) -> Path:
    """Write a scene in the format its file name asks for (``.ply``, ``.compressed.ply``, ``.splat``), atomically."""
    fmt = format_of(path)
    if fmt == "splat":
        return write_splat(scene, path)
    if fmt == "compressed.ply":
        return write_compressed_ply(scene, path)
    if fmt == "ply":
        from ..io import write_ply

        return write_ply(scene, path)  # through the one atomic writer, which refuses special files
    raise SceneError(f"{path}: cannot write .pgms with write_any; use visionmoe.splat.compress")
