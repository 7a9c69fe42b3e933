"""Image-space contribution of each Gaussian, and pruning of the negligible ones.

A Gaussian's contribution is the sum over rendered pixels (all views) of its compositing
weight ``alpha x transmittance``, straight from the rasteriser
(``render(..., return_contributions=True)``). It weights every later PGMS step: merges,
prototypes, the allocator's distortion. Summed over views it is in pixel units, so a
Gaussian below 1/255 can change no 8-bit pixel of any view: those are pruned.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .io import GaussianScene

__all__ = ["default_cameras", "image_contributions", "prune"]


def default_cameras(scene: GaussianScene, *, num_views: int = 16, size: int = 256):
    """Orbit views around the scene (the renderer's ``orbit_cameras``) at ``size`` x ``size``."""
    from .cameras import orbit_cameras

    return orbit_cameras(scene, num_views=num_views, width=size, height=size)


def image_contributions(scene: GaussianScene, cameras, *, device=None, views_per_batch: int = 4) -> torch.Tensor:
    """Per-Gaussian contribution [N] (float32, CPU), summed over the views of ``cameras``."""
    from .render import render

    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} requested but CUDA is not available; use device='cpu'")
    # Contributions (alpha x transmittance) do not depend on colour: render at SH degree 0, which
    # skips the view-dependent SH evaluation and the [N, K, 3] SH copy of every render call.
    s = replace(scene, sh_rest=scene.sh_rest[:, :0]).to(dev)
    total = torch.zeros(scene.num_gaussians, dtype=torch.float64, device=dev)
    C = len(cameras)
    with torch.no_grad():
        for start in range(0, C, views_per_batch):
            cams = _slice_cameras(cameras, start, min(start + views_per_batch, C))
            out = render(s, cams, return_contributions=True)
            total += out.contributions.double().sum(0)
    return total.float().cpu()


def _slice_cameras(cameras, start: int, stop: int):
    if start == 0 and stop == len(cameras):
        return cameras
    return cameras[start:stop]


def prune(scene: GaussianScene, contributions: torch.Tensor, threshold: float = 1 / 255
          ) -> tuple[GaussianScene, torch.Tensor]:
    """Drop Gaussians whose total contribution is below ``threshold`` (keeps at least one)."""
    keep = contributions >= threshold
    if not bool(keep.any()):
        keep = contributions == contributions.max()
    return scene.subset(keep), contributions[keep]
