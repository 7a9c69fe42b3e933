"""Quaternion frames in float64: rotation matrices, and the relabelling of a child Gaussian's axes
to its parent's frame (the .pgms encoder's parent-frame coding).

A Gaussian is the same for 24 (rotation, scale order) pairs: any proper signed permutation of its
axes. :func:`relabel_to_parent` picks, per row, the pair whose rotation is closest to the
parent's and returns the relative rotation. The loops are in C++ (``csrc/frames/frames_cpu.cpp``,
about 20x faster than numpy's passes over ``[N, 3, 3]`` temporaries); the numpy reference here
(:func:`relabel_to_parent_ref`) computes the same bits, operation for operation (elementwise
float64, no BLAS), and runs where the extension cannot load.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from ._backend import _load, has_cpu_op, use_cpu_op

__all__ = ["unit", "rotmat", "rotmat_to_quat", "quat_mul", "compose", "rotate", "relabel_to_parent",
           "relabel_to_parent_ref", "signed_permutations"]


def signed_permutations(allow_permute: bool) -> np.ndarray:
    """Proper (det +1) signed permutation matrices [P, 3, 3]: 24, or the 4 sign flips if not permuting."""
    mats = []
    perms = itertools.permutations(range(3)) if allow_permute else [(0, 1, 2)]
    for p in perms:
        for signs in itertools.product((1.0, -1.0), repeat=3):
            P = np.zeros((3, 3))
            P[list(p), range(3)] = signs
            if np.linalg.det(P) > 0:
                mats.append(P)
    return np.stack(mats)


_ALL = signed_permutations(True)
_FLIPS = signed_permutations(False)


def unit(q: np.ndarray) -> np.ndarray:
    """Unit quaternions [N, 4] (float64); the identity where the norm is 1e-12 or less."""
    q = np.asarray(q, np.float64)
    n = np.sqrt((q * q).sum(1, keepdims=True))
    return np.where(n > 1e-12, q / np.maximum(n, 1e-12), np.array([1.0, 0.0, 0.0, 0.0]))


def rotmat(q: np.ndarray) -> np.ndarray:
    """wxyz quaternions [N, 4] -> rotation matrices [N, 3, 3] (float64)."""
    w, x, y, z = unit(q).T
    R = np.empty((len(w), 3, 3))  # filled in place: np.stack of nine columns costs 2x the arithmetic
    R[:, 0, 0], R[:, 0, 1], R[:, 0, 2] = 1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)
    R[:, 1, 0], R[:, 1, 1], R[:, 1, 2] = 2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)
    R[:, 2, 0], R[:, 2, 1], R[:, 2, 2] = 2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)
    return R


def rotmat_to_quat(R: np.ndarray) -> np.ndarray:
    """Proper rotation matrices [N, 3, 3] -> wxyz quaternions [N, 4] with w >= 0."""
    m = R.reshape(-1, 9)
    best = np.stack([m[:, 0] + m[:, 4] + m[:, 8], m[:, 0], m[:, 4], m[:, 8]], -1).argmax(-1)
    q = np.empty((len(m), 4))
    for case in range(4):  # only the well-conditioned candidate of each row is evaluated
        rows = np.flatnonzero(best == case)
        if len(rows) == 0:
            continue
        m00, m01, m02, m10, m11, m12, m20, m21, m22 = m[rows].T
        q[rows] = np.stack([
            [1 + m00 + m11 + m22, m21 - m12, m02 - m20, m10 - m01],
            [m21 - m12, 1 + m00 - m11 - m22, m01 + m10, m02 + m20],
            [m02 - m20, m01 + m10, 1 - m00 + m11 - m22, m12 + m21],
            [m10 - m01, m02 + m20, m12 + m21, 1 - m00 - m11 + m22],
        ][case], -1)
    q = unit(q)
    return np.where(q[:, :1] < 0, -q, q)


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product a * b of wxyz quaternions [N, 4] (rotation b, then a)."""
    aw, ax, ay, az = np.asarray(a, np.float64).T
    bw, bx, by, bz = np.asarray(b, np.float64).T
    return np.stack([
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    ], 1)


def compose_ref(parent_quats: np.ndarray, relative_quats: np.ndarray) -> np.ndarray:
    """:func:`compose` in numpy."""
    return unit(quat_mul(unit(parent_quats), unit(relative_quats)))


def rotate_ref(quats: np.ndarray, v: np.ndarray, transpose: bool = False) -> np.ndarray:
    """:func:`rotate` in numpy."""
    R = rotmat(quats)
    if transpose:
        R = R.transpose(0, 2, 1)
    v = np.asarray(v, np.float64)
    out = R[:, :, 0] * v[:, 0, None]  # the sum over k in its order, without a temporary
    out += R[:, :, 1] * v[:, 1, None]
    out += R[:, :, 2] * v[:, 2, None]
    return out


def _rows(a: np.ndarray, cols: int, name: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a, np.float64))
    if t.ndim != 2 or t.shape[1] != cols:
        raise ValueError(f"{name} must be [N, {cols}], got {tuple(t.shape)}")
    return t


