"""The decoder's frame rotations (visionmoe.ops.frames.compose and rotate): the C++ loops give
the numpy reference's bits, on random, degenerate and nearly-unit quaternions, so a file decodes
to the same Gaussians with or without the extension."""

from __future__ import annotations

import numpy as np
import pytest

from visionmoe.ops import frames
from visionmoe.ops._backend import has_cpu_op

needs_compiled = pytest.mark.skipif(not has_cpu_op("rotate_by_quats"),
                                    reason="compares with the compiled extension (make build)")


def _quats(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, 4))
    q[: n // 5] /= np.linalg.norm(q[: n // 5], axis=1, keepdims=True)  # unit already
    q[n // 5: n // 5 + 9] = 0.0  # degenerate: the identity
    q[n // 5 + 9: n // 5 + 13] = 1e-13  # below the norm floor
    q[n // 3: n // 2] = np.round(q[n // 3: n // 2] * 2) / 2  # axis-aligned
    return q


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.int64)


@needs_compiled
def test_compose_gives_the_reference_bits():
    p, r = _quats(50_000, 0), _quats(50_000, 1)
    out = frames.compose(p, r, compiled=True)
    np.testing.assert_array_equal(_bits(out), _bits(frames.compose_ref(p, r)))
    assert out.dtype == np.float64 and out.shape == (50_000, 4)


@needs_compiled
@pytest.mark.parametrize("transpose", [False, True])
def test_rotate_gives_the_reference_bits(transpose):
    q = _quats(50_000, 2)
    v = np.random.default_rng(3).normal(size=(50_000, 3)).astype(np.float32)  # any float dtype in
    out = frames.rotate(q, v, transpose, compiled=True)
    np.testing.assert_array_equal(_bits(out), _bits(frames.rotate_ref(q, v, transpose)))


def test_reference_rotations_are_rotations():
    q, v = _quats(300, 4), np.random.default_rng(5).normal(size=(300, 3))
    there = frames.rotate(q, v, compiled=False)
    np.testing.assert_allclose(np.linalg.norm(there, axis=1), np.linalg.norm(v, axis=1), rtol=1e-12)
    np.testing.assert_allclose(frames.rotate(q, there, transpose=True, compiled=False), v, atol=1e-12)
    c = frames.compose(q, q[::-1], compiled=False)
    np.testing.assert_allclose(frames.rotmat(c), frames.rotmat(q) @ frames.rotmat(q[::-1]), atol=1e-12)


@needs_compiled
def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        frames.rotate(np.zeros((3, 4)), np.zeros((3, 4)), compiled=True)
    with pytest.raises(ValueError, match="rows"):
        frames.compose(np.zeros((3, 4)), np.zeros((2, 4)), compiled=True)
