"""The track laws: the centroid track of a latent blob, each category's inequality zero on motion
that keeps it and positive on the unlawful motion it names, a gradient that reaches ``dv``, and
the law loss's choice between field and track laws."""

import pytest
import torch
from test_law_residuals import blob_latent

from visionmoe.video.pila.law_residuals import corrected_clean_latent
from visionmoe.video.pila.taxonomy import CATEGORY_NAMES
from visionmoe.video.pila.track_laws import TRACK_LAWS, category_track_residuals, object_track
from visionmoe.video.training.config import TrainConfig
from visionmoe.video.training.losses import law_loss


def path(y, x):
    """(y(t), x(t)) in cells for the five latent frames; frame 0 (not tracked) sits far away."""
    return lambda t: (2.0, 13.0) if t == 0 else (y[t - 1], x[t - 1])


def per_category(p, category):
    return float(category_track_residuals(blob_latent(p, F=5)).per_category()[0, CATEGORY_NAMES.index(category)])


FALL = path([3.0, 5.5, 9.0, 13.5], [2.0, 4.5, 7.0, 9.5])  # +y down, accelerating down
RISE = path([13.5, 12.0, 9.5, 5.0], [2.0, 4.5, 7.0, 9.5])  # drifting up, faster and faster
SLOW = path([8.0] * 4, [2.0, 6.0, 9.0, 11.0])  # sliding, losing speed
SPEED_UP = path([8.0] * 4, [2.0, 4.0, 7.0, 11.0])
BOUNCE_LOWER = path([4.0, 12.0, 7.0, 11.0], [3.0, 6.0, 9.0, 12.0])  # after the floor, not as high
BOUNCE_HIGHER = path([6.0, 12.0, 3.0, 11.0], [3.0, 6.0, 9.0, 12.0])


def test_the_track_follows_the_blob_and_skips_the_first_frame():
    track = object_track(blob_latent(FALL, F=5))
    assert track.shape == (1, 4, 2)
    want = torch.tensor([[2.0, 3.0], [4.5, 5.5], [7.0, 9.0], [9.5, 13.5]], dtype=track.dtype)
    assert torch.allclose(track[0], want, atol=0.35), track


@pytest.mark.parametrize("category, lawful, unlawful", [
    ("rigid", FALL, RISE), ("rigid", SLOW, SPEED_UP), ("elastic", BOUNCE_LOWER, BOUNCE_HIGHER),
    ("liquid", FALL, RISE), ("gas", RISE, FALL),
])
def test_each_category_penalises_its_unlawful_motion_only(category, lawful, unlawful):
    good, bad = per_category(lawful, category), per_category(unlawful, category)
    assert good < 0.1 and bad > 0.3, (good, bad)


def test_categories_without_a_track_law_cost_nothing():
    assert TRACK_LAWS["thermal"] == TRACK_LAWS["optics"] == ()
    assert per_category(RISE, "thermal") == per_category(RISE, "optics") == 0.0


def test_the_gradient_reaches_dv_and_a_step_along_it_lowers_the_law():
    sigma, rigid = 0.5, torch.zeros(1, len(CATEGORY_NAMES), dtype=torch.float64)
    rigid[0, CATEGORY_NAMES.index("rigid")] = 1
    bad = blob_latent(RISE, F=5)
    noise = torch.randn(bad.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x_t = (1 - sigma) * bad + sigma * noise
    v = noise - bad
    dv = torch.zeros_like(v, requires_grad=True)
    loss = category_track_residuals(corrected_clean_latent(x_t, v, dv, sigma)).loss(rigid)
    loss.backward()
    assert float(loss.detach()) > 0.3 and float(dv.grad.abs().max()) > 0
    step = -1e-2 * dv.grad / dv.grad.abs().max()
    lower = category_track_residuals(corrected_clean_latent(x_t, v, step, sigma)).loss(rigid)
    assert float(lower) < float(loss.detach())


def test_law_loss_chooses_the_laws_and_bad_input_is_refused():
    x0 = blob_latent(RISE, F=5)
    labels = torch.zeros(1, len(CATEGORY_NAMES), dtype=torch.float64)
    labels[0, CATEGORY_NAMES.index("rigid")] = 1
    zero, sigma = torch.zeros_like(x0), torch.zeros(1, dtype=torch.float64)
    track = law_loss(x0, zero, sigma, labels, kind="track")
    assert float(track) == pytest.approx(float(category_track_residuals(x0).loss(labels)))
    assert float(track) != pytest.approx(float(law_loss(x0, zero, sigma, labels)))  # the field laws by default
    with pytest.raises(ValueError, match="F >= 4"):
        category_track_residuals(torch.zeros(1, 4, 3, 16, 16))
    with pytest.raises(ValueError, match="law_kind"):
        TrainConfig(stage=3, law_kind="tracks")
