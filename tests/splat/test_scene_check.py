"""check_finite: the one rule every reader and decoder applies (finite after activation in float32)."""

import math

import pytest
import torch

from visionmoe.splat.io import GaussianScene, SceneError
from visionmoe.splat.scene_check import LOG_SCALE_LIMIT, check_finite


def _scene(n: int = 6, degree: int = 1) -> GaussianScene:
    g = torch.Generator().manual_seed(0)
    k = (degree + 1) ** 2 - 1
    return GaussianScene(means=torch.randn(n, 3, generator=g), quats=torch.randn(n, 4, generator=g),
                         log_scales=torch.randn(n, 3, generator=g) - 3, opacity_logits=torch.randn(n, generator=g),
                         sh_dc=torch.randn(n, 3, generator=g), sh_rest=torch.randn(n, k, 3, generator=g))


def test_finite_scene_passes_unchanged():
    scene = _scene()
    out, dropped = check_finite(scene, "s")
    assert out is scene and dropped == 0


@pytest.mark.parametrize("field,row,value,word", [
    ("means", (1, 0), float("nan"), "positions"),
    ("opacity_logits", (2,), float("inf"), "opacity"),
    ("log_scales", (3, 2), 89.0, "log-scales above 88.72"),  # finite, but exp overflows float32
    ("sh_rest", (4, slice(None), 0), 2.0e38, "colour"),  # each finite; 0.5 + sum |c| overflows float32
    ("quats", (5, 0), 2.0e19, "quaternions"),  # finite, but the squared norm overflows
])
def test_reject_names_count_and_attribute(field, row, value, word):
    scene = _scene()
    getattr(scene, field)[row] = value
    with pytest.raises(SceneError) as err:
        check_finite(scene, "x.splat")
    msg = str(err.value)
    assert msg.startswith("x.splat: 1 of 6 Gaussians") and word in msg and "\n" not in msg


def test_huge_colour_ranges_overflow_as_a_sum():
    scene = _scene()
    scene.sh_dc[0] = torch.tensor([2.0e38, 2.0e38, 0.0])  # each finite; |dc_r| + |dc_g| crosses FLT_MAX
    with pytest.raises(SceneError, match="colour"):
        check_finite(scene, "c")


def test_log_scale_limit_is_where_float32_exp_overflows():
    below = torch.tensor(LOG_SCALE_LIMIT, dtype=torch.float32).nextafter(torch.tensor(0.0))
    assert math.isfinite(torch.exp(below).item()) and LOG_SCALE_LIMIT == pytest.approx(88.72283, abs=1e-5)
    scene = _scene()
    scene.log_scales[0, 0] = below
    assert check_finite(scene, "s")[1] == 0


def test_the_float32_value_just_past_the_limit_is_refused():
    past = torch.tensor(LOG_SCALE_LIMIT, dtype=torch.float32)  # rounds up: exp overflows in float32
    assert not math.isfinite(torch.exp(past).item())
    scene = _scene()
    scene.log_scales[2, 0] = past
    with pytest.raises(SceneError, match="1 of 6"):
        check_finite(scene, "s")


def test_drop_returns_the_rest_and_the_count():
    scene = _scene()
    scene.log_scales[1, 1] = 100.0
    scene.means[4, 2] = float("-inf")
    out, dropped = check_finite(scene, "s", nonfinite="drop")
    assert dropped == 2 and len(out) == 4
    assert torch.equal(out.means, scene.means[[0, 2, 3, 5]])


def test_drop_everything_is_an_error_and_bad_mode_is_refused():
    scene = _scene(2)
    scene.means[:] = float("nan")
    with pytest.raises(SceneError, match="every Gaussian"):
        check_finite(scene, "s", nonfinite="drop")
    with pytest.raises(ValueError, match="nonfinite must be"):
        check_finite(scene, "s", nonfinite="clamp")
