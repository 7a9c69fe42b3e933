"""Tile-based Gaussian rasterisation (3D Gaussian splatting): forward, backward, contributions.

Semantics (shared by the CPU kernel, the CUDA kernel and ``_torch_ref.rasterize``):

* Gaussians: world means, ``w,x,y,z`` quaternions of any norm (normalised), log-scales
  (``scale = exp``), opacity logits (``opacity = sigmoid``), RGB colours or SH coefficients.
* Projection: pinhole camera, OpenCV world-to-camera ``viewmats`` and intrinsics ``Ks``, EWA
  splatting with the gsplat/INRIA Jacobian clamp, a 0.3 px low-pass on the 2D covariance,
  per-axis radii ``ceil(3.33 sigma)``; Gaussians with depth outside ``(near, far)``, entirely
  outside the image, or with any NaN/Inf parameter are culled (and get zero gradient).
* Colour: RGB as given, or ``max(SH(view dir) + 0.5, 0)`` for SH degrees 0-3 where the view
  direction is ``mean - camera centre`` (its gradient flows back to the means).
* Compositing: 16x16 tiles, each Gaussian listed in the tiles its radius rectangle touches,
  depth-sorted front to back (ties by index); pixel centres at ``(i + 0.5, j + 0.5)``;
  ``alpha = min(0.99, opacity * exp(-0.5 d^T conic d))``, skipped when below 1/255;
  compositing stops at the first Gaussian that would bring the transmittance below 1e-4.
* Outputs: ``colors = sum w_i c_i + T_final * background`` with ``w_i = alpha_i T_i``;
  ``alpha = 1 - T_final``; ``depth`` = expected depth ``sum w_i z_i / alpha`` (0 where nothing
  is drawn); optional per-Gaussian ``contributions = sum over pixels of w_i`` and
  ``pixel_counts`` (pixels where the Gaussian was composited). Contributions and counts are
  not differentiable.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _backend
from ._validate import check_same_device, check_tensor

RASTER_DTYPES = (torch.float32, torch.float64)


class RasterOutput(NamedTuple):
    colors: torch.Tensor  # [C, H, W, 3]
    alpha: torch.Tensor  # [C, H, W]
    depth: torch.Tensor  # [C, H, W] expected depth (0 where alpha == 0)
    contributions: torch.Tensor | None  # [C, N] sum over pixels of alpha * transmittance
    pixel_counts: torch.Tensor | None  # [C, N] int32 pixels each Gaussian was composited into


class RasterArgs(NamedTuple):
    means: torch.Tensor
    quats: torch.Tensor
    log_scales: torch.Tensor
    opacity_logits: torch.Tensor
    features: torch.Tensor  # [N, 3] colours or [N, K, 3] SH
    viewmats: torch.Tensor  # [C, 4, 4] in the Gaussians' dtype
    Ks: torch.Tensor  # [C, 3, 3]
    width: int
    height: int
    sh_degree: int | None
    near: float
    far: float
    background: torch.Tensor | None  # [C, 3]; None: black


def validate_raster_args(
    means, quats, log_scales, opacity_logits, colors_or_sh, viewmats, Ks, width, height, sh_degree, near, far, background
) -> RasterArgs:
    """Check every argument of ``rasterize``; shared with the reference implementation."""
    check_tensor("means", means, dim=2, dtypes=RASTER_DTYPES)
    N = means.shape[0]
    check_tensor("means", means, shape=(N, 3))
    dtype = means.dtype
    check_tensor("quats", quats, shape=(N, 4), dtypes=(dtype,))
    check_tensor("log_scales", log_scales, shape=(N, 3), dtypes=(dtype,))
    check_tensor("opacity_logits", opacity_logits, shape=(N,), dtypes=(dtype,))
    check_tensor("colors_or_sh", colors_or_sh, dtypes=(dtype,))
    if sh_degree is None:
        check_tensor("colors_or_sh", colors_or_sh, shape=(N, 3))
    else:
        if not isinstance(sh_degree, int) or isinstance(sh_degree, bool) or not 0 <= sh_degree <= 3:
            raise ValueError(f"sh_degree must be None (RGB colours) or an int in [0, 3], got {sh_degree!r}")
        need = (sh_degree + 1) ** 2
        check_tensor("colors_or_sh", colors_or_sh, dim=3)
        if colors_or_sh.shape[0] != N or colors_or_sh.shape[2] != 3 or colors_or_sh.shape[1] < need:
            raise ValueError(
                f"colors_or_sh must have shape ({N}, K>={need}, 3) for sh_degree={sh_degree}, "
                f"got {tuple(colors_or_sh.shape)}"
            )
    check_tensor("viewmats", viewmats, dim=3, dtypes=RASTER_DTYPES)
    C = viewmats.shape[0]
    check_tensor("viewmats", viewmats, shape=(C, 4, 4))
    check_tensor("Ks", Ks, shape=(C, 3, 3), dtypes=RASTER_DTYPES)
    for name, value in (("width", width), ("height", height)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not (float(near) > 0 and float(far) > float(near)):
        raise ValueError(f"near and far must satisfy 0 < near < far, got near={near!r}, far={far!r}")
    if not (torch.isfinite(viewmats).all() and torch.isfinite(Ks).all()):
        raise ValueError("viewmats and Ks must be finite")
    if C and not bool((Ks[:, 0, 0] > 0).all() and (Ks[:, 1, 1] > 0).all()):
        raise ValueError("Ks must have positive focal lengths fx = K[0, 0] and fy = K[1, 1]")
    device = check_same_device(
        means=means, quats=quats, log_scales=log_scales, opacity_logits=opacity_logits,
        colors_or_sh=colors_or_sh, viewmats=viewmats, Ks=Ks, background=background,
    )
    if background is not None:
        check_tensor("background", background, dtypes=(dtype,))
        if background.shape == (3,):
            background = background.expand(C, 3)
        elif background.shape != (C, 3):
            raise ValueError(f"background must have shape (3,) or ({C}, 3), got {tuple(background.shape)}")
    del device
    return RasterArgs(
        means, quats, log_scales, opacity_logits, colors_or_sh, viewmats.to(dtype), Ks.to(dtype),
        int(width), int(height), sh_degree, float(near), float(far), background,
    )


def finish(color, trans, depth_acc, background) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Background compositing and expected depth from the raw compositing sums."""
    alpha = 1 - trans
    # black (None): adding zeros would cost an image-sized multiply forward and two backward
    colors = color if background is None else color + trans.unsqueeze(-1) * background[:, None, None, :]
    drawn = alpha > 0
    depth = torch.where(drawn, depth_acc / torch.where(drawn, alpha, torch.ones_like(alpha)), torch.zeros_like(alpha))
    return colors, alpha, depth


