"""visionmoe: PGMS (pyramidal Gaussian-mixture compression of 3DGS scenes) and PILA (a physics
mixture-of-experts adapter for Wan video pipelines), on one compiled extension.

Importing the package never needs the compiled extension, torch or diffusers; ops that need
the extension say how to build it. The parts load on first use::

    import visionmoe
    visionmoe.splat.compress("scene.ply", ratio=20)   # imports visionmoe.splat now
    visionmoe.ops.build_info()
    visionmoe.video.PILAAdapter                        # needs the [video] extra
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

from ._version import __version__

__all__ = ["__version__", "ops", "splat", "video"]

_SUBMODULES = ("ops", "splat", "video")

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from . import ops, splat, video

logging.getLogger(__name__).addHandler(logging.NullHandler())


def __getattr__(name: str):  # PEP 562: `visionmoe.ops` etc. import on first access
    if name in _SUBMODULES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBMODULES))
