"""Lawful and unlawful clips under one caption: the pair shares the caption, the object and its
start; the law's parameter fitted on the frames recovers the simulator's truth, lawful and not."""

import numpy as np
import pytest

from visionmoe.video.data.law_variants import LAW_SCENARIOS, generate_law_clip, law_pair
from visionmoe.video.evaluation import metrics as M
from visionmoe.video.pila.taxonomy import CATEGORY_NAMES


@pytest.mark.parametrize("scenario", sorted(LAW_SCENARIOS))
def test_a_pair_shares_caption_object_and_start(scenario):
    for seed in (0, 1):
        good, bad = law_pair(scenario, seed)
        assert good.caption == bad.caption and good.labels == bad.labels and good.labels[0] in CATEGORY_NAMES
        assert np.array_equal(good.frames[0], bad.frames[0]) and not np.array_equal(good.frames, bad.frames)
        assert good.params["lawful"] == 1.0 and bad.params["lawful"] == 0.0
        again = generate_law_clip(scenario, seed, False)
        assert np.array_equal(again.frames, bad.frames)  # a pure function of (scenario, seed, lawful)
    assert len(set(LAW_SCENARIOS.values())) >= 3  # routing has categories to tell apart


def test_the_fitted_law_recovers_the_truth():
    for seed in range(4):
        good, bad = law_pair("projectile", seed)
        assert M.gravity_fit(good.frames).accel == pytest.approx(good.params["g"], rel=0.1)
        assert M.gravity_fit(bad.frames).accel < 0.5 * good.params["g"]  # wrong sign or too weak
        good, bad = law_pair("bounce", seed)
        assert M.gravity_fit(good.frames).restitution <= 1.0 < M.gravity_fit(bad.frames).restitution
        good, bad = law_pair("sliding", seed)
        assert M.gravity_fit(good.frames).tangential_accel < -0.05  # friction decelerates
        assert M.gravity_fit(bad.frames).tangential_accel > -0.01  # no friction, or speeding up


def _stream_height(frames):
    """Mean height (px, +y down) of the stream's saturated blue pixels in the last frame."""
    f = frames[-1].astype(np.float64)
    blue = (f[..., 2] > 150) & (f[..., 2] - f[..., 0] > 80)
    return np.nonzero(blue)[0].mean()


def test_an_unlawful_stream_falls_less():
    for seed in range(4):
        good, bad = law_pair("stream", seed)
        assert bad.params["g"] < 0.5 * good.params["g"]
        assert _stream_height(good.frames) > _stream_height(bad.frames) + 2.0
        p = good.trajectories["particles"]
        first = p[:, 0]  # the first particle: free flight under g
        assert np.allclose(np.diff(first[:, 1], 2), good.params["g"], atol=1e-4)


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="unknown scenario"):
        generate_law_clip("orbit", 0)
    with pytest.raises(ValueError):
        generate_law_clip("bounce", 0, num_frames=10)
