"""The render checks' views (spread over the contribution cameras) and the original scene's
renders of them (taken from the contribution pass where it ran, else rendered once)."""

from __future__ import annotations

import torch

from ..io import GaussianScene

SEARCH_VIEWS = 16  # views of the prune search's and the refinement's render checks
# Scenes of more than this many Gaussians have their pruning search judged on half as many
# views (spread as evenly over the contribution views): on playbot (500k) at 5x, 10x, 20x and
# 50x it chose the very files it chose on 16, in 3.6 s less at 20x (each check renders every
# search view) and 55 s less at 50x (single-threaded runs).
_SEARCH_VIEWS_LARGE_SCENE = 150_000
_SEARCH_VIEWS_LARGE = 8


def search_views(num_gaussians: int) -> int:
    return _SEARCH_VIEWS_LARGE if num_gaussians > _SEARCH_VIEWS_LARGE_SCENE else SEARCH_VIEWS


def view_indices(num_cameras: int, count: int) -> list[int]:
    """``count`` camera indices spread evenly over ``num_cameras`` (all of them if fewer)."""
    if count <= 0 or num_cameras == 0:
        return []
    return torch.linspace(0, num_cameras - 1, min(count, num_cameras)).round().long().tolist()


class References:
    """The original scene's renders of the contribution cameras, by camera index."""

    def __init__(self, scene: GaussianScene, cameras, device, known: dict | None = None):
        self.scene, self.cameras, self.device = scene, cameras, device
        self.colors = dict(known or {})

    def get(self, idx: list[int]) -> torch.Tensor:
        """The original's renders of ``cameras[idx]`` (rendered now where not known)."""
        from ..render import render

        missing = [i for i in idx if i not in self.colors]
        if missing:
            with torch.no_grad():
                self.colors.update(zip(missing, render(self.scene.to(self.device), self.cameras[missing]).colors))
        return torch.stack([self.colors[i] for i in idx]).to(self.device)

    def error_on(self, idx: list[int]):
        """-> ``error(decoded scene)``: render MSE against the original on ``cameras[idx]``."""
        from ..render import render

        cams, ref = self.cameras[idx], self.get(idx)

        def error(decoded: GaussianScene) -> float:
            with torch.no_grad():
                return float((render(decoded.to(self.device), cams).colors - ref).pow(2).mean())

        return error
