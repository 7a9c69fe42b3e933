"""The encoder's bounded-memory passes give the same numbers, bit for bit, as the whole-array ones."""

from __future__ import annotations

import torch
from pgms_helpers import random_scene

from visionmoe.splat.cameras import Cameras
from visionmoe.splat.encoder import contribution, update
from visionmoe.splat.render import render


def _cameras(scene):
    return Cameras.concat([contribution.default_cameras(scene, num_views=4, size=48),
                           contribution.coverage_views(scene, num_views=4, size=48)])


def _summed_view_by_view(scene, cams):
    """The contributions as the encoder always defined them: each batch of four views rendered at
    once with every SH band, summed over the batch in float64, batches added in order."""
    total = torch.zeros(scene.num_gaussians, dtype=torch.float64)
    for s in range(0, len(cams), 4):
        total += render(scene, cams[list(range(s, min(s + 4, len(cams))))],
                        return_contributions=True).contributions.double().sum(0)
    return total.float()


def test_contributions_with_one_full_sh_view_per_render_are_bit_identical(monkeypatch):
    scene = random_scene(600, degree=3, seed=11)
    cams = _cameras(scene)
    keep = [0, 2, 5, 6]
    ref = _summed_view_by_view(scene, cams)
    ref_colors = torch.stack([render(scene, cams[[i]]).colors[0] for i in keep])
    for per_call in (1 << 27, 1):  # four full-SH views per render (small scenes), one (6M SH3)
        monkeypatch.setattr(contribution, "_FULL_SH_FLOATS_PER_CALL", per_call)
        got, colors = contribution.image_contributions(scene, cams, keep_colors=keep)
        assert torch.equal(got, ref)
        assert torch.equal(colors, ref_colors)
    assert torch.equal(contribution.image_contributions(scene, cams), ref)  # no colours kept: SH0 only


def test_contributions_with_fewer_colour_free_views_per_render_are_bit_identical(monkeypatch):
    # above _GAUSSIAN_VIEWS_PER_CALL / 4 Gaussians the degree-0 views go fewer at a time (6M: one)
    scene = random_scene(600, degree=3, seed=15)
    cams = _cameras(scene)
    ref = _summed_view_by_view(scene, cams)
    for budget in (600 * 3, 600 * 2, 1):  # three, two and one view per render
        monkeypatch.setattr(contribution, "_GAUSSIAN_VIEWS_PER_CALL", budget)
        assert torch.equal(contribution.image_contributions(scene, cams), ref)
        got, _ = contribution.image_contributions(scene, cams, keep_colors=[1, 4])
        assert torch.equal(got, ref)


def test_merged_covariances_in_chunks_are_bit_identical(monkeypatch):
    # every segment non-empty (as the pyramid's groups are), of 1-13 members
    sizes = torch.randint(1, 14, (300,), generator=torch.Generator().manual_seed(14))
    ids = torch.repeat_interleave(torch.arange(300), sizes)
    n = ids.numel()
    scene = random_scene(n, degree=2, seed=12)
    w = torch.rand(n, generator=torch.Generator().manual_seed(13))
    w[::7] = 0  # hidden members: the floor and the visibility mask take part
    ref = update.merge(scene, w, ids, 300)
    monkeypatch.setattr(update, "_CHUNK", 97)
    got = update.merge(scene, w, ids, 300)
    # the float64 covariance sums (and what follows from them) do not depend on the chunking; the
    # float32 SH sums may round differently per chunking (index_add_ splits its work by block)
    for name in ("means", "quats", "log_scales", "opacity_logits"):
        assert torch.equal(getattr(got[0], name), getattr(ref[0], name)), name
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
    torch.testing.assert_close(got[0].sh_rest, ref[0].sh_rest, rtol=1e-5, atol=1e-6)
