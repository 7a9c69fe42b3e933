"""PGMS: pyramidal Gaussian-mixture compression of 3DGS scenes (visionmoe.splat)."""

from .bitstream import FormatError
from .cameras import CameraError, Cameras, load_cameras_json, orbit_cameras
from .codec import CompressResult, compress, decompress
from .io import GaussianScene, SceneError, read_ply, write_ply
from .render import RenderError, render

__all__ = [
    "CameraError",
    "Cameras",
    "CompressResult",
    "FormatError",
    "GaussianScene",
    "RenderError",
    "SceneError",
    "compress",
    "decompress",
    "load_cameras_json",
    "orbit_cameras",
    "read_ply",
    "render",
    "write_ply",
]
