"""PGMS: pyramidal Gaussian-mixture compression of 3DGS scenes (visionmoe.splat)."""

from .io import GaussianScene, SceneError, read_ply, write_ply

__all__ = ["GaussianScene", "SceneError", "read_ply", "write_ply"]
