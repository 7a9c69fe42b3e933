"""Anchored field estimation: from (x_t, sigma, v) to the physical attribute bank.

1. Clean-latent estimate of flow matching: ``x0 = x_t - sigma * v`` (Wan's rectified flow,
   ``x_t = (1 - sigma) x0 + sigma * noise`` and ``v = noise - x0``).
2. Kinematic anchor: observable motion between consecutive latent frames of ``x0``, a
   Lucas-Kanade least-squares flow on the channel-normalised latent (structure tensor summed
   over channels and a local window), its temporal derivative (acceleration), and an
   occupancy/density anchor (local latent contrast against the frame mean).
3. Tokens: 2x2 (``patch_size``) spatial patches of the 16-channel latent, one token per
   latent frame and patch, with features [x0 patch, v patch, anchors], a sigma FiLM and a
   depthwise 3-D convolution over the token grid for local spatio-temporal context.
4. The bank: one feature vector per named slot (taxonomy.SLOTS) and token. Anchored slots
   (velocity, acceleration, density) read the anchors; the less observable slots (pressure,
   temperature, strain, material) are built from the anchored slots' features. Each slot
   also has an explicit proxy field on the token grid, read by the residuals: anchored
   proxies are the anchor plus a zero-initialised learned correction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .taxonomy import ANCHORED_SLOTS, SLOTS

#: Channels of each slot's proxy field.
PROXY_CHANNELS: dict[str, int] = {
    "velocity": 2, "acceleration": 2, "density": 1, "pressure": 1, "temperature": 1, "strain": 3, "material": 4,
}


@dataclass
class AttributeBank:
    """The physical attribute bank of one denoising call.

    ``slots[t, s]`` is slot ``SLOTS[s]``'s feature vector for token t; tokens are ordered
    (batch, frame, row, column) over ``grid = (B, F, h, w)``. ``proxies[name]`` is a
    ``[B, c, F, h, w]`` field (names of ``SLOTS`` plus ``"latent"``: x0 pooled to the token
    grid, and ``"occupancy"``: a [0, 1] weight for residuals).
    """

    slots: torch.Tensor  # [T, S, d]
    proxies: dict[str, torch.Tensor]
    grid: tuple[int, int, int, int]  # (B, F, h, w)
    hidden: torch.Tensor  # [T, hidden] token context features
    x0: torch.Tensor  # [B, C, F, H, W] clean-latent estimate
    anchors: dict[str, torch.Tensor]  # observable anchors on the token grid (velocity, acceleration, density)

    def slot(self, name: str) -> torch.Tensor:
        return self.slots[:, SLOTS.index(name)]


def clean_latent(latents: torch.Tensor, velocity: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """x0 = x_t - sigma v, sigma broadcast from [B] (or a scalar)."""
    sigma = torch.as_tensor(sigma, dtype=latents.dtype, device=latents.device)
    if sigma.dim() == 1:
        sigma = sigma.view(-1, *([1] * (latents.dim() - 1)))
    return latents - sigma * velocity


def _box(x: torch.Tensor, k: int) -> torch.Tensor:
    # [N, C, H, W] box filter (mean) with replicate padding
    if k <= 1:
        return x
    return F.avg_pool2d(F.pad(x, (k // 2,) * 4, mode="replicate"), k, stride=1)


def latent_flow(x0: torch.Tensor, window: int = 3, reg: float = 1e-2, max_disp: float = 4.0) -> torch.Tensor:
    """Lucas-Kanade displacement between consecutive latent frames: [B, 2, F, H, W] (x, y).

    Frame f holds the motion from frame f to f+1 (the last frame repeats the previous one;
    a single frame has zero motion). Units: latent cells per latent frame.
    """
    B, C, Fr, H, W = x0.shape
    if Fr < 2:
        return x0.new_zeros(B, 2, Fr, H, W)
    # normalise each channel per sample so no channel dominates the structure tensor
    mu = x0.mean(dim=(2, 3, 4), keepdim=True)
    sd = x0.std(dim=(2, 3, 4), keepdim=True).clamp_min(1e-6)
    z = (x0 - mu) / sd
    a, b = z[:, :, :-1], z[:, :, 1:]  # [B, C, F-1, H, W]
    m = 0.5 * (a + b)
    it = b - a
    mp = F.pad(m.flatten(0, 2).unsqueeze(1).reshape(-1, 1, H, W), (1, 1, 1, 1), mode="replicate")
    ix = 0.5 * (mp[..., 1:-1, 2:] - mp[..., 1:-1, :-2])
    iy = 0.5 * (mp[..., 2:, 1:-1] - mp[..., :-2, 1:-1])
    ix = ix.reshape(B, C, Fr - 1, H, W)
    iy = iy.reshape(B, C, Fr - 1, H, W)

    def win(t):  # sum over channels, box over the window -> [B, F-1, H, W]
        s = t.sum(1)
        return _box(s.reshape(-1, 1, H, W), window).reshape(B, Fr - 1, H, W)

    axx, ayy, axy = win(ix * ix), win(iy * iy), win(ix * iy)
    bx, by = -win(ix * it), -win(iy * it)
    lam = reg * C
    axx, ayy = axx + lam, ayy + lam
    det = axx * ayy - axy * axy
    u = (ayy * bx - axy * by) / det
    w = (axx * by - axy * bx) / det
    flow = torch.stack([u, w], dim=1).clamp(-max_disp, max_disp)  # [B, 2, F-1, H, W]
    return torch.cat([flow, flow[:, :, -1:]], dim=2)


def temporal_derivative(f: torch.Tensor) -> torch.Tensor:
    """d/dt along frames (dim 2): central inside, one-sided at the ends; zero for F = 1."""
    Fr = f.shape[2]
    if Fr < 2:
        return torch.zeros_like(f)
    if Fr == 2:
        d = f[:, :, 1:] - f[:, :, :1]
        return torch.cat([d, d], dim=2)
    mid = 0.5 * (f[:, :, 2:] - f[:, :, :-2])
    return torch.cat([f[:, :, 1:2] - f[:, :, :1], mid, f[:, :, -1:] - f[:, :, -2:-1]], dim=2)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """[B, C, F, H, W] (H, W multiples of p) -> tokens [B*F*h*w, C*p*p]."""
    B, C, Fr, H, W = x.shape
    x = x.reshape(B, C, Fr, H // p, p, W // p, p)
    return x.permute(0, 2, 3, 5, 1, 4, 6).reshape(B * Fr * (H // p) * (W // p), C * p * p)


def unpatchify(tokens: torch.Tensor, grid: tuple[int, int, int, int], C: int, p: int) -> torch.Tensor:
    """Inverse of :func:`patchify`: [B*F*h*w, C*p*p] -> [B, C, F, h*p, w*p]."""
    B, Fr, h, w = grid
    x = tokens.reshape(B, Fr, h, w, C, p, p).permute(0, 4, 1, 2, 5, 3, 6)
    return x.reshape(B, C, Fr, h * p, w * p)


def to_grid(tokens: torch.Tensor, grid: tuple[int, int, int, int]) -> torch.Tensor:
    """[T, c] -> [B, c, F, h, w]."""
    B, Fr, h, w = grid
    return tokens.reshape(B, Fr, h, w, -1).permute(0, 4, 1, 2, 3)


def from_grid(field: torch.Tensor) -> torch.Tensor:
    """[B, c, F, h, w] -> [T, c]."""
    return field.permute(0, 2, 3, 4, 1).reshape(-1, field.shape[1])


def sigma_embedding(sigma: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of sigma * 1000 (the flow-matching timestep scale): [B] -> [B, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=sigma.device, dtype=torch.float32) / half)
    args = sigma.float()[:, None] * 1000.0 * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _mlp(i: int, h: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, h), nn.GELU(), nn.Linear(h, o))


class FieldEstimator(nn.Module):
    """Anchored field estimation (see the module docstring)."""

    NUM_ANCHORS = 5  # flow (2), acceleration (2), density (1)

    def __init__(
        self,
        latent_channels: int = 16,
        patch_size: int = 2,
        hidden_dim: int = 256,
        slot_dim: int = 32,
        sigma_dim: int = 64,
        flow_window: int = 3,
        flow_reg: float = 1e-2,
        use_anchor: bool = True,
        context_blocks: int = 1,
        clip_context: bool = False,
    ):
        super().__init__()
        if context_blocks < 1:
            raise ValueError(f"context_blocks must be >= 1, got {context_blocks}")
        self.use_anchor = use_anchor  # False: ablation without the kinematic anchor (anchors read as zeros)
        self.latent_channels, self.patch_size = latent_channels, patch_size
        self.flow_window, self.flow_reg = flow_window, flow_reg
        self.sigma_dim, self.slot_dim = sigma_dim, slot_dim
        p2 = patch_size * patch_size
        in_dim = 2 * latent_channels * p2 + self.NUM_ANCHORS * p2
        self.embed = nn.Linear(in_dim, hidden_dim)
        self.sigma_film = nn.Sequential(nn.Linear(sigma_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, 2 * hidden_dim))
        self.norm = nn.LayerNorm(hidden_dim, elementwise_affine=False)
        self.context = nn.Conv3d(hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim)
        self.mix = _mlp(hidden_dim, hidden_dim, hidden_dim)
        # more context (capacity): each block widens the receptive field by one token each way;
        # the clip token carries what every token of the clip sees (a law relates all frames)
        self.more_context = nn.ModuleList(
            nn.ModuleDict({"conv": nn.Conv3d(hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim),
                           "mlp": _mlp(hidden_dim, hidden_dim, hidden_dim)}) for _ in range(context_blocks - 1))
        self.clip_context = nn.Linear(hidden_dim, hidden_dim) if clip_context else None
        n_anch = len(ANCHORED_SLOTS)
        self.anchored_heads = nn.Linear(hidden_dim, n_anch * slot_dim)
        derived = [s for s in SLOTS if s not in ANCHORED_SLOTS]
        self.derived_heads = _mlp(n_anch * slot_dim + hidden_dim, hidden_dim, len(derived) * slot_dim)
        self.proxy_heads = ProxyHeads(slot_dim)

    def anchors(self, x0: torch.Tensor) -> dict[str, torch.Tensor]:
        """Observable anchors at latent resolution: flow, acceleration, density ([B, c, F, H, W])."""
        flow = latent_flow(x0.float(), self.flow_window, self.flow_reg).to(x0.dtype)
        accel = temporal_derivative(flow)
        dev = x0 - x0.mean(dim=(3, 4), keepdim=True)
        density = dev.pow(2).mean(1, keepdim=True).sqrt()
        return {"velocity": flow, "acceleration": accel, "density": density}

    def forward(self, latents, velocity, sigma) -> AttributeBank:
        p = self.patch_size
        B, C, Fr, H, W = latents.shape
        x0 = clean_latent(latents, velocity, sigma)
        anchors = self.anchors(x0)
        if not self.use_anchor:
            anchors = {k: torch.zeros_like(v) for k, v in anchors.items()}
        anchor_map = torch.cat([anchors["velocity"], anchors["acceleration"], anchors["density"]], dim=1)
        h, w = H // p, W // p
        grid = (B, Fr, h, w)
        feats = torch.cat([patchify(x0, p), patchify(velocity, p), patchify(anchor_map, p)], dim=1)
        hid = self.embed(feats)
        scale, shift = self.sigma_film(sigma_embedding(sigma, self.sigma_dim).to(hid.dtype)).chunk(2, dim=-1)
        per_tok = Fr * h * w
        hid = self.norm(hid) * (1 + scale.repeat_interleave(per_tok, 0)) + shift.repeat_interleave(per_tok, 0)
        hid = hid + from_grid(self.context(to_grid(hid, grid)))
        hid = hid + self.mix(F.gelu(hid))
        for block in self.more_context:
            hid = hid + from_grid(block["conv"](to_grid(hid, grid)))
            hid = hid + block["mlp"](F.gelu(hid))
        if self.clip_context is not None:
            clip = hid.view(B, per_tok, -1).mean(1)
            hid = hid + self.clip_context(clip).repeat_interleave(per_tok, 0)
        anch = self.anchored_heads(hid)
        derived = self.derived_heads(torch.cat([anch, hid], dim=-1))
        order = list(ANCHORED_SLOTS) + [s for s in SLOTS if s not in ANCHORED_SLOTS]
        parts = dict(zip(order, torch.cat([anch, derived], -1).split(self.slot_dim, dim=-1)))
        slots = torch.stack([parts[s] for s in SLOTS], dim=1)  # [T, S, d]

        pool = lambda f: F.avg_pool3d(f, (1, p, p))  # noqa: E731  latent -> token grid
        anchor_tok = {k: pool(v) / (p if k in ("velocity", "acceleration") else 1) for k, v in anchors.items()}
        proxies = self.proxy_heads(slots, grid, anchor_tok)
        proxies["latent"] = pool(x0)
        dens = anchor_tok["density"] if self.use_anchor else pool(self.anchors(x0)["density"])
        proxies["occupancy"] = (dens / dens.flatten(1).amax(1).clamp_min(1e-6)[:, None, None, None, None]).detach()
        return AttributeBank(slots, proxies, grid, hid, x0, anchor_tok)


class ProxyHeads(nn.Module):
    """Slot features -> explicit proxy fields. Anchored proxies = anchor + zero-init correction."""

    def __init__(self, slot_dim: int):
        super().__init__()
        self.heads = nn.ModuleDict({s: nn.Linear(slot_dim, PROXY_CHANNELS[s]) for s in SLOTS})
        for s in ANCHORED_SLOTS:
            nn.init.zeros_(self.heads[s].weight)
            nn.init.zeros_(self.heads[s].bias)

    def forward(self, slots: torch.Tensor, grid, anchors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for i, s in enumerate(SLOTS):
            f = to_grid(self.heads[s](slots[:, i]), grid)
            if s == "density":
                f = F.softplus(anchors[s] + f)
            elif s in anchors:
                f = anchors[s] + f
            elif s == "material":
                f = f.softmax(dim=1)
            out[s] = f
        return out
