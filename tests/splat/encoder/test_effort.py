"""compress(effort=): what each level spends, its validation, the progress totals and where the
encoder renders."""

from __future__ import annotations

import importlib

import pytest
import torch
from pgms_helpers import ASSET, random_scene

from visionmoe.splat import compress, decompress
from visionmoe.splat.encoder import prune, refine
from visionmoe.splat.encoder.contribution import default_cameras, image_contributions
from visionmoe.splat.encoder.options import EFFORTS, EncodeOptions
from visionmoe.splat.io import read_ply
from visionmoe.splat.render import RenderError

TINY = dict(num_views=4, view_size=48, coverage_views=4)
SMALL = dict(num_views=4, view_size=32, coverage_views=2)


@pytest.fixture(scope="module")
def fruit():
    scene = read_ply(ASSET)
    cams = default_cameras(scene, num_views=4, size=64)
    return scene, cams, image_contributions(scene, cams)


def test_effort_is_validated_before_any_work():
    with pytest.raises(ValueError, match=r"effort must be one of \('fast', 'default', 'max'\), got 'turbo'"):
        EncodeOptions(effort="turbo")
    with pytest.raises(ValueError, match="effort must be one of"):
        compress(torch.zeros(3), effort=None)  # refused before the input is read


def test_prune_search_follows_the_effort_unless_given():
    assert EncodeOptions(effort="fast").prune_search == 0
    assert EncodeOptions(effort="max").prune_search == EFFORTS["max"].prune_search == 3
    assert EncodeOptions(effort="fast", prune_search=2).prune_search == 2
    assert EncodeOptions().effort == "default" and EncodeOptions().budget is EFFORTS["default"]


def test_max_keeps_the_full_searches_and_fast_skips_them():
    # max: today's counts (80 refinement steps of 8 views of 512 px, 3 pruning variants with the
    # top-up); the cheaper levels only ever spend less
    mx, df, fa = EFFORTS["max"], EFFORTS["default"], EFFORTS["fast"]
    assert (mx.refine_steps, mx.refine_views, mx.prune_search, mx.top_up) == (80, 8, 3, True)
    for cheap in (df, fa):
        assert cheap.refine_steps <= mx.refine_steps and cheap.refine_views <= mx.refine_views
        assert cheap.prune_search <= mx.prune_search
    assert fa.refine_steps == 0 and fa.prune_search == 0
    # the refinement's pixels a step: 8 views of 512 px from 256 px contribution views at max
    cams = default_cameras(read_ply(ASSET), num_views=2, size=256)
    assert refine.refinement_views(cams, mx.refine_views)[1] == 8
    assert refine.refinement_views(cams, df.refine_views)[1] == df.refine_views


@pytest.mark.parametrize("effort", ["fast", "default", "max"])
def test_each_effort_runs_its_searches(fruit, effort, monkeypatch):
    scene, cams, contrib = fruit
    seen = {"prune": 0, "refine": []}
    real_search = prune.search_pruning

    def search(base, seeds, job, prog):
        seen["prune"] += 1
        assert job.tries == EFFORTS[effort].prune_search and job.top_up == EFFORTS[effort].top_up
        return real_search(base, seeds, job, prog)

    def refined(tree, enc, job, refs, prog):  # recorded, not run (its steps are timed elsewhere)
        seen["refine"].append((job.steps, job.views))
        return enc

    monkeypatch.setattr(prune, "search_pruning", search)
    monkeypatch.setattr(refine, "refine_checked", refined)
    res = compress(scene, ratio=20, cameras=cams, contributions=contrib, effort=effort)
    budget = EFFORTS[effort]
    assert seen["prune"] == (1 if budget.prune_search else 0)
    assert seen["refine"] == ([(budget.refine_steps, budget.refine_views)] if budget.refine_steps else [])
    assert ("refine" in res.timings) == bool(budget.refine_steps)
    assert decompress(res.data).num_gaussians == res.primitives


@pytest.mark.parametrize("kwargs", [dict(effort="fast"), dict(refine_steps=3, prune_search=1),
                                    dict(psnr=30.0, refine_steps=0)])
def test_progress_total_is_known_up_front_and_reached(kwargs):
    scene = random_scene(300, degree=1, seed=3)
    calls = []
    compress(scene, **SMALL, **({"ratio": 10} if "psnr" not in kwargs else {}), **kwargs,
             progress=lambda *a: calls.append(a))
    totals = {total for _, _, total in calls}
    assert len(totals) == 1, totals  # one total, from the first report to the last
    total = totals.pop()
    done = [d for _, d, _ in calls]
    assert done == sorted(done) and done[0] < total and calls[-1] == ("done", total, total)
    stages = [s for s, _, _ in calls]
    assert stages[0] == "contributions" and ("psnr search" in stages) == ("psnr" in kwargs)
    if kwargs.get("refine_steps") == 3:
        # the refinement's 3 steps are 3 of the total's steps, reported one by one
        ref = [d for s, d, _ in calls if s == "refine"]
        assert len(ref) >= 3 and len(set(ref)) >= 3 and max(ref) == total


def test_every_render_runs_on_the_encodes_device(fruit, monkeypatch):
    # contributions, render checks, the pruning search and the refinement all render through
    # splat.render.render: each gets the scene on the encode's device (the codec stays on the CPU)
    render_mod = importlib.import_module("visionmoe.splat.render")  # the module (the package exports the function)

    scene, _, _ = fruit
    devices, real = [], render_mod.render

    def spy(s, cameras, *args, **kw):
        devices.append(s.means.device)
        return real(s, cameras, *args, **kw)

    monkeypatch.setattr(render_mod, "render", spy)
    res = compress(scene, ratio=20, **TINY, refine_steps=2, prune_search=1, device=torch.device("cpu"))
    assert "refine" in res.timings and "prune search" in res.timings
    assert len(devices) > 10 and set(devices) == {torch.device("cpu")}


def test_cuda_without_a_gpu_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RenderError, match="needs a CUDA GPU, but torch sees none; use 'cpu'"):
        compress(read_ply(ASSET), ratio=20, device="cuda", effort="fast")


def test_contribution_views_follow_the_effort_unless_given():
    fast, default = EncodeOptions(effort="fast"), EncodeOptions()
    assert (fast.num_views, fast.coverage_views) == (EFFORTS["fast"].views, EFFORTS["fast"].coverage_views) == (8, 8)
    assert (default.num_views, default.coverage_views) == (16, 16) == (EFFORTS["max"].views, EFFORTS["max"].coverage_views)
    given = EncodeOptions(effort="fast", num_views=12, coverage_views=0)
    assert (given.num_views, given.coverage_views) == (12, 0)
    with pytest.raises(ValueError, match="num_views must be an int >= 1"):
        EncodeOptions(num_views=0)
    from visionmoe.splat.evaluation import encoder_cameras

    scene = read_ply(ASSET)
    # 8 orbit views at 20 degrees, half as many at 45 and at 0, then 8 coverage views
    assert len(encoder_cameras(scene, effort="fast")) == 8 + 4 + 4 + 8
    assert len(encoder_cameras(scene)) == 16 + 8 + 8 + 16
