"""Render a :class:`GaussianScene` from :class:`Cameras` with a chosen rasteriser backend.

Backends:

* ``"cpu"``: visionmoe's OpenMP kernel (tensors moved to the CPU);
* ``"cuda"``: visionmoe's CUDA kernel (tensors moved to the current CUDA device);
* ``"auto"``: our CUDA kernel when the scene is on a CUDA device, our CPU kernel otherwise;
* ``"gsplat"``: ``gsplat.rasterization`` (CUDA only; gsplat JIT-compiles its kernels on first
  use, so it is never imported for CPU tensors). Used as an independent cross-check.
"""

from __future__ import annotations

import logging

import torch

from ..ops.raster import RasterOutput, rasterize
from .cameras import Cameras

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "cpu", "cuda", "gsplat")


class RenderError(ValueError):
    """A render request cannot be served (bad backend, no GPU, bad SH degree...)."""


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` as a ``torch.device``; None picks CUDA when torch sees a GPU, else the CPU.
    A malformed name, another device type or a GPU that is not there is a :class:`RenderError`."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise RenderError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RenderError(f"device {str(device)!r} needs a CUDA GPU, but torch sees none; use 'cpu'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise RenderError(f"device {str(device)!r}: torch sees only {torch.cuda.device_count()} CUDA GPU(s)")
    return dev


def _device_for(backend: str, scene) -> torch.device:
    if backend == "cpu":
        return torch.device("cpu")
    if backend in ("cuda", "gsplat"):
        if not torch.cuda.is_available():
            raise RenderError(f"backend={backend!r} needs a CUDA GPU, but torch sees none; use backend='cpu'")
        dev = scene.means.device
        return dev if dev.type == "cuda" else torch.device("cuda")
    return scene.means.device if scene.means.device.type == "cuda" else torch.device("cpu")


def render(
    scene,
    cameras: Cameras,
    *,
    backend: str = "auto",
    background=None,
    return_contributions: bool = False,
    sh_degree: int | None = None,
) -> RasterOutput:
    """Render ``scene`` into every camera of ``cameras``.

    Args:
        scene: a :class:`visionmoe.splat.GaussianScene`.
        cameras: :class:`Cameras` (C views of one size).
        backend: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"gsplat"`` (see the module docstring).
        background: RGB triple or [3] / [C, 3] tensor (default black).
        return_contributions: also return per-Gaussian contributions [C, N] and pixel counts
            (not available with ``gsplat``).
        sh_degree: SH degree to evaluate (default: the scene's degree; lower values drop bands).

    Returns a :class:`visionmoe.ops.RasterOutput` with colours [C, H, W, 3], alpha, depth.
    Differentiable with respect to the scene's tensors.
    """
    if backend not in BACKENDS:
        raise RenderError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    degree = scene.sh_degree if sh_degree is None else sh_degree
    if not isinstance(degree, int) or not 0 <= degree <= scene.sh_degree:
        raise RenderError(f"sh_degree must be an int in [0, {scene.sh_degree}] (the scene's degree), got {sh_degree!r}")
    device = _device_for(backend, scene)
    dtype = scene.means.dtype if scene.means.dtype in (torch.float32, torch.float64) else torch.float32
    s = scene.to(device=device, dtype=dtype)
    cams = cameras.to(device=device, dtype=dtype)
    if background is not None:
        background = torch.as_tensor(background, dtype=dtype, device=device)
    if backend == "gsplat":
        if return_contributions:
            raise RenderError("return_contributions is not available with backend='gsplat'; use 'cuda' or 'cpu'")
        return _render_gsplat(s, cams, degree, background)
    return rasterize(
        s.means, s.quats, s.log_scales, s.opacity_logits, s.sh, cams.viewmats, cams.Ks, cams.width, cams.height,
        sh_degree=degree, near=cams.near, far=cams.far, background=background,
        return_contributions=return_contributions,
    )


def _render_gsplat(s, cams: Cameras, degree: int, background) -> RasterOutput:
    try:
        from gsplat import rasterization
    except ImportError as exc:  # optional dependency
        raise RenderError(f"backend='gsplat' needs the gsplat package (pip install gsplat packaging): {exc}") from None
    C = len(cams)
    bg = None
    if background is not None:
        bg = background.expand(C, 3) if background.dim() == 1 else background
    colors, alphas, _meta = rasterization(
        s.means, s.quats, torch.exp(s.log_scales), torch.sigmoid(s.opacity_logits), s.sh, cams.viewmats, cams.Ks,
        cams.width, cams.height, near_plane=cams.near, far_plane=cams.far, sh_degree=degree,
        render_mode="RGB+ED", backgrounds=bg,
    )
    alpha = alphas[..., 0]
    return RasterOutput(colors[..., :3], alpha, colors[..., 3] * (alpha > 0), None, None)
