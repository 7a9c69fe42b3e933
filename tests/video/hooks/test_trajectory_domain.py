"""Trajectory projection and guidance outside their assumption (one free body, static background
and camera): several balls, a panning photo, a textured static scene with noise, nothing moving, a
pendulum on its string. Each clip is left as it is (mean change <= 1 grey level; in fact none),
with one logged warning; clips inside it are still corrected, and the guidance's correction
lowers a residual that an independent judge measures (the evaluation's hard-threshold tracker,
and the distance to the true path), not only the guidance's own."""

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from clips import falling_balls, noisy_static, panning_photo, still
from visionmoe.video.data.synthetic import generate_clip
from visionmoe.video.evaluation import metrics as M
from visionmoe.video.hooks.trajectory_guidance import TrajectoryGuidance
from visionmoe.video.hooks.trajectory_projection import TrajectoryProjection
from visionmoe.video.physics.rigid_body import project_clip

OUTSIDE = {
    "two balls": lambda: falling_balls(7, 2)[0],
    "panning photo": lambda: panning_photo(7),
    "textured static scene with noise": lambda: noisy_static(7, sigma=3.0),
    "nothing moves": lambda: still(7),
    "pendulum on its string": lambda: generate_clip("pendulum", 7).frames,
}


def to_unit(u8):
    return u8.astype(np.float32) / 127.5 - 1


def grey_change(a, b):
    """Mean absolute change in grey levels of two clips in [-1, 1]."""
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).mean() * 127.5)


def warnings_of(caplog, name):
    return [r for r in caplog.records if r.name == name and r.levelno == logging.WARNING]


@pytest.mark.parametrize("name", list(OUTSIDE))
def test_projection_leaves_clips_outside_its_domain_unchanged(name, caplog):
    clip = to_unit(OUTSIDE[name]())
    with caplog.at_level(logging.WARNING):
        out, shift = project_clip(clip)
    assert grey_change(out, clip) <= 1.0 and np.array_equal(out, clip) and shift == 0.0
    assert len(warnings_of(caplog, "visionmoe.video.physics.rigid_body")) == 1


def test_without_the_check_the_projection_damages_them():
    """The control that makes the test above able to fail: unchecked, the projection re-draws
    these clips (it erases the pendulum's string, one of two balls, invents a body in noise)."""
    damaged = [grey_change(project_clip(to_unit(OUTSIDE[n]()), check_domain=False)[0], to_unit(OUTSIDE[n]()))
               for n in ("two balls", "pendulum on its string", "textured static scene with noise")]
    assert min(damaged) > 1.0, damaged


class PixelVAE(torch.nn.Module):
    """The identity as a Wan VAE (3 latent channels = RGB): the hooks' decode and encode become
    no-ops, so the tests see the tools' own work on pixels, in a fraction of a second (the toy
    world's VAE path: test_trajectory_projection.py)."""

    dtype = torch.float32

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(latents_mean=[0.0] * 3, latents_std=[1.0] * 3, z_dim=3)

    def decode(self, z, return_dict=False):
        return (z,)

    def encode(self, x):
        return SimpleNamespace(latent_dist=SimpleNamespace(mean=x))


def as_latents(clips):
    return torch.from_numpy(np.stack([to_unit(c) for c in clips])).permute(0, 4, 1, 2, 3)


def as_u8(x):
    return [np.clip(np.rint((c.permute(1, 2, 3, 0).numpy() + 1) * 127.5), 0, 255).astype(np.uint8) for c in x]


def test_projection_hook_keeps_outside_clips_and_corrects_the_inside_one(caplog):
    clips = [OUTSIDE["two balls"](), OUTSIDE["panning photo"](), falling_balls(8, 1, jitter=1.5)[0]]
    video = as_latents(clips)
    proj = TrajectoryProjection(PixelVAE(), space="pixels")
    with caplog.at_level(logging.WARNING):
        out = proj.project_video(video)
    assert torch.equal(out[:2], video[:2]) and grey_change(out[2], video[2]) > 0.1
    assert len(warnings_of(caplog, "visionmoe.video.hooks.trajectory_projection")) == 2 and len(proj.refused) == 2
    # in latent space: the refused clips keep their velocity exactly, the other is projected
    proj = TrajectoryProjection(PixelVAE())
    noise = torch.randn(video.shape, generator=torch.Generator().manual_seed(0))
    sigma = 0.1
    sample, v = (1 - sigma) * video + sigma * noise, noise - video
    v2 = proj.apply(v, sample, sigma)
    assert torch.equal(v2[:2], v[:2]) and grey_change(v2[2] - v[2], 0) > 0.1


def test_guidance_leaves_outside_clips_unguided_with_one_warning_per_clip(caplog):
    x0 = as_latents([OUTSIDE["two balls"](), OUTSIDE["textured static scene with noise"]()])
    g = TrajectoryGuidance(PixelVAE(), strength=0.05, min_sigma=0.0)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING):
        for sigma in (0.2, 0.1):  # two steps of one run
            dv = g.correction((1 - sigma) * x0 + sigma * noise, noise - x0, sigma)
            assert torch.equal(dv, torch.zeros_like(dv))
    assert len(warnings_of(caplog, "visionmoe.video.hooks.trajectory_guidance")) == 2 and len(g.refused) == 4
    assert g.calls == 0


def test_guidance_lowers_the_residual_an_independent_judge_measures():
    """Three guided steps on four jittery falling balls, judged by the evaluation's hard-threshold
    tracker (connected components; the guidance follows a soft weighted centroid): the parabola
    residual and the distance to the true (unjittered) path both fall; the same steps in the
    opposite direction (the control) raise the residual. The judge sees far less than the
    guidance's own residual does (which falls by about 90% here)."""
    made = [falling_balls(s, 1, jitter=1.5) for s in range(4)]
    x0 = as_latents([c for c, _ in made])
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    sigma = 0.5

    def judge(x):
        res, dist = [], []
        for clip, (_, (ys, xs)) in zip(as_u8(x), made):
            track = M.guarded_track(clip).positions
            res.append(M.gravity_fit(track=track).residual_quadratic)
            dist.append(np.nanmean(np.hypot(track[:, 0] - xs[0], track[:, 1] - ys[0])))
        return np.mean(res), np.mean(dist)

    def guide(sign):
        g = TrajectoryGuidance(PixelVAE(), strength=0.02, min_sigma=0.0)
        x, own = x0.clone(), []
        for _ in range(3):
            x = x - sign * sigma * g.correction((1 - sigma) * x + sigma * noise, noise - x, sigma)
            own.append(g.last_residual)
        assert g.calls == 3 and not g.refused
        return judge(x), own

    (res0, dist0), ((res1, dist1), own) = judge(x0), guide(1.0)
    assert res1 < res0 and dist1 < dist0 and own[-1] < 0.5 * own[0], (res0, res1, dist0, dist1, own)
    assert guide(-1.0)[0][0] > res0


def test_guidance_corrects_the_inside_clip_of_a_mixed_batch_only():
    x0 = as_latents([OUTSIDE["panning photo"](), falling_balls(2, 1, jitter=1.5)[0]])
    g = TrajectoryGuidance(PixelVAE(), strength=0.05, min_sigma=0.0)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    dv = g.correction(0.5 * x0 + 0.5 * noise, noise - x0, 0.5)
    assert torch.equal(dv[0], torch.zeros_like(dv[0])) and float(dv[1].abs().max()) > 0
    assert g.calls == 1 and len(g.refused) == 1 and g.refused[0].startswith("the camera moves")