class _Project(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means, quats, log_scales, opacity_logits, features, viewmats, Ks, width, height, near, far):
        k = _backend.kernels(means.device)
        means2d, conics, depths, radii = k.project_fwd(
            means, quats, log_scales, opacity_logits, features.flatten(1),
            viewmats, Ks, width, height, near, far,
        )
        ctx.save_for_backward(means, quats, log_scales, viewmats, Ks, radii)
        ctx.size = (width, height)
        ctx.mark_non_differentiable(radii)
        return means2d, conics, depths, radii

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v_means2d, v_conics, v_depths, _v_radii):
        means, quats, log_scales, viewmats, Ks, radii = ctx.saved_tensors
        v_means, v_quats, v_log_scales = _backend.kernels(means.device).project_bwd(
            means, quats, log_scales, viewmats, Ks, *ctx.size, radii, v_means2d, v_conics, v_depths
        )
        return v_means, v_quats, v_log_scales, None, None, None, None, None, None, None, None


class _SphericalHarmonics(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sh, means, viewmats, radii, degree):
        colors = _backend.kernels(sh.device).sh_fwd(sh, means, viewmats, radii, degree)
        ctx.save_for_backward(sh, means, viewmats, radii)
        ctx.degree = degree
        return colors

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v_colors):
        sh, means, viewmats, radii = ctx.saved_tensors
        v_sh, v_means = _backend.kernels(sh.device).sh_bwd(sh, means, viewmats, radii, ctx.degree, v_colors)
        return v_sh, v_means, None, None, None


