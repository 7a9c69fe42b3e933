"""encoder.guards.smallest_file_bytes / check_target: the smallest reachable .pgms, measured
against real encodes of the smallest case (a one-level pyramid, every Gaussian alike, a
target of 1 byte so every rung is at its coarsest)."""

from __future__ import annotations

import pytest
import torch
from pgms_helpers import random_scene

from visionmoe.splat import compress
from visionmoe.splat.encoder.guards import check_target, smallest_file_bytes
from visionmoe.splat.io import SceneError
from visionmoe.splat.pgms.decode import info


@pytest.mark.parametrize("degree, frame, n", [(0, "world", 1), (0, "world", 8), (3, "scene", 1), (1, "scene", 40)])
def test_the_bound_is_below_every_real_smallest_file_and_close_to_it(degree, frame, n):
    scene = random_scene(n, degree, seed=3)
    scene.means.zero_()  # the cheapest content: every stream constant
    res = compress(scene, size=1, contributions=torch.ones(n), frame=frame, refine_steps=0, prune_search=0,
                   verify_views=0)
    meta = info(res.data)
    assert meta["levels"] == 1  # the one-level pyramid the bound assumes
    least = smallest_file_bytes(degree, frame)
    assert least <= res.nbytes, (least, res.nbytes)
    if (degree, frame, n) == (0, "world", 1):  # nothing but the fixed parts and one Gaussian's symbols
        assert res.nbytes <= 1.1 * least, (least, res.nbytes)


def test_more_levels_and_the_frame_cost_more():
    assert smallest_file_bytes(0, "world") < smallest_file_bytes(0, "scene") < smallest_file_bytes(3, "scene")
    assert smallest_file_bytes(3, "scene", 4) > smallest_file_bytes(3, "scene", 1)
    with pytest.raises(ValueError, match="num_levels"):
        smallest_file_bytes(0, "world", 0)


def test_check_target_names_the_smallest_size():
    least = smallest_file_bytes(3, "scene")
    check_target(least, 3, "scene")
    check_target(None, 3, "scene")  # a PSNR target has no byte count
    with pytest.raises(SceneError, match=f"at least {least} bytes"):
        check_target(least - 1, 3, "scene")
