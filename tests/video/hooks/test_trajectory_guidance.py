"""Trajectory-law guidance: the law residual, the soft tracker, and the hook on tiny Wan pipelines."""

import numpy as np
import pytest
import torch

from visionmoe.video.evaluation import metrics as M
from visionmoe.video.data.synthetic import generate_clip
from visionmoe.video.models.tiny import load_tiny_wan
from visionmoe.video.hooks.trajectory_guidance import attach_trajectory_guidance, detach_trajectory_guidance
from visionmoe.video.physics.differentiable import law_residual, soft_track


def run(pipe, steps=3):
    return pipe(prompt="a ball falls", negative_prompt="", height=32, width=32, num_frames=9,
                num_inference_steps=steps, guidance_scale=4.0, generator=torch.Generator().manual_seed(0),
                output_type="latent", max_sequence_length=16).frames


def test_law_residual_is_zero_on_the_law_and_its_gradient_lowers_it():
    t = torch.arange(17, dtype=torch.float64)
    y = (5 + 0.3 * t + 0.5 * 0.2 * t * t)[None]
    x = (30 + 0.1 * t)[None]
    assert float(law_residual(y, x)) == pytest.approx(0.0, abs=1e-8)
    noisy_y = (y + torch.randn(y.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)).requires_grad_(True)
    before = law_residual(noisy_y, x)
    (g,) = torch.autograd.grad(before, noisy_y)
    assert float(law_residual(noisy_y.detach() - 0.1 * g, x)) < float(before.detach())


def test_bounces_are_cut_like_the_metric():
    clip = generate_clip("bounce", 1)
    track = M.guarded_track(clip.frames).positions
    y, x = (torch.tensor(track[:, 1])[None], torch.tensor(track[:, 0])[None])
    fit = M.gravity_fit(track=track)
    assert fit.num_segments >= 2  # the clip bounces: one parabola would not fit
    per_frame = float(law_residual(y, x)) / 17
    assert per_frame < 1.0  # the simulator obeys the law piecewise


def test_soft_track_follows_the_object():
    clip = generate_clip("free_fall", 2)
    fr = torch.from_numpy(clip.frames).permute(3, 0, 1, 2)[None].double() / 127.5 - 1
    y, x = soft_track(fr)
    ref = M.guarded_track(clip.frames).positions
    # a soft proxy of the metric's track: the same fall, within a few pixels (it trails the
    # fast end of the fall, where the ball's blur widens the weighted region)
    assert np.abs(y[0].numpy() - ref[:, 1]).max() < 4.0 and np.abs(x[0].numpy() - ref[:, 0]).max() < 1.0
    assert np.corrcoef(y[0].numpy(), ref[:, 1])[0, 1] > 0.99


@pytest.mark.parametrize("version", ["2.1", "2.2"])
def test_strength_zero_and_detach_are_the_base_pipeline(version):
    pipe = load_tiny_wan(version)
    base = run(pipe)
    g = attach_trajectory_guidance(pipe, strength=0.0)
    assert torch.equal(run(pipe), base) and g.calls == 0
    g = attach_trajectory_guidance(pipe, strength=0.5, min_sigma=0.0, check_domain=False)  # tiny Wan draws noise
    guided = run(pipe)
    assert g.calls == 3 and not torch.equal(guided, base)  # one VAE pass per step, shared by both branches
    detach_trajectory_guidance(pipe)
    assert torch.equal(run(pipe), base)


def test_bad_settings_fail_clearly():
    pipe = load_tiny_wan("2.1")
    with pytest.raises(ValueError, match="strength"):
        attach_trajectory_guidance(pipe, strength=-1.0)
    with pytest.raises(ValueError, match="min_sigma"):
        attach_trajectory_guidance(pipe, min_sigma=2.0)
    with pytest.raises(ValueError, match="VAE"):
        attach_trajectory_guidance(object())
