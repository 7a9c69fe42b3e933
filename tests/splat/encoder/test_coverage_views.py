"""Coverage views: the encoder's importance views beyond the orbit rings, so that what a viewer
sees only from below or from closer up is not pruned."""

import math

import pytest
import torch

from visionmoe.splat import compress
from visionmoe.splat.cameras import pose_distance, scene_frame, transform_cameras, up_vector
from visionmoe.splat.encoder.contribution import coverage_views, default_cameras, image_contributions
from visionmoe.splat.evaluation import check_disjoint, encoder_cameras, heldout_cameras
from visionmoe.splat.io import GaussianScene


def box_open_below(per_side: int = 9):
    """Five opaque faces of a cube (top and four walls; +y is down, so the open face is at
    +y) around one red Gaussian at the centre: only a view from below sees it."""
    lin = torch.linspace(-0.9, 0.9, per_side)
    u, v = torch.meshgrid(lin, lin, indexing="ij")
    u, v = u.reshape(-1), v.reshape(-1)
    one = torch.ones_like(u)
    faces = [torch.stack([u, -one, v], 1),  # top (-y is up)
             torch.stack([-one, u, v], 1), torch.stack([one, u, v], 1),
             torch.stack([u, v, -one], 1), torch.stack([u, v, one], 1)]
    flat = [1, 0, 0, 2, 2]  # the face normal's axis: thin along it
    means, scales = [], []
    for f, axis in zip(faces, flat):
        s = torch.full((f.shape[0], 3), math.log(0.35))
        s[:, axis] = math.log(0.01)
        means.append(f)
        scales.append(s)
    means.append(torch.zeros(1, 3))
    scales.append(torch.full((1, 3), math.log(0.08)))
    means, scales = torch.cat(means), torch.cat(scales)
    n = means.shape[0]
    dc = torch.full((n, 3), -1.0)
    dc[-1] = torch.tensor([2.0, -1.5, -1.5])
    quats = torch.zeros(n, 4)
    quats[:, 0] = 1
    return GaussianScene(means=means, quats=quats, log_scales=scales, opacity_logits=torch.full((n,), 6.0), sh_dc=dc,
                         sh_rest=torch.zeros(n, 0, 3))


def test_coverage_views_span_the_sphere_and_zoom_in():
    scene = box_open_below()
    frame = scene_frame(scene)
    cams = coverage_views(scene, num_views=16, size=32)
    assert len(cams) == 16 and cams.width == 32
    offset = cams.centers.double() - frame.centre
    elevation = torch.rad2deg(torch.asin((offset / offset.norm(dim=-1, keepdim=True)) @ up_vector("-y")))
    assert float(elevation.min()) < -60 and float(elevation.max()) > 60  # from below and from above
    dist = (offset.norm(dim=-1) / frame.orbit_distance()).tolist()
    assert all(math.isclose(d, 1.0 if i % 2 == 0 else 0.5, rel_tol=1e-4) for i, d in enumerate(dist))


def test_coverage_views_move_with_a_scaled_and_shifted_scene():
    scene = box_open_below()
    s, t = 1e3, torch.tensor([5.0, -2.0, 30.0])
    moved = GaussianScene(means=scene.means * s + t, quats=scene.quats, log_scales=scene.log_scales + math.log(s),
                          opacity_logits=scene.opacity_logits, sh_dc=scene.sh_dc, sh_rest=scene.sh_rest)
    a = transform_cameras(coverage_views(scene, size=32), None, t.double(), s)
    b = coverage_views(moved, size=32)
    assert float(torch.diagonal(pose_distance(a, b, scene_frame(moved).size)).max()) < 1e-4


def test_what_only_a_view_from_below_sees_is_kept():
    scene = box_open_below()
    rings = default_cameras(scene, num_views=8, size=64)
    inner = scene.num_gaussians - 1
    seen_by_rings = image_contributions(scene, rings)
    seen_by_cover = image_contributions(scene, coverage_views(scene, num_views=16, size=64))
    assert float(seen_by_rings[inner]) < 1 / 255 < float(seen_by_cover[inner])
    kw = dict(ratio=2, num_views=8, view_size=64, refine_steps=0, prune_search=0, verify_views=0)
    without = compress(scene, coverage_views=0, **kw)
    with_cover = compress(scene, **kw)
    assert with_cover.pruned < without.pruned  # the red Gaussian (at least) survives pruning


def test_held_out_views_are_disjoint_from_the_coverage_views_too():
    scene = box_open_below()
    enc = encoder_cameras(scene, num_views=8, view_size=64)
    rings = encoder_cameras(scene, num_views=8, view_size=64, coverage_views=0)
    assert len(enc) == len(rings) + 16
    assert float(pose_distance(enc[: len(rings)], rings, 1.0).diagonal().max()) == 0.0  # orbit poses first
    check_disjoint(heldout_cameras(scene, size=64), enc, scene_frame(scene).size)


@pytest.mark.parametrize("bad", [-1, 2.5, True, "16"])
def test_bad_coverage_view_counts_are_refused(bad):
    with pytest.raises(ValueError, match="coverage_views"):
        compress(box_open_below(), coverage_views=bad)


def test_the_pruning_search_judges_on_the_coverage_views_too(monkeypatch):
    from visionmoe.splat.encoder import refine
    from visionmoe.splat.encoder.check_views import References

    scene = box_open_below()
    checks, jobs = [], []
    error_on = References.error_on

    def spy(self, idx):
        checks.append(list(idx))
        return error_on(self, idx)

    monkeypatch.setattr(References, "error_on", spy)
    monkeypatch.setattr(refine, "refine_checked", lambda tree, base, job, refs, prog: jobs.append(job) or base)
    compress(scene, ratio=4, num_views=8, view_size=32, refine_steps=2)
    rings = len(default_cameras(scene, num_views=8, size=32))
    rung_check, pruning_search = checks[0], checks[1]
    assert max(rung_check) < rings  # the rung check keeps to the orbit rings
    assert max(pruning_search) >= rings  # coverage views follow the rings
    assert len(jobs) == 1 and len(jobs[0].cameras) == rings  # so does the refinement
    checks.clear()
    compress(scene, ratio=4, num_views=8, view_size=32, refine_steps=2, coverage_views=0)
    assert max(checks[1]) < rings
