"""The trajectory tools' domain check on clips whose answer is known: one ball falling (in),
several balls, a panning photo, a textured static scene with noise, nothing moving, a pendulum on
its string and two colliding balls (out), each for the reason it is out."""

import numpy as np
import pytest

from clips import RED, draw_disc, falling_balls, noisy_static, simulator_background, panning_photo, still, textured_image
from visionmoe.video.data.synthetic import generate_clip
from visionmoe.video.physics.domain import DOMAIN_DEFAULTS, single_free_body


@pytest.mark.parametrize("seed", [0, 1])
def test_one_falling_body_is_in_the_domain(seed):
    for clip in (generate_clip("free_fall", 300 + seed).frames, generate_clip("bounce", 300 + seed).frames,
                 generate_clip("projectile", 300 + seed).frames, falling_balls(seed, 1, jitter=1.0)[0],
                 falling_balls(seed, 1, background=textured_image(seed, 64, 64).astype(np.float64))[0]):
        check = single_free_body(clip)
        assert check.in_domain, check.reason
        assert check.camera_flow < 0.1 and check.moving_frames == 17 and check.elongation < 1.5


@pytest.mark.parametrize("make, reason", [
    (lambda s: falling_balls(s, 2)[0], "several moving objects"),
    (lambda s: falling_balls(s, 3)[0], "several moving objects"),
    (lambda s: panning_photo(s), "the camera moves"),
    (lambda s: panning_photo(s, speed=0.7), "the camera moves"),
    (lambda s: noisy_static(s, sigma=3.0), "no moving object"),
    (lambda s: noisy_static(s, sigma=5.0), "no moving object"),
    (lambda s: still(s), "no moving object"),
    (lambda s: generate_clip("pendulum", 300 + s).frames, "elongated"),
])
def test_clips_outside_the_domain_are_refused_for_their_reason(make, reason):
    for seed in (0, 1):
        check = single_free_body(make(seed))
        assert not check.in_domain and reason in check.reason, check.reason


def test_a_nearly_still_body_is_no_moving_object():
    clip = falling_balls(0, 1)[0]
    check = single_free_body(np.repeat(clip[8:9], 17, 0))
    assert not check.in_domain and check.reason.startswith("no moving object")
    bg = simulator_background(0)
    wobble = np.stack([draw_disc(bg, 30 + 1.5 * (i % 2), 30, 4.5, RED) for i in range(17)])  # 1.5 px to and fro
    check = single_free_body(np.rint(wobble * 255).astype(np.uint8))
    assert not check.in_domain and "travels" in check.reason and check.motion < DOMAIN_DEFAULTS["min_motion"]


def test_bad_input_fails_clearly():
    with pytest.raises(ValueError, match="unknown domain settings"):
        single_free_body(falling_balls(0)[0], min_lvel=3)
    with pytest.raises(ValueError, match=r"\[F, H, W, 3\]"):
        single_free_body(np.zeros((9, 32, 32), np.uint8))
