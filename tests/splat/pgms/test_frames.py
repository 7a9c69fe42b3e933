"""Parent-frame coding helpers (format 3): exact relabelling, inverse frame maps."""

from __future__ import annotations

import numpy as np
import torch

from visionmoe.splat._math import covariance
from visionmoe.splat.pgms import _frames


def _random_quats(n, rng):
    q = rng.normal(size=(n, 4))
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def _cov(q, ls):
    return covariance(torch.from_numpy(np.asarray(q, np.float64)), torch.from_numpy(np.asarray(ls, np.float64))).numpy()


def test_relabelled_child_is_the_same_gaussian():
    rng = np.random.default_rng(0)
    parent, child = _random_quats(500, rng), _random_quats(500, rng)
    ls = rng.normal(-3, 1, size=(500, 3))
    for permute in (True, False):
        rel, ls2 = _frames.relabel_to_parent(parent, child, ls, allow_permute=permute)
        np.testing.assert_allclose(_cov(_frames.compose(parent, rel), ls2), _cov(child, ls), atol=1e-12)
        if not permute:
            np.testing.assert_array_equal(ls2, ls)  # per-axis value tables keep the axis order
        # the chosen labelling is the closest to the parent: |w| of the relative rotation is maximal
        assert (rel[:, 0] >= 0.5 - 1e-9).all() if permute else (rel[:, 0] >= 0).all()


def test_child_aligned_with_parent_has_identity_relative_rotation():
    rng = np.random.default_rng(1)
    parent = _random_quats(200, rng)
    # the same frame with axes relabelled (90-degree turn about z) and scales permuted to match
    turn = np.tile([np.cos(np.pi / 4), 0, 0, np.sin(np.pi / 4)], (200, 1))
    child = _frames.quat_mul(parent, turn)
    rel, ls = _frames.relabel_to_parent(parent, child, np.tile([-1.0, -2.0, -3.0], (200, 1)))
    np.testing.assert_allclose(rel, np.tile([1.0, 0, 0, 0], (200, 1)), atol=1e-9)
    np.testing.assert_array_equal(ls, np.tile([-2.0, -1.0, -3.0], (200, 1)))


def test_parent_frame_maps_are_inverse_rotations():
    rng = np.random.default_rng(2)
    q, v = _random_quats(100, rng), rng.normal(size=(100, 3))
    local = _frames.to_parent_frame(q, v)
    np.testing.assert_allclose(np.linalg.norm(local, axis=1), np.linalg.norm(v, axis=1), rtol=1e-12)
    np.testing.assert_allclose(_frames.from_parent_frame(q, local), v, atol=1e-12)
    ident = np.tile([1.0, 0, 0, 0], (100, 1))
    np.testing.assert_array_equal(_frames.to_parent_frame(ident, v), v)  # level 0: world axes, exactly
