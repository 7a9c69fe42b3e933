"""A file at a byte target fills it: at least FILL_BELOW (99%) of it, never more (issue 50: "at
a peer's size ... files fill at least 99% of the target")."""

from __future__ import annotations

import numpy as np
import pytest
from pgms_helpers import ASSET

from visionmoe.splat import compress, decompress
from visionmoe.splat.encoder.allocator import APPEARANCE_LADDER, GEOMETRY_LADDER, appearance_rung, make_preset
from visionmoe.splat.encoder.rung_search import FILL_BELOW
from visionmoe.splat.io import read_ply

TOP_G = len(GEOMETRY_LADDER) - 1
GRID = [a for a, r in enumerate(APPEARANCE_LADDER) if len(r) == 4]  # the per-primitive SH rungs


def test_fractional_appearance_rungs_lie_between_two_grid_rungs():
    """Between two per-primitive SH rungs the step interpolates geometrically, finer as t grows,
    and is a float32 (section SHQP stores it as one); between codebook rungs, or past the last
    rung, there is no fractional rung."""
    for a in GRID[:-1]:
        steps = [make_preset(TOP_G, a + t).sh_step for t in (0.0, 0.25, 0.5, 0.75, 1.0)]
        assert all(f < c for c, f in zip(steps, steps[1:])), (a, steps)
        assert all(float(np.float32(s)) == s for s in steps[1:-1])  # the ladder's own: as written
        assert appearance_rung(a + 0.5)[:3] == APPEARANCE_LADDER[a][:3]
    for bad in (GRID[0] - 0.5, 3.5, GRID[-1] + 0.5):
        with pytest.raises(ValueError, match="preset rungs"):
            make_preset(TOP_G, bad)


def test_fast_at_a_peers_size_fills_the_target():
    """fruit_drops_minimal at SOG's size, effort fast: every leaf at the finest geometry rung
    took 93.6% of it; a fractional per-primitive SH rung fills it."""
    scene = read_ply(ASSET)
    target = 231_909  # SOG's file of this scene (splat-transform 3.x)
    res = compress(scene, size=target, effort="fast")  # its own views: fewer prune more Gaussians
    assert FILL_BELOW * target <= res.nbytes <= target, (res.nbytes, target, res.preset_index)
    assert res.primitives == res.input_gaussians - res.pruned  # every leaf kept: no merge paid for it
    assert decompress(res.data).num_gaussians == res.primitives