def compose(parent_quats: np.ndarray, relative_quats: np.ndarray, compiled: bool | None = None) -> np.ndarray:
    """A child's rotation R_parent R_relative as a unit wxyz quaternion [N, 4] (float64), each
    input normalised first (the identity where its norm is 1e-12 or less). ``compiled``: the C++
    loop (None: when the extension has it); both give the same bits."""
    if not use_cpu_op("compose_quats", compiled):
        return compose_ref(parent_quats, relative_quats)
    p, q = _rows(parent_quats, 4, "parent_quats"), _rows(relative_quats, 4, "relative_quats")
    if len(p) != len(q):
        raise ValueError(f"parent_quats and relative_quats hold {len(p)} and {len(q)} rows")
    return _load()[0].cpu.compose_quats(p, q).numpy()


def rotate(quats: np.ndarray, v: np.ndarray, transpose: bool = False, compiled: bool | None = None) -> np.ndarray:
    """Each row's vector [N, 3] turned by its quaternion's rotation: R v, or R^T v with
    ``transpose`` (world vectors into the quaternion's axes), float64. ``compiled``: as
    :func:`compose`."""
    if not use_cpu_op("rotate_by_quats", compiled):
        return rotate_ref(quats, v, transpose)
    q, x = _rows(quats, 4, "quats"), _rows(v, 3, "vectors")
    if len(q) != len(x):
        raise ValueError(f"quats and vectors hold {len(q)} and {len(x)} rows")
    return _load()[0].cpu.rotate_by_quats(q, x, bool(transpose)).numpy()


def _matmul(A: np.ndarray, B: np.ndarray) -> np.ndarray:  # [N, 3, 3] @ [N, 3, 3], elementwise
    # ((a0 b0 + a1 b1) + a2 b2): the order of a sum over the middle axis, without its [N, 3, 3, 3]
    # temporary (5x faster at 450k rows, same bits)
    out = A[:, :, 0, None] * B[:, None, 0, :]
    out += A[:, :, 1, None] * B[:, None, 1, :]
    out += A[:, :, 2, None] * B[:, None, 2, :]
    return out


def _nonzero_rows(P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each permutation's non-zero row in column i [P, 3] and its sign [P, 3]."""
    rows = np.abs(P).argmax(1)
    return rows, np.take_along_axis(P, rows[:, None, :], 1)[:, 0]


def _relabel_ref(parent_quats: np.ndarray, quats: np.ndarray, allow_permute: bool) -> tuple[np.ndarray, np.ndarray]:
    M = _matmul(rotmat(parent_quats).transpose(0, 2, 1), rotmat(quats))
    P = _ALL if allow_permute else _FLIPS
    rows, signs = _nonzero_rows(P)
    # trace(M P) = sum_i M[i, k_i] s_i, added in i order: a fixed order, so that exact ties (a
    # child turned 45 degrees from its parent) go to the same permutation in C++ (einsum's
    # order over the nine products is numpy's own choice)
    trace = (M[:, 0, rows[:, 0]] * signs[:, 0] + M[:, 1, rows[:, 1]] * signs[:, 1]) + M[:, 2, rows[:, 2]] * signs[:, 2]
    best = trace.argmax(1)
    # new axis i carries the scale of old axis k_i
    return rotmat_to_quat(_matmul(M, P[best])), rows[best]


def relabel_to_parent_ref(parent_quats: np.ndarray, quats: np.ndarray, log_scales: np.ndarray,
                          allow_permute: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """:func:`relabel_to_parent` in numpy."""
    rel, src = _relabel_ref(parent_quats, quats, allow_permute)
    return rel, np.take_along_axis(np.asarray(log_scales), src, 1)


def compiled_available() -> bool:
    """Whether the compiled relabelling is there (the extension loads and has it)."""
    return has_cpu_op("relabel_to_parent")


def relabel_to_parent(parent_quats: np.ndarray, quats: np.ndarray, log_scales: np.ndarray,
                      allow_permute: bool = True, compiled: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A child's rotation relative to its parent and its log-scales in the relabelled axis order.

    The same Gaussian is described by 24 (rotation, scale order) pairs; the one whose rotation
    is closest to the parent's (largest trace of the relative rotation) is chosen, so the
    relative rotation is small. ``allow_permute=False`` keeps the scale order (only sign
    flips), for scales coded by value tables per axis. ``compiled``: the C++ loops (None: when
    the extension has them). -> (relative quats [N, 4] float64, log-scales [N, 3] in
    ``log_scales``' dtype)."""
    if not use_cpu_op("relabel_to_parent", compiled):
        return relabel_to_parent_ref(parent_quats, quats, log_scales, allow_permute)
    pq = torch.from_numpy(np.ascontiguousarray(parent_quats, np.float64))
    q = torch.from_numpy(np.ascontiguousarray(quats, np.float64))
    if pq.ndim != 2 or pq.shape[1] != 4 or q.shape != pq.shape:
        raise ValueError(f"parent_quats and quats must both be [N, 4], got {tuple(pq.shape)} and {tuple(q.shape)}")
    perms = torch.from_numpy(_ALL if allow_permute else _FLIPS)
    rel, src = _load()[0].cpu.relabel_to_parent(pq, q, perms)
    return rel.numpy(), np.take_along_axis(np.asarray(log_scales), src.numpy(), 1)
