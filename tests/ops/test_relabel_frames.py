"""The parent-frame relabelling (visionmoe.ops.frames): the C++ loops give the numpy reference's
bits on random rotations and on the exact ties of axis-aligned ones (children turned 45 or 90
degrees from their parents), with either candidate set, and keep the log-scales' dtype."""

from __future__ import annotations

import numpy as np
import pytest

from visionmoe.ops import frames

needs_compiled = pytest.mark.skipif(not frames.compiled_available(),
                                    reason="compares with the compiled extension (make build)")


def _pairs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    parent, child = rng.normal(size=(n, 4)), rng.normal(size=(n, 4))
    k = n // 6
    child[:k] = parent[:k]  # one child, its parent's own frame
    child[k: 2 * k] = parent[k: 2 * k] + 1e-9 * rng.normal(size=(k, 4))  # nearly
    parent[2 * k: 4 * k] = np.round(parent[2 * k: 4 * k] * 2) / 2  # axis-aligned: exact ties of traces
    child[3 * k: 4 * k] = np.round(child[3 * k: 4 * k] * 2) / 2
    child[4 * k: 4 * k + 7] = 0.0  # degenerate: the identity
    return parent, child


@needs_compiled
@pytest.mark.parametrize("permute", [True, False])
def test_compiled_gives_the_reference_bits(permute):
    parent, child = _pairs(60_000, 0)
    ls = np.random.default_rng(1).normal(-3, 1, size=(60_000, 3)).astype(np.float32)
    rel, ls2 = frames.relabel_to_parent(parent, child, ls, permute, compiled=True)
    rel_ref, ls_ref = frames.relabel_to_parent_ref(parent, child, ls, permute)
    np.testing.assert_array_equal(rel.view(np.int64), rel_ref.view(np.int64))
    np.testing.assert_array_equal(ls2, ls_ref)
    assert ls2.dtype == np.float32 and rel.dtype == np.float64


@needs_compiled
def test_ties_are_broken_alike():
    # a child turned exactly 45 degrees about z: two labellings tie, the first in the list wins
    parent = np.tile([1.0, 0.0, 0.0, 0.0], (4, 1))
    child = np.tile([np.cos(np.pi / 8), 0.0, 0.0, np.sin(np.pi / 8)], (4, 1))
    a = frames.relabel_to_parent(parent, child, np.zeros((4, 3)), compiled=True)
    b = frames.relabel_to_parent_ref(parent, child, np.zeros((4, 3)))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[0][0], [np.cos(np.pi / 8), 0.0, 0.0, np.sin(np.pi / 8)])


@needs_compiled
def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        frames.relabel_to_parent(np.zeros((3, 4)), np.zeros((2, 4)), np.zeros((3, 3)), compiled=True)


def test_reference_runs_without_the_extension():
    parent, child = _pairs(600, 2)
    rel, ls = frames.relabel_to_parent(parent, child, np.zeros((600, 3)), compiled=False)
    assert rel.shape == (600, 4) and (rel[:, 0] >= 0).all()
    np.testing.assert_allclose(np.linalg.norm(rel, axis=1), 1.0, atol=1e-12)
