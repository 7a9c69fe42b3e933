"""Small geometry helpers shared by the PGMS modules (rotations, covariances, SH colour)."""

from __future__ import annotations

import torch

SH_C0 = 0.28209479177387814  # Y_0^0; every real orthonormal SH basis function has mean square 1/(4 pi) = SH_C0^2


def normalize_quats(q: torch.Tensor) -> torch.Tensor:  # [N, 4] -> [N, 4], w >= 0
    n = q.norm(dim=-1, keepdim=True)
    q = torch.where(n > 1e-12, q / n.clamp_min(1e-12), torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=q.dtype))
    return torch.where(q[:, :1] < 0, -q, q)


def quat_to_rotmat(q: torch.Tensor) -> torch.Tensor:  # [N, 4] wxyz -> [N, 3, 3]
    w, x, y, z = normalize_quats(q).unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], dim=-1).reshape(-1, 3, 3)


def rotmat_to_quat(R: torch.Tensor) -> torch.Tensor:  # [N, 3, 3] (proper rotations) -> [N, 4] wxyz, w >= 0
    m = R.reshape(-1, 9)
    m00, m01, m02, m10, m11, m12, m20, m21, m22 = m.unbind(-1)
    cand = torch.stack([
        torch.stack([1 + m00 + m11 + m22, m21 - m12, m02 - m20, m10 - m01], -1),
        torch.stack([m21 - m12, 1 + m00 - m11 - m22, m01 + m10, m02 + m20], -1),
        torch.stack([m02 - m20, m01 + m10, 1 - m00 + m11 - m22, m12 + m21], -1),
        torch.stack([m10 - m01, m02 + m20, m12 + m21, 1 - m00 - m11 + m22], -1),
    ], dim=1)  # [N, 4 candidates, 4]
    diag = torch.stack([m00 + m11 + m22, m00, m11, m22], -1)
    best = diag.argmax(-1)
    q = cand[torch.arange(R.shape[0]), best]
    return normalize_quats(q)


def covariance(quats: torch.Tensor, log_scales: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """[N, 3, 3] covariances, in ``dtype`` (default the inputs'). float64 keeps a flat Gaussian's
    thin axis: in float32 an axis more than ~4000x thinner than the widest is rounding noise."""
    if dtype is not None:
        quats, log_scales = quats.to(dtype), log_scales.to(dtype)
    R = quat_to_rotmat(quats)
    s2 = torch.exp(2 * log_scales)
    return (R * s2.unsqueeze(1)) @ R.transpose(1, 2)


# Thinnest axis kept by decompose_covariance, in log-scale below the widest (a ratio of 9e6):
# below it float64 eigenvalues are rounding noise. Relative, not absolute, so that a scene in
# other units decomposes alike (an absolute floor of -12 turned a merged node's thin axis of
# e^-14 into e^-12 in a 1e-3x copy of fruit: its distortion went from 2e-7 to 9.8e3).
MIN_LOG_SCALE_BELOW_WIDEST = 16.0


def decompose_covariance(cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cov [N, 3, 3] -> (quats [N, 4], log_scales [N, 3]) with cov = R diag(s^2) R^T."""
    cov = 0.5 * (cov + cov.transpose(1, 2)).double()
    evals, evecs = torch.linalg.eigh(cov)
    det = torch.linalg.det(evecs)
    evecs = evecs * torch.where(det < 0, -1.0, 1.0).to(evecs.dtype)[:, None, None]  # proper rotation
    log_scales = 0.5 * torch.log(evals.clamp_min(1e-300))
    floor = log_scales.max(1, keepdim=True).values - MIN_LOG_SCALE_BELOW_WIDEST
    return rotmat_to_quat(evecs).float(), torch.maximum(log_scales, floor).float()


def dc_to_rgb(sh_dc: torch.Tensor) -> torch.Tensor:
    return SH_C0 * sh_dc + 0.5
