"""PGMS engineering paths: fast prototype search, chunked pyramid passes, rate tuning, synthetic scale scenes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from visionmoe.ops.routing import nearest_center as nearest_center_op
from visionmoe.splat import compress, decompress
from visionmoe.splat.encoder import kmeans, pyramid, update
from visionmoe.splat.encoder.pyramid import build_pyramid
from visionmoe.splat.pgms import prototypes

from pgms_helpers import random_scene

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("d,k", [(9, 64), (24, 512)])
def test_prototype_search_matches_the_shared_op(d, k):
    g = torch.Generator().manual_seed(1)
    x, c = torch.randn(3000, d, generator=g), torch.randn(k, d, generator=g)
    a, dist = prototypes.nearest_center(x, c)
    b, dist_b = nearest_center_op(x, c)
    assert a.dtype == torch.int64 and a.shape == (3000,)
    # exact search both ways: equal indices except for floating-point near-ties
    assert (a == b).float().mean() > 0.999
    torch.testing.assert_close(dist, dist_b, rtol=1e-4, atol=1e-4)


def test_prototype_search_does_not_depend_on_the_thread_count():
    """faiss's distances follow its BLAS split over threads (here they differ at 1 and 2 threads);
    the search pins that split, so the same rows give the same answer at any torch thread count."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(20000, 24, generator=g) * torch.rand(20000, 1, generator=g)
    c = torch.randn(512, 24, generator=g)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(prototypes.nearest_center(x, c))
    finally:
        torch.set_num_threads(before)
    (a, da), (b, db) = results
    assert torch.equal(a, b) and torch.equal(da, db)


def test_prototype_search_leaves_the_callers_thread_count():
    """faiss's thread setting is OpenMP's, which torch shares: left at faiss's, a caller's later
    torch reductions split differently (a second compress in one process wrote other bytes)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        prototypes.nearest_center(torch.randn(4000, 9), torch.randn(64, 9))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_scene_frame_does_not_depend_on_the_thread_count():
    """The frame (and the file's XFRM section) is the same to the bit at 1 and 2 threads on a
    scene large enough for torch to split a float64 reduction (its grain is 32768 elements;
    with torch's sums this scene's centre and axes differed in the last bits)."""
    from pgms_helpers import random_scene

    from visionmoe.splat.cameras import scene_frame

    scene = random_scene(133_618, 0, seed=9)
    before = torch.get_num_threads()
    try:
        frames = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            frames.append(scene_frame(scene))
    finally:
        torch.set_num_threads(before)
    a, b = frames
    assert torch.equal(a.centre, b.centre) and a.size == b.size and torch.equal(a.canonical_axes(), b.canonical_axes())


def test_build_codebook_deterministic():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(5000, 9, generator=g), torch.rand(5000, generator=g)
    a = kmeans.build_codebook(x, w, 64, seed=3, max_train=2048)
    b = kmeans.build_codebook(x, w, 64, seed=3, max_train=2048)
    assert torch.equal(a, b) and a.shape == (64, 9)


def test_chunked_pyramid_and_merge_match_unchunked(monkeypatch):
    scene = random_scene(3000, degree=2, seed=4)
    w = torch.rand(3000, generator=torch.Generator().manual_seed(5)) + 0.01
    ref = build_pyramid(scene, w)
    monkeypatch.setattr(pyramid, "_CHUNK", 257)
    monkeypatch.setattr(update, "_CHUNK", 300)
    got = build_pyramid(scene, w)
    assert [lv.num_gaussians for lv in got.levels] == [lv.num_gaussians for lv in ref.levels]
    for a, b in zip(got.levels, ref.levels):
        torch.testing.assert_close(a.sh_rest, b.sh_rest, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a.sh_dc, b.sh_dc, rtol=1e-5, atol=1e-6)
    for a, b in zip(got.distortion, ref.distortion):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ratio", [8, 30])
def test_rate_tuning_lands_in_band(ratio):
    scene = random_scene(4000, degree=1, seed=6)
    res = compress(scene, ratio=ratio, num_views=4, view_size=64)
    assert res.target_met, (res.nbytes, res.target_bytes)
    # the kept file is a full encode (every coder tried), and it decodes
    assert decompress(res.data).num_gaussians == res.primitives


def _bench_memory():
    spec = importlib.util.spec_from_file_location("bench_memory", REPO / "scripts" / "bench_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_synthetic_scale_scene_is_deterministic():
    mod = _bench_memory()
    a, b = mod.synthetic_scene(5000, 3, seed=7), mod.synthetic_scene(5000, 3, seed=7)
    assert a.num_gaussians == 5000 and a.sh_degree == 3
    assert all(torch.equal(getattr(a, n), getattr(b, n)) for n in ("means", "quats", "sh_rest"))
    assert not torch.equal(a.means, mod.synthetic_scene(5000, 3, seed=8).means)
