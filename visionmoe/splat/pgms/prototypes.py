"""Prototypes (codebook rows) as the format uses them: the nearest prototype of each row
(:func:`assign`) and the scale-rotation feature a shape prototype stores (:func:`shape_features`,
inverted by :func:`shape_from_features` when a decoder rebuilds the shapes).

PGMS clusters different attributes at different pyramid levels: the view-dependent SH bands
of fine-level primitives (appearance prototypes) and the scale-rotation shape of merged,
coarse-level primitives (scale-rotation prototypes); the encoder trains both codebooks with
:func:`visionmoe.splat.encoder.kmeans.build_codebook`. Nearest-prototype search uses faiss
(``IndexFlatL2``) when faiss-cpu is installed (5-20x faster than the shared ``nearest_center``
op at these low dimensions, D = 9..45, on CPU) and the shared op otherwise; both are exact.
"""

from __future__ import annotations

import torch

from ...ops.routing import nearest_center as _nearest_center_op

__all__ = ["nearest_center", "assign", "shape_features", "shape_from_features"]


def _faiss():
    try:
        import faiss  # optional (the ``bench`` extra): exact L2 search, fast at low D
    except Exception:  # pragma: no cover - depends on the environment
        return None
    return faiss


# faiss ranks by |x|^2 + |c|^2 - 2 x.c from a BLAS product whose rounding depends on how many
# threads split it: near-ties and exact ties (duplicate rows) then resolve differently (playbot
# at 20x wrote other bytes with 1 thread than with 2). A fixed count makes the bytes independent
# of the machine's cores and of the caller's torch threads (searching fixed blocks of rows on one
# thread each was as exact but 10% slower on playbot at 20x).
_FAISS_THREADS = 2


def nearest_center(x: torch.Tensor, centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index [N] (int64) of the nearest centre of each row and its squared distance [N] (exact)."""
    faiss = _faiss() if x.device.type == "cpu" else None
    if faiss is None or x.shape[0] == 0:
        return _nearest_center_op(x, centers)
    # the calling thread's OpenMP setting, which torch's own ops share: restored after the search
    # (left at 2, a caller's later torch reductions split differently)
    caller_threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(_FAISS_THREADS)
    try:
        xs = x.detach().float().contiguous().numpy()
        index = faiss.IndexFlatL2(xs.shape[1])
        index.add(centers.detach().float().contiguous().numpy())
        d, i = index.search(xs, 1)
    finally:
        faiss.omp_set_num_threads(caller_threads)
    return torch.from_numpy(i[:, 0].astype("int64")), torch.from_numpy(d[:, 0]).clamp_min(0)


def assign(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """Index [N] of the nearest prototype of each row."""
    if x.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64)
    return nearest_center(x.float(), codebook.float())[0]


def shape_features(log_scales: torch.Tensor, quats: torch.Tensor) -> torch.Tensor:
    """Scale-rotation feature [N, 9]: log-scales sorted descending (3) and the matching
    rotation's first two columns (6), sign-canonicalised (a Gaussian is symmetric under
    axis flips, so +-column are the same shape)."""
    from .._math import quat_to_rotmat

    order = torch.argsort(log_scales, dim=1, descending=True)
    ls = torch.gather(log_scales, 1, order)
    R = quat_to_rotmat(quats)
    cols = torch.gather(R, 2, order[:, None, :].expand(-1, 3, -1))  # columns in scale order
    c1, c2 = cols[:, :, 0], cols[:, :, 1]
    c1 = c1 * torch.where(c1[:, :1] < 0, -1.0, 1.0)  # canonical sign
    c2 = c2 * torch.where(c2[:, :1] < 0, -1.0, 1.0)
    return torch.cat([ls, c1, c2], dim=1)


def shape_from_features(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`shape_features` (re-orthonormalised): -> (log_scales [N, 3], quats [N, 4])."""
    from .._math import rotmat_to_quat

    ls = f[:, :3]
    c1 = torch.nn.functional.normalize(f[:, 3:6], dim=1)
    c2 = f[:, 6:9] - (f[:, 6:9] * c1).sum(1, keepdim=True) * c1
    c2 = torch.nn.functional.normalize(c2 + 1e-9 * torch.roll(c1, 1, dims=1), dim=1)
    c3 = torch.linalg.cross(c1, c2, dim=1)
    R = torch.stack([c1, c2, c3], dim=2)
    return ls, rotmat_to_quat(R)
