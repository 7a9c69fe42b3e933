"""PGMS: pyramidal Gaussian-mixture compression of 3DGS scenes (visionmoe.splat).

The public names load on first use (PEP 562), so ``import visionmoe.splat.cli`` (the command
line) starts without torch and can install its signal handlers before anything heavy loads."""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

_EXPORTS = {
    "FormatError": "pgms.bitstream",
    "CameraError": "cameras", "Cameras": "cameras", "load_cameras_json": "cameras", "orbit_cameras": "cameras",
    "CompressResult": "encoder.compress", "compress": "encoder.compress",
    "decompress": "pgms.decode", "DecodeMemoryError": "pgms.decode",
    "GaussianScene": "io", "SceneError": "io", "read_ply": "io", "write_ply": "io",
    "RenderError": "render", "render": "render",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .cameras import CameraError, Cameras, load_cameras_json, orbit_cameras
    from .encoder.compress import CompressResult, compress
    from .io import GaussianScene, SceneError, read_ply, write_ply
    from .pgms.bitstream import FormatError
    from .pgms.decode import DecodeMemoryError, decompress
    from .render import RenderError, render


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """``visionmoe.splat.render`` is the function, as when this package imported it eagerly:
    the import system sets a submodule as its package's attribute when it first loads it."""

    def __setattr__(self, name, value):
        if name == "render" and isinstance(value, types.ModuleType) and hasattr(value, "render"):
            value = value.render
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
