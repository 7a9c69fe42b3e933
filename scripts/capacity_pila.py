#!/usr/bin/env python
"""Capacity check of the PILA adapter: can it learn a known target correction?

The target: the velocity correction that turns an unlawful clip into the lawful clip of the same
prompt. Each pair shares the ball (colour, radius), its start and its horizontal motion; the
lawful clip falls under gravity, the unlawful one under a wrong law (gravity of the wrong sign or
a fraction of it: a ball that drifts up, floats or falls too slowly). Both are encoded by the
toy world's VAE (normalised Wan latents ``x0_bad``, ``x0_good``). At a noise level ``sigma`` the
adapter sees ``x_t = (1 - sigma) x0_bad + sigma n`` and ``v = n - x0_bad`` (the flow-matching
velocity) and must output ``dv = (x0_bad - x0_good) / sigma``, the correction that makes the
scheduler's clean estimate ``x_t - sigma (v + dv)`` the lawful clip.

    python scripts/capacity_pila.py --pairs 256 --heldout 64 --steps 800 --cache out/capacity_pairs.pt

Reports explained variance (``1 - SSE / SST`` of the target over held-out pairs, never trained
on) per arm, with the parameter counts, next to the trivial baselines measured in the same run:
zero (EV 0 by construction: the untrained adapter) and the per-position mean of the training
targets. Prints one JSON line per arm and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

ARMS = {  # the toy world's adapter size (MODEL_CARD) and a plain adapter of about the same size
    "pila": {"hidden_dim": 64, "slot_dim": 16, "expert_hidden": 64, "patch_size": 2},
    "plain": {"structure": "plain", "hidden_dim": 96, "plain_blocks": 4, "patch_size": 2},
    # PILA with the plain adapter's receptive field (4 context blocks) and a clip-level token
    "pila_context": {"hidden_dim": 64, "slot_dim": 16, "expert_hidden": 64, "patch_size": 2, "context_blocks": 4,
                     "clip_context": True},
}


def pair_clips(seed: int, frames: int = 17, size: int = 64):
    """(lawful, unlawful) uint8 clips of one prompt: same ball, start and horizontal motion."""
    from visionmoe.video.data.scenes import _Canvas, _render_balls, _pick_color

    rng = np.random.default_rng(seed)
    canvas = _Canvas(size, size, rng)
    r = rng.uniform(3.5, 5.5)
    color = _pick_color(rng)
    t = np.arange(frames, dtype=np.float64)
    y0, vy0 = rng.uniform(r + 8, 0.45 * size), rng.uniform(-0.6, 0.4)
    x = rng.uniform(r + 8, size - r - 8) + rng.uniform(-0.4, 0.4) * t
    floor = size - r - 6
    g = rng.uniform(0.08, 0.16)
    g_bad = g * rng.choice([rng.uniform(-1.0, -0.3), rng.uniform(0.0, 0.35)])  # up, or too weak
    out = []
    for acc in (g, g_bad):
        y = np.clip(y0 + vy0 * t + 0.5 * acc * t * t, r + 1, floor)
        out.append(_render_balls(canvas, np.stack([x, y], 1)[:, None], [r], [color], size - 4.0))
    return out[0], out[1]


@torch.no_grad()
def encode_pairs(vae, seeds, batch: int = 8):
    from visionmoe.video.hooks._common import wan_latent_stats

    mean, std = wan_latent_stats(vae)
    good, bad = [], []
    for i in range(0, len(seeds), batch):
        pairs = [pair_clips(s) for s in seeds[i:i + batch]]
        for k, dst in ((0, good), (1, bad)):
            video = torch.from_numpy(np.stack([p[k] for p in pairs]).astype(np.float32) / 127.5 - 1)
            dst.append((vae.encode(video.permute(0, 4, 1, 2, 3)).latent_dist.mean - mean) / std)
    return torch.cat(good), torch.cat(bad)


def sample(good, bad, idx, gen, sigma_min):
    """Inputs and target of pairs ``idx`` at random noise levels (see the module docstring)."""
    sigma = sigma_min + (1 - sigma_min) * torch.rand(len(idx), generator=gen)
    s = sigma.view(-1, 1, 1, 1, 1)
    noise = torch.randn(bad[idx].shape, generator=gen)
    x_t = (1 - s) * bad[idx] + s * noise
    return x_t, noise - bad[idx], sigma, (bad[idx] - good[idx]) / s


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    return float(1 - (pred - target).pow(2).sum() / (target - target.mean()).pow(2).sum())


def train_arm(name, good, bad, train_idx, held, a):
    from visionmoe.video.pila.adapter import PILAAdapter

    torch.manual_seed(a.seed)
    ad = PILAAdapter(latent_channels=good.shape[1], **ARMS[name]).train()
    opt = torch.optim.AdamW(ad.parameters(), lr=a.lr)
    gen = torch.Generator().manual_seed(a.seed + 1)
    t0 = time.time()
    for step in range(a.steps):
        idx = train_idx[torch.randint(0, len(train_idx), (a.batch,), generator=gen)]
        x_t, v, sigma, target = sample(good, bad, idx, gen, a.sigma_min)
        out = ad(x_t, v, sigma, compute_residuals=False)
        loss = (out.dv - target).pow(2).mean() / target.pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ad.parameters(), 1.0)
        opt.step()
        if step % 250 == 0:
            print(f"{name} step {step}: relative MSE {loss.item():.4f}", flush=True)
    ad.eval()
    with torch.no_grad():
        x_t, v, sigma, target = held
        pred = torch.cat([ad(x_t[i:i + 16], v[i:i + 16], sigma[i:i + 16], compute_residuals=False).dv
                          for i in range(0, len(x_t), 16)])
    return dict(arm=name, params=sum(p.numel() for p in ad.parameters()), steps=a.steps, batch=a.batch,
                heldout_explained_variance=round(explained_variance(pred, target), 4),
                wall_min=round((time.time() - t0) / 60, 2))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=320, help="training pairs (simulation seeds 0..pairs-1)")
    p.add_argument("--heldout", type=int, default=64, help="held-out pairs (seeds 1000000+)")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--sigma-min", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=["pila", "plain", "pila_context"])
    p.add_argument("--cache", default=None, help="a .pt file for the encoded pairs (written once, then read)")
    a = p.parse_args(argv)
    for k in ("pairs", "heldout", "steps", "batch", "threads"):
        if getattr(a, k) < 1:
            p.error(f"--{k} must be >= 1")
    if not (0.0 < a.sigma_min < 1.0):
        p.error(f"--sigma-min must lie in (0, 1), got {a.sigma_min}")
    from visionmoe.video.models.toy_world import load_toy_world

    torch.set_num_threads(a.threads)
    t0 = time.time()
    seeds = list(range(a.pairs)) + list(range(1_000_000, 1_000_000 + a.heldout))
    if a.cache and os.path.isfile(a.cache):
        cached = torch.load(a.cache)
        if cached["seeds"] != seeds:
            p.error(f"{a.cache} holds other pairs (--pairs/--heldout differ); remove it or pass another --cache")
        good, bad = cached["good"], cached["bad"]
    else:
        good, bad = encode_pairs(load_toy_world().vae, seeds)
        if a.cache:
            torch.save(dict(seeds=seeds, good=good, bad=bad), a.cache)
    print(f"{a.pairs + a.heldout} pairs ready ({time.time() - t0:.0f} s)", flush=True)
    train_idx, held_idx = torch.arange(a.pairs), torch.arange(a.pairs, a.pairs + a.heldout)
    held = sample(good, bad, held_idx, torch.Generator().manual_seed(12345), a.sigma_min)
    # the per-position mean of the training targets (a fixed correction, blind to the clip)
    tr = sample(good, bad, train_idx, torch.Generator().manual_seed(54321), a.sigma_min)[3]
    rows = [dict(arm="zero (untrained adapter)", params=0, heldout_explained_variance=round(explained_variance(
        torch.zeros_like(held[3]), held[3]), 4)),
            dict(arm="mean training target", params=0, heldout_explained_variance=round(explained_variance(
                tr.mean(0, keepdim=True).expand_as(held[3]), held[3]), 4))]
    for name in a.arms:
        rows.append(train_arm(name, good, bad, train_idx, held, a))
        print(json.dumps(rows[-1]), flush=True)
    print("\n| arm | parameters | held-out explained variance |\n|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['params']} | {100 * r['heldout_explained_variance']:.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
