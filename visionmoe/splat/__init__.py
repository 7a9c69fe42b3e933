"""PGMS: pyramidal Gaussian-mixture compression of 3DGS scenes (visionmoe.splat)."""

from .cameras import CameraError, Cameras, load_cameras_json, orbit_cameras
from .io import GaussianScene, SceneError, read_ply, write_ply
from .render import RenderError, render

__all__ = [
    "CameraError",
    "Cameras",
    "GaussianScene",
    "RenderError",
    "SceneError",
    "load_cameras_json",
    "orbit_cameras",
    "read_ply",
    "render",
    "write_ply",
]
