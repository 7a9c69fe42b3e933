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
# The encoder codes each scene in its canonical frame (centre, size, up and the principal axis
# across up: visionmoe.splat.similarity) and the file maps it back (section XFRM), so a moved
# copy (up turned with it) is coded alike up to float rounding. Before, with world-axis rings and
# Morton grouping, the 37-degree turn decoded 0.56 dB apart and the z-up copy 0.60 dB.


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_decoded_transformed_matches_transformed_decoded(base, name):
    scene, nbytes, dec = base
    R, t, s = TRANSFORMS[name]
    t = torch.tensor(t, dtype=torch.float64)
    moved = transform_scene(scene, R, t, s)
    up = R @ torch.tensor([0.0, -1.0, 0.0], dtype=torch.float64)  # the scene's up turns with it
    res = compress(moved, up=up, **OPTS)
    dec_moved = decompress(res.data)
    moved_dec = transform_scene(dec, R, t, s)
    cams = transform_cameras(heldout_cameras(scene, num_views=6, size=96, frame=scene_frame(scene)), R, t, s)
    ref = render_views(moved, cams)
    a = score_views(ref, render_views(dec_moved, cams)).psnr  # decoded transformed scene
    b = score_views(ref, render_views(moved_dec, cams)).psnr  # transformed decoded scene
    assert abs(a - b) < 0.1, (name, a, b)
    assert abs(res.nbytes / nbytes - 1) < 0.005, (name, res.nbytes, nbytes)


def test_up_turns_the_default_views_with_the_scene():
    """A z-up copy of a y-down scene compressed with ``up="+z"`` is seen from the same poses
    (moved with it) as the original with the default ``-y``."""
    from visionmoe.splat.cameras import pose_distance
    from visionmoe.splat.evaluation import encoder_cameras

    scene = object_scene()
    R = rotation_matrix([1.0, 0.0, 0.0], -90.0)
    assert torch.allclose(R @ torch.tensor([0.0, -1.0, 0.0], dtype=torch.float64),
                          torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), atol=1e-12)
    moved = transform_scene(scene, R, torch.zeros(3, dtype=torch.float64), 1.0)
    a = transform_cameras(encoder_cameras(scene, num_views=8, view_size=64), R)
    b = encoder_cameras(moved, num_views=8, view_size=64, up="+z")
    assert float(pose_distance(a, b, scene_frame(scene).size).diagonal().max()) < 1e-4
    with pytest.raises(ValueError, match="up"):
        compress(scene, up="sideways", **OPTS)


@pytest.mark.parametrize("scale", [1e-3, 1e3])
def test_pyramid_of_a_rescaled_scene_is_the_rescaled_pyramid(scale):
    """Merges in other units: the same tree, distortions and opacities, log-scales shifted by
    log(scale), thin axes included (an absolute floor once turned a merged node's e^-14 thin axis
    into e^-12 in a 1e-3x copy, and its distortion from ~0 to 1e4)."""
    import math

    from visionmoe.splat.encoder.pyramid import build_pyramid

    scene = object_scene(300)
    flat = scene.log_scales.clone()
    flat[::3, 2] -= 9.0  # every third Gaussian flat: e^-12 thin axes, 1e-4 of its width
    scene = GaussianScene(means=scene.means.double(), quats=scene.quats.double(), log_scales=flat.double(),
                          opacity_logits=scene.opacity_logits.double(), sh_dc=scene.sh_dc.double(),
                          sh_rest=scene.sh_rest.double())
    w = torch.rand(scene.num_gaussians, generator=torch.Generator().manual_seed(0)) + 0.1
    a = build_pyramid(scene, w)
    b = build_pyramid(transform_scene(scene, None, None, scale), w)
    assert [lv.num_gaussians for lv in a.levels] == [lv.num_gaussians for lv in b.levels]
    for lv in range(a.num_levels):
        torch.testing.assert_close(b.levels[lv].log_scales, a.levels[lv].log_scales + math.log(scale), rtol=0, atol=1e-3)
        torch.testing.assert_close(b.levels[lv].opacity_logits, a.levels[lv].opacity_logits, rtol=0, atol=1e-3)
        torch.testing.assert_close(b.distortion[lv], a.distortion[lv], rtol=1e-3, atol=1e-4)
    assert float(a.levels[-2].log_scales.min()) < -12.0  # merged thin axes below the old floor


def test_sh_bands_rotated_in_row_blocks_are_bit_identical(monkeypatch):
    """``transform_scene`` rotates the SH bands in float64 a block of rows at a time (memory at
    millions of Gaussians); the result does not depend on the block size."""
    from visionmoe.splat import similarity

    g = torch.Generator().manual_seed(5)
    n = 1000
    scene = GaussianScene(means=torch.randn(n, 3, generator=g), quats=torch.randn(n, 4, generator=g),
                          log_scales=torch.randn(n, 3, generator=g) - 3, opacity_logits=torch.randn(n, generator=g),
                          sh_dc=torch.randn(n, 3, generator=g), sh_rest=torch.randn(n, 15, 3, generator=g))
    R = rotation_matrix([0.3, 1.0, 0.2], 37.0)
    whole = similarity.transform_scene(scene, R, [0.5, 0.0, -1.0], 2.0)
    monkeypatch.setattr(similarity, "_SH_ROWS", 97)
    blocks = similarity.transform_scene(scene, R, [0.5, 0.0, -1.0], 2.0)
    assert torch.equal(whole.sh_rest, blocks.sh_rest) and whole.sh_rest.dtype == scene.sh_rest.dtype
    assert not torch.equal(whole.sh_rest, scene.sh_rest)  # the bands did turn
    scene64 = scene.to(dtype=torch.float64)
    before = scene64.sh_rest.clone()
    turned = similarity.transform_scene(scene64, R, [0.5, 0.0, -1.0], 2.0)
    assert torch.equal(scene64.sh_rest, before)  # a float64 scene's own bands are left alone
    torch.testing.assert_close(turned.sh_rest, whole.sh_rest.double(), atol=1e-5, rtol=0)
