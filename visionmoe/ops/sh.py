"""The real spherical-harmonics basis of 3DGS (degrees 0-3), in pure PyTorch: what the kernels
evaluate for view-dependent colour, and what rotates SH coefficients with a scene
(``visionmoe.splat.similarity``). The tests' reference (``_torch_ref``) uses it too."""

from __future__ import annotations

import torch

__all__ = ["sh_basis"]

_SH_C0 = 0.28209479177387814
_SH_C1 = 0.4886025119029199
_SH_C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792, 0.5462742152960396)
_SH_C3 = (
    -0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
    -0.4570457994644658, 1.445305721320277, -0.5900435899266435,
)


def sh_basis(degree: int, dirs: torch.Tensor) -> torch.Tensor:
    """Real SH basis [..., (degree+1)^2] at unit directions [..., 3] (3DGS convention)."""
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, _SH_C0)]
    if degree >= 1:
        out += [-_SH_C1 * y, _SH_C1 * z, -_SH_C1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        out += [
            _SH_C2[0] * x * y, _SH_C2[1] * y * z, _SH_C2[2] * (2 * zz - xx - yy), _SH_C2[3] * x * z,
            _SH_C2[4] * (xx - yy),
        ]
    if degree >= 3:
        out += [
            _SH_C3[0] * y * (3 * xx - yy), _SH_C3[1] * x * y * z, _SH_C3[2] * y * (4 * zz - xx - yy),
            _SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy), _SH_C3[4] * x * (4 * zz - xx - yy),
            _SH_C3[5] * z * (xx - yy), _SH_C3[6] * x * (xx - 3 * yy),
        ]
    return torch.stack(out, dim=-1)
