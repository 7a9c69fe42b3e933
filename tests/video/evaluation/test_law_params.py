"""The colour-mask tracker and the per-category law fits of the deficit evaluation, on the
simulator's closed-form clips: the lawful clip's parameter is recovered, the unlawful clip of
the same seed is told apart, and failures score the worst value."""

import numpy as np
import pytest

from visionmoe.video.data.law_variants import generate_law_clip
from visionmoe.video.data.scenes import COLORS
from visionmoe.video.evaluation.law_params import (WORST_ERROR, caption_color, color_track, fit_law, hue_of,
                                                   law_error, lawful_range)

SEEDS = (900_000_001, 900_000_002, 900_000_003)
KEY = {"projectile": "g", "bounce": "restitution", "sliding": "friction_decel"}
TOL = {"projectile": 0.05, "bounce": 0.05, "sliding": 0.15}


def test_hue_and_caption_colour():
    assert hue_of(COLORS["red"]) == pytest.approx(0.0, abs=1.0)
    assert hue_of(COLORS["green"]) == pytest.approx(128.0, abs=3.0)
    assert caption_color("an orange box slides across the floor") == COLORS["orange"]
    assert caption_color("water pours from a spout in a stream") is not None
    assert caption_color("something unnamed") is None


@pytest.mark.parametrize("scenario", sorted(KEY))
def test_lawful_parameter_recovered_and_unlawful_told_apart(scenario):
    for seed in SEEDS:
        L, U = generate_law_clip(scenario, seed, True), generate_law_clip(scenario, seed, False)
        rgb = caption_color(L.caption)
        truth = L.params[KEY[scenario]]
        fl, fu = fit_law(L.frames, scenario, rgb), fit_law(U.frames, scenario, rgb)
        assert fl.ok and fl.found_fraction == 1.0 and fl.color_fraction > 0.9
        assert law_error(fl, truth) < TOL[scenario], (seed, fl.value, truth)
        assert lawful_range(scenario, fl.value)
        assert law_error(fu, truth) > 0.3, (seed, fu.value, truth)
        assert not lawful_range(scenario, fu.value)


def test_stream_centroid_acceleration_separates_the_laws():
    for seed in SEEDS:
        L, U = generate_law_clip("stream", seed, True), generate_law_clip("stream", seed, False)
        rgb = caption_color(L.caption)
        fl, fu = fit_law(L.frames, "stream", rgb), fit_law(U.frames, "stream", rgb)
        assert fl.ok and lawful_range("stream", fl.value)
        # a steady stream's centroid accelerates at about g / 3
        assert fl.value == pytest.approx(L.params["g"] / 3, rel=0.5)
        assert law_error(fu, fl.value) > 0.3


def test_tracker_follows_the_captioned_colour_only():
    L = generate_law_clip("projectile", SEEDS[0], True)
    name = next(n for n, c in COLORS.items() if caption_color(L.caption) == c)
    other = "green" if name in ("red", "orange", "yellow", "purple", "blue") else "red"
    tr = color_track(L.frames, COLORS[name])
    truth = L.trajectories["positions"][:, 0]
    assert np.nanmax(np.abs(tr.positions - truth)) < 1.0
    wrong = fit_law(L.frames, "projectile", COLORS[other])
    assert not wrong.ok and wrong.found_fraction < 0.2
    assert law_error(wrong, L.params["g"]) == WORST_ERROR


def test_failures_score_the_worst_value():
    blank = np.full((17, 64, 64, 3), 40, np.uint8)
    for scenario in ("projectile", "bounce", "sliding", "stream"):
        f = fit_law(blank, scenario, COLORS["red"])
        assert not f.ok and f.found_fraction == 0.0
        assert law_error(f, 0.4) == WORST_ERROR
    # a ball that falls and never reaches the floor has no restitution to fit
    L = generate_law_clip("bounce", SEEDS[0], True)
    first = int(np.ceil(L.trajectories["contacts"][0])) if len(L.trajectories["contacts"]) else 17
    frames = L.frames[:max(first - 1, 8)]
    f = fit_law(frames, "bounce", caption_color(L.caption))
    assert not f.ok and law_error(f, L.params["restitution"]) == WORST_ERROR
    with pytest.raises(ValueError):
        fit_law(L.frames, "pendulum", COLORS["red"])
