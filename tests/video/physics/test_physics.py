"""visionmoe.video.physics on tracks and frames whose answer is known in closed form: exact
parabolas and lines, a bounce at a known frame, squares drawn at known centres. The law fits
must recover the constants they were drawn with; the trackers the positions."""

import numpy as np
import pytest
import torch

from visionmoe.video.physics.differentiable import law_residual, soft_track
from visionmoe.video.physics.laws import bounce_segments, fit_law_track, fit_segments, gravity_fit
from visionmoe.video.physics.tracking import object_track

G = 0.8  # px / frame^2, +y down


def bouncing_track(n=17, bounce=8, restitution=0.6):
    """A ball dropped at y=5 that hits the floor at frame ``bounce`` and rises with
    ``restitution`` of its speed: two exact parabolas with one acceleration."""
    t = np.arange(n, dtype=np.float64)
    y = 5.0 + 0.5 * G * t**2
    floor, v_hit = y[bounce], G * bounce
    after = t[bounce:] - bounce
    y[bounce:] = floor - restitution * v_hit * after + 0.5 * G * after**2
    x = 10.0 + 1.5 * t
    return t, y, x


def test_fit_segments_recovers_the_acceleration_of_an_exact_parabola():
    t = np.arange(12, dtype=np.float64)
    y = 2.0 + 3.0 * t + 0.5 * G * t**2
    g, rms, sol = fit_segments(t, y, [(0, 12)])
    assert g == pytest.approx(G, abs=1e-9) and rms < 1e-9
    assert sol[1:] == pytest.approx([3.0, 2.0], abs=1e-9)
    g_lines, rms_lines, _ = fit_segments(t, y, [(0, 12)], shared_accel=False)
    assert g_lines == 0.0 and rms_lines > 1.0  # a line cannot follow the parabola


def test_bounce_segments_cut_at_the_reversal_near_the_floor():
    _, y, _ = bouncing_track(bounce=8)
    assert bounce_segments(y) == [(0, 8), (9, 17)]
    assert bounce_segments(np.linspace(0, 20, 10)) == [(0, 10)]  # a plain fall: one segment


def test_gravity_fit_on_a_known_bounce():
    _, y, x = bouncing_track(restitution=0.6)
    fit = gravity_fit(track=np.stack([x, y], 1))
    assert fit.accel == pytest.approx(G, rel=1e-6) and fit.residual_quadratic < 1e-6
    assert fit.num_segments == 2 and fit.falling and fit.physical
    assert fit.restitution == pytest.approx(0.6, abs=0.1)  # speeds read at the excluded contact frame
    up = gravity_fit(track=np.stack([x, -y], 1))  # the same motion upside down: the wrong sign
    assert not up.physical


def test_gravity_fit_without_enough_points_is_undefined():
    fit = gravity_fit(track=np.full((10, 2), np.nan))
    assert np.isnan(fit.accel) and not fit.physical and fit.num_points == 0


@pytest.mark.parametrize("law", ["gravity", "lines"])
def test_fit_law_track(law):
    _, y, x = bouncing_track()
    fy, fx = fit_law_track(y, x, law=law)
    assert fx == pytest.approx(x, abs=1e-9)  # x is a line: the law keeps it
    if law == "gravity":
        assert fy == pytest.approx(y, abs=1e-9)  # exact parabolas are their own fit
    else:
        for s, e in bounce_segments(y):
            assert np.diff(fy[s:e], 2) == pytest.approx(0.0, abs=1e-9)  # straight within a segment
    with pytest.raises(ValueError, match="law must be one of"):
        fit_law_track(y, x, law="spiral")


def squares(centres, size=64, half=2):
    frames = np.zeros((len(centres), size, size, 3), np.uint8)
    for f, (cx, cy) in zip(frames, centres):
        f[cy - half:cy + half + 1, cx - half:cx + half + 1] = 255
    return frames


def test_object_track_finds_drawn_squares():
    _, y, x = bouncing_track()
    centres = [(int(round(a)), int(round(b))) for a, b in zip(x, y)]
    track = object_track(squares(centres))
    assert track == pytest.approx(np.asarray(centres, np.float64), abs=1e-6)
    assert np.isnan(object_track(np.zeros((5, 16, 16, 3), np.uint8))).all()  # nothing moves


def test_soft_track_and_law_residual_are_differentiable_and_zero_on_the_law():
    _, y, x = bouncing_track()
    centres = [(int(round(a)), int(round(b))) for a, b in zip(x, y)]
    frames = torch.from_numpy(squares(centres)).permute(3, 0, 1, 2)[None].double() / 127.5 - 1
    frames.requires_grad_(True)
    ty, tx = soft_track(frames)
    assert ty[0].detach().numpy() == pytest.approx([c[1] for c in centres], abs=1e-4)
    assert tx[0].detach().numpy() == pytest.approx([c[0] for c in centres], abs=1e-4)
    law_residual(ty, tx).backward()
    assert frames.grad is not None and torch.isfinite(frames.grad).all()
    exact = torch.from_numpy(y)[None]
    assert law_residual(exact, torch.from_numpy(x)[None]).item() < 1e-12
    assert law_residual(exact + torch.linspace(0, 1, len(y)) ** 3, torch.from_numpy(x)[None]).item() > 1e-3
