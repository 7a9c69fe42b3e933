"""Invariance of PGMS under similarity transforms (rigid motions, translations, uniform scales
1e-3..1e3; SH0): the decoded transformed scene matches the transformed decoded scene, in
held-out fidelity and in file size."""

import pytest
import torch

from visionmoe.splat import compress, decompress
from visionmoe.splat.cameras import scene_frame, transform_cameras
from visionmoe.splat.evaluation import (
    heldout_cameras, render_views, rotation_matrix, score_views, transform_scene,
)
from visionmoe.splat.io import GaussianScene

OPTS = dict(ratio=8.0, num_views=8, view_size=64, refine_steps=0, prune_search=0)


def object_scene(n=700, seed=3):
    """A small SH0 object with distinct principal spreads (no tie between its axes)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, 3, generator=g)
    means = (u ** 1.5) * torch.tensor([1.0, 0.45, 0.7]) + 0.05 * torch.randn(n, 3, generator=g)
    return GaussianScene(means=means, quats=torch.randn(n, 4, generator=g),
                         log_scales=torch.full((n, 3), -3.2) + 0.4 * torch.randn(n, 3, generator=g),
                         opacity_logits=torch.randn(n, generator=g) + 1.5,
                         sh_dc=torch.randn(n, 3, generator=g) * 0.7, sh_rest=torch.zeros(n, 0, 3))


@pytest.fixture(scope="module")
def base():
    scene = object_scene()
    res = compress(scene, **OPTS)
    return scene, res.nbytes, decompress(res.data)


TRANSFORMS = {
    "rotation 37 about a tilted axis, shifted": (rotation_matrix([0.3, 1.0, 0.2], 37.0), [0.7, -0.4, 1.1], 1.0),
    "scale 1e-3": (torch.eye(3, dtype=torch.float64), [0.0, 0.0, 0.0], 1e-3),
    "scale 1e3, shifted": (torch.eye(3, dtype=torch.float64), [500.0, 0.0, -200.0], 1e3),
    "z-up": (rotation_matrix([1.0, 0.0, 0.0], 90.0), [0.0, 0.0, 0.0], 1.0),
}
# What still depends on world axes (issue 26, item 4): the default views are orbit rings about
# the world's -y axis (whole-sphere views lost 1.3-2.3 dB held-out on plant-like captures, see
# docs/EVALUATION.md), and the pyramid groups along world-axis Morton codes (rotated: 32.8
# against 33.3 dB here). Their near plane scales with the scene since issue 26 (a 1e-3 copy
# decoded 27.4 dB against 33.3 with the absolute 0.01).
XFAIL = {"rotation 37 about a tilted axis, shifted": "world-axis views and Morton grouping (issue 26 item 4)"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=XFAIL[n]))
                                  if n in XFAIL else n for n in TRANSFORMS])
def test_decoded_transformed_matches_transformed_decoded(base, name):
    scene, nbytes, dec = base
    R, t, s = TRANSFORMS[name]
    t = torch.tensor(t, dtype=torch.float64)
    moved = transform_scene(scene, R, t, s)
    res = compress(moved, **OPTS)
    dec_moved = decompress(res.data)
    moved_dec = transform_scene(dec, R, t, s)
    cams = transform_cameras(heldout_cameras(scene, num_views=6, size=96, frame=scene_frame(scene)), R, t, s)
    ref = render_views(moved, cams)
    a = score_views(ref, render_views(dec_moved, cams)).psnr  # decoded transformed scene
    b = score_views(ref, render_views(moved_dec, cams)).psnr  # transformed decoded scene
    assert abs(a - b) < 0.5, (name, a, b)
    assert abs(res.nbytes / nbytes - 1) < 0.02, (name, res.nbytes, nbytes)
