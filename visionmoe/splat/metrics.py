"""Image fidelity metrics for render-vs-render comparisons: PSNR and SSIM.

Images are [..., H, W, 3] (channels last, as the renderer returns them) with values in [0, 1]
(clamped). Both return the mean over the leading (view) dimensions of per-image scores.
SSIM is Wang et al. 2004: 11x11 Gaussian window, sigma 1.5, K1 = 0.01, K2 = 0.03, per channel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["psnr", "ssim", "mse"]


def _prep(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if a.shape != b.shape:
        raise ValueError(f"images must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dim() < 3 or a.shape[-1] not in (1, 3):
        raise ValueError(f"images must be [..., H, W, C] with C in (1, 3), got {tuple(a.shape)}")
    a = a.detach().double().clamp(0, 1).reshape(-1, *a.shape[-3:])
    b = b.detach().double().clamp(0, 1).reshape(-1, *b.shape[-3:])
    return a, b


def mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-image mean squared error [B]."""
    a, b = _prep(a, b)
    return (a - b).pow(2).mean((1, 2, 3))


def psnr(a: torch.Tensor, b: torch.Tensor, *, max_db: float = 100.0) -> torch.Tensor:
    """Mean over images of the per-image PSNR in dB (identical images give ``max_db``)."""
    m = mse(a, b)
    per = torch.where(m > 0, -10 * torch.log10(m.clamp_min(1e-30)), torch.full_like(m, max_db)).clamp(max=max_db)
    return per.mean().float()


def _gauss_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    return g


def ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean SSIM over images and channels (valid-window means, as in Wang et al. 2004)."""
    a, b = _prep(a, b)
    x = a.permute(0, 3, 1, 2)
    y = b.permute(0, 3, 1, 2)
    C = x.shape[1]
    g = _gauss_window()
    if x.shape[-1] < g.numel() or x.shape[-2] < g.numel():
        raise ValueError(f"SSIM needs images of at least {g.numel()}x{g.numel()} pixels, got {tuple(x.shape[-2:])}")
    wx = g.view(1, 1, 1, -1).repeat(C, 1, 1, 1)
    wy = g.view(1, 1, -1, 1).repeat(C, 1, 1, 1)

    def blur(t):
        return F.conv2d(F.conv2d(t, wx, groups=C), wy, groups=C)

    mu_x, mu_y = blur(x), blur(y)
    sxx = blur(x * x) - mu_x**2
    syy = blur(y * y) - mu_y**2
    sxy = blur(x * y) - mu_x * mu_y
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mu_x * mu_y + c1) * (2 * sxy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sxx + syy + c2))
    return s.mean().float()


def psnr_from_mse(m: float) -> float:
    return float("inf") if m <= 0 else -10 * math.log10(m)