class _Rasterize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, depths, radii, width, height, want_contributions):
        k = _backend.kernels(means2d.device)
        color, trans, depth_acc, last, tile_offsets, tile_ids, contrib, counts = k.rasterize_fwd(
            means2d, conics, colors, opacities, depths, radii, width, height, want_contributions
        )
        ctx.save_for_backward(means2d, conics, colors, opacities, depths, tile_offsets, tile_ids, trans, last)
        ctx.size = (width, height)
        ctx.mark_non_differentiable(contrib, counts)
        return color, trans, depth_acc, contrib, counts

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, v_color, v_trans, v_depth, _v_contrib, _v_counts):
        means2d, conics, colors, opacities, depths, tile_offsets, tile_ids, trans, last = ctx.saved_tensors
        v_means2d, v_conics, v_colors, v_opacities, v_depths = _backend.kernels(means2d.device).rasterize_bwd(
            means2d, conics, colors, opacities, depths, *ctx.size, tile_offsets, tile_ids, trans, last,
            v_color, v_trans, v_depth,
        )
        return v_means2d, v_conics, v_colors, v_opacities, v_depths, None, None, None, None


def rasterize(
    means: torch.Tensor,
    quats: torch.Tensor,
    log_scales: torch.Tensor,
    opacity_logits: torch.Tensor,
    colors_or_sh: torch.Tensor,
    viewmats: torch.Tensor,
    Ks: torch.Tensor,
    width: int,
    height: int,
    *,
    sh_degree: int | None = None,
    near: float = 0.01,
    far: float = 1e10,
    background: torch.Tensor | None = None,
    return_contributions: bool = False,
) -> RasterOutput:
    """Render 3D Gaussians into ``C`` cameras (see the module docstring for the semantics).

    Args:
        means: [N, 3] world positions. quats: [N, 4] ``w,x,y,z`` rotations (any norm).
        log_scales: [N, 3]. opacity_logits: [N].
        colors_or_sh: [N, 3] RGB when ``sh_degree`` is None, else [N, K, 3] SH coefficients with
            K >= (sh_degree + 1)^2 (only the first (sh_degree + 1)^2 are used).
        viewmats: [C, 4, 4] world-to-camera (OpenCV: x right, y down, z forward).
        Ks: [C, 3, 3] pinhole intrinsics. width, height: image size in pixels.
        near, far: depth range of the Gaussian centres that are drawn.
        background: [3] or [C, 3] colour behind the Gaussians (default black).
        return_contributions: also return per-Gaussian contributions and pixel counts.

    Returns a :class:`RasterOutput`. Differentiable with respect to means, quats, log_scales,
    opacity_logits, colors_or_sh and background. float32 or float64, CPU or CUDA tensors.
    """
    a = validate_raster_args(
        means, quats, log_scales, opacity_logits, colors_or_sh, viewmats, Ks, width, height, sh_degree, near, far,
        background,
    )
    # nan_to_num keeps NaN/Inf logits (culled in the kernel) from turning zero gradients into NaN.
    logits = torch.nan_to_num(a.opacity_logits, nan=0.0, posinf=0.0, neginf=0.0)
    # torch's vectorised float32 sigmoid and its scalar tail differ by an ulp, and where the tail
    # falls moves with the thread count; in float64, rounded once, the result does not depend on it
    opacities = torch.sigmoid(logits.double()).to(logits.dtype) if logits.dtype == torch.float32 else torch.sigmoid(logits)
    means2d, conics, depths, radii = _Project.apply(
        a.means, a.quats, a.log_scales, a.opacity_logits.detach(), a.features.detach(), a.viewmats, a.Ks,
        a.width, a.height, a.near, a.far,
    )
    C, N = a.viewmats.shape[0], a.means.shape[0]
    if a.sh_degree is None:
        colors = a.features.unsqueeze(0).expand(C, N, 3)
    else:
        colors = _SphericalHarmonics.apply(a.features, a.means, a.viewmats, radii, a.sh_degree)
    color, trans, depth_acc, contrib, counts = _Rasterize.apply(
        means2d, conics, colors, opacities, depths, radii, a.width, a.height, bool(return_contributions)
    )
    colors_out, alpha, depth = finish(color, trans, depth_acc, a.background)
    if not return_contributions:
        return RasterOutput(colors_out, alpha, depth, None, None)
    return RasterOutput(colors_out, alpha, depth, contrib, counts)
