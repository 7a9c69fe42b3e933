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

from ..io import GaussianScene

__all__ = ["coverage_views", "default_cameras", "image_contributions", "prune"]


# Orbit rings of the default views: (elevation in degrees, views as a fraction of num_views).
# One ring fits the encoder to its own poses: with a single 20-degree ring, statue at 5x
# rendered 60.5 dB there but 50.2 dB from 35 degrees (the Gaussians only other poses see were
# pruned); with these three rings 56.4 / 56.3 dB, plant 64.2 / 58.3 -> 64.1 / 63.5 dB.
_RINGS = ((20.0, 1.0), (45.0, 0.5), (0.0, 0.5))


def default_cameras(scene: GaussianScene, *, num_views: int = 16, size: int = 256, up="-y"):
    """Orbit views around the scene (the renderer's ``orbit_cameras``) at ``size`` x ``size``:
    ``num_views`` at 20 degrees of elevation above the plane perpendicular to ``up`` (default
    ``-y``, the INRIA/COLMAP convention; ``"+z"`` for z-up captures, or a 3-vector), then half
    as many (at least one) at 45 and at 0."""
    from ..cameras import Cameras, orbit_cameras, scene_frame

    # clip planes scale with the scene (an absolute near plane of 0.01 culled every Gaussian of
    # a 1e-3-unit copy of a scene: 27.4 instead of 33.3 dB in tests/splat/encoder/test_invariance.py)
    frame = scene_frame(scene, up=up)
    return Cameras.concat(
        orbit_cameras(scene, num_views=max(1, round(num_views * share)), width=size, height=size, elevation_deg=elev,
                      up=up, near=frame.near, far=frame.far)
        for elev, share in _RINGS
    )


# Importance views beyond the rings: a Gaussian that only a view from below, from a steep angle
# or from closer up sees is pruned when only the rings count (playbot: pruning alone, with the
# rings' views, left 16 held-out views at 52.2 dB on average and two of them at 22 dB).
# Distances alternate between the orbit distance and half of it (a viewer zooms in).
_COVERAGE_DISTANCES = (1.0, 0.5)


def coverage_views(scene: GaussianScene, *, num_views: int = 16, size: int = 256, up="-y"):
    """Views from every direction (a Fibonacci lattice over the whole sphere about ``up``, no
    seed), alternately at the orbit distance and half of it: what a viewer may see that the
    default rings do not. They weigh into the contributions (so pruning and the allocator's
    weights count them) and into the pruning search's views; the rung check and the refinement
    keep to the rings."""
    from ..cameras import frame_cameras, scene_frame, sphere_directions

    frame = scene_frame(scene, up=up)
    dirs = sphere_directions(num_views, up=up)
    dist = torch.tensor([_COVERAGE_DISTANCES[i % len(_COVERAGE_DISTANCES)] for i in range(num_views)],
                        dtype=torch.float64)
    return frame_cameras(frame, dirs, dist, size, size)


# Floats of SH a full-colour render call may evaluate (views x Gaussians x coefficients): the
# rasteriser's per-view buffers of a full-SH render are ~240 B per Gaussian at SH3 (measured at
# 100k), so four views of a 6M-Gaussian SH3 scene at once held ~3.4 GB. Below this size the
# views go four at a time as before; above, fewer (one view of 6M SH3 is 288M floats).
_FULL_SH_FLOATS_PER_CALL = 1 << 27
# Gaussians x views a colour-free render call may bin: the rasteriser's tile lists and their
# per-entry contribution slots grow with both (the 3M SH3 tile at 256 px: one view +0.97 GB of
# RSS, four at once +1.95 GB); up to 1.5M Gaussians the views still go four at a time.
_GAUSSIAN_VIEWS_PER_CALL = 6_000_000


def image_contributions(scene: GaussianScene, cameras, *, device=None, views_per_batch: int = 4,
                        keep_colors: list[int] | None = None):
    """Per-Gaussian contribution [N] (float32, CPU), summed over the views of ``cameras``.

    ``keep_colors``: view indices whose full-SH renders are also returned (on the render device,
    in that order), as ``(contributions, colors [len, H, W, 3])``: callers that compare with the
    scene's own renders on those views need not render them again."""
    from ..render import resolve_device

    dev = resolve_device(device)
    # Contributions (alpha x transmittance) do not depend on colour: only the kept views render
    # the full SH; the others go at SH degree 0, which skips the view-dependent SH evaluation and
    # the [N, K, 3] SH copy. A view renders the same alone as in a batch, and the batch's views
    # are summed in float64 in view order as before: the same contributions bit for bit.
    keep = set(keep_colors or ())
    s0 = replace(scene, sh_rest=scene.sh_rest[:, :0]).to(dev)
    s_full = scene.to(dev) if keep else None
    per_call = max(1, min(views_per_batch, _FULL_SH_FLOATS_PER_CALL // max(1, scene.num_gaussians * scene.sh.shape[1] * 3)))
    per_call0 = max(1, min(views_per_batch, _GAUSSIAN_VIEWS_PER_CALL // max(1, scene.num_gaussians)))
    total = torch.zeros(scene.num_gaussians, dtype=torch.float64, device=dev)
    C = len(cameras)
    kept = {}
    with torch.no_grad():
        for start in range(0, C, views_per_batch):
            views = list(range(start, min(start + views_per_batch, C)))
            contrib = {}
            _render_views(s0, cameras, [v for v in views if v not in keep], per_call0, contrib, None)
            _render_views(s_full, cameras, [v for v in views if v in keep], per_call, contrib, kept)
            total += torch.stack([contrib[v] for v in views]).double().sum(0)
    if keep_colors is None:
        return total.float().cpu()
    return total.float().cpu(), torch.stack([kept[i] for i in keep_colors]) if keep_colors else None


def _render_views(scene: GaussianScene | None, cameras, views: list[int], per_call: int, contrib: dict,
                  colors: dict | None) -> None:
    """Render ``views`` (consecutive runs of at most ``per_call``) into ``contrib`` (and ``colors``)."""
    from ..render import render

    for i in range(0, len(views), per_call):
        group = views[i: i + per_call]
        out = render(scene, cameras[group], return_contributions=True)
        for j, v in enumerate(group):
            contrib[v] = out.contributions[j]
            if colors is not None:
                colors[v] = out.colors[j].clone()
        del out



def prune(scene: GaussianScene, contributions: torch.Tensor, threshold: float = 1 / 255
          ) -> tuple[GaussianScene, torch.Tensor]:
    """Drop Gaussians whose total contribution is below ``threshold`` (keeps at least one)."""
    keep = prune_mask(contributions, threshold)
    return scene.subset(keep), contributions[keep]


def prune_mask(contributions: torch.Tensor, threshold: float = 1 / 255) -> torch.Tensor:
    """The rows :func:`prune` keeps: a contribution of at least ``threshold`` (at least one row)."""
    keep = contributions >= threshold
    return keep if bool(keep.any()) else contributions == contributions.max()
