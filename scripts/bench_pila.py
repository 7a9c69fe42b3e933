#!/usr/bin/env python
"""PILA adapter cost against the Wan2.1-T2V-1.3B transformer (the named baseline).

1. Parameters: the adapter (default config, text classifier on 4096-dim UMT5 embeddings)
   vs WanTransformer3DModel built from the real Wan2.1-T2V-1.3B config on the meta device.
2. FLOPs per denoising call at 480x832, 81 frames (latent 16x21x60x104), counted by
   torch.utils.flop_counter.FlopCounterMode (matmuls, convolutions, attention; elementwise
   ops are not counted, for either model). The transformer is counted on the meta device;
   the adapter runs for real on the CPU at the full shape. With CFG the transformer runs
   twice per step and the adapter once, so the per-step ratio is half the per-call one.
3. Wall time at a CPU-feasible shape: one transformer call (real 1.3B architecture,
   random weights) vs one adapter call, same latents.
Goals: parameters <= 3% and FLOPs <= 3% of the transformer's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

WAN21_T2V_13B = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=12,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=8960,
    num_layers=30,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    image_dim=None,
    added_kv_proj_dim=None,
    rope_max_seq_len=1024,
)


# Wan2.2-T2V-A14B: two transformers of this config (high- and low-noise experts), same VAE and text encoder
WAN22_T2V_A14B = {**WAN21_T2V_13B, "num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40}


def latent_shape(frames, height, width):
    return (1, 16, (frames - 1) // 4 + 1, height // 8, width // 8)


def count_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def n_params(m) -> int:
    return sum(p.numel() for p in m.parameters())


def main(argv=None):
    p = argparse.ArgumentParser(description="PILA adapter parameters / FLOPs / wall time vs Wan2.1-T2V-1.3B")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--text-len", type=int, default=512)
    p.add_argument("--cpu-frames", type=int, default=9)
    p.add_argument("--cpu-height", type=int, default=128)
    p.add_argument("--cpu-width", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-wall", action="store_true", help="skip the wall-time part (needs ~6 GB RAM)")
    a = p.parse_args(argv)

    from diffusers import WanTransformer3DModel

    from visionmoe.video import PILAAdapter

    torch.manual_seed(0)
    adapter = PILAAdapter(text_dim=4096).eval()
    with torch.device("meta"):
        wan = WanTransformer3DModel(**WAN21_T2V_13B).eval()
    pa, pw = n_params(adapter), n_params(wan)
    print("baseline: Wan2.1-T2V-1.3B transformer (real config, meta device)")
    print(f"parameters   adapter {pa / 1e6:8.3f} M   transformer {pw / 1e6:9.1f} M   ratio {100 * pa / pw:.3f} %  (goal <= 3 %)")
    with torch.device("meta"):
        p14 = 2 * n_params(WanTransformer3DModel(**WAN22_T2V_A14B))
    print(f"  (the same adapter on Wan2.2-T2V-A14B, 2 x {p14 / 2e9:.1f} B transformer parameters: {100 * pa / p14:.4f} %)")

    shape = latent_shape(a.frames, a.height, a.width)
    print(f"FLOPs per call at {a.frames}x{a.height}x{a.width} (latent {list(shape[1:])}):")
    with torch.no_grad():
        fw = count_flops(
            lambda: wan(
                hidden_states=torch.empty(shape, device="meta"),
                timestep=torch.zeros(1, device="meta"),
                encoder_hidden_states=torch.empty(1, a.text_len, 4096, device="meta"),
                return_dict=False,
            )
        )
        g = torch.Generator().manual_seed(0)
        x = torch.randn(shape, generator=g)
        v = torch.randn(shape, generator=g)
        text = torch.randn(1, a.text_len, 4096, generator=g)
        t0 = time.perf_counter()
        fa = count_flops(lambda: adapter(x, v, torch.tensor([0.5]), text, compute_residuals=False))
        t_full = time.perf_counter() - t0
    print(f"  adapter {fa / 1e12:8.3f} TFLOP   transformer {fw / 1e12:9.2f} TFLOP   ratio {100 * fa / fw:.3f} %  (goal <= 3 %)")
    print(f"  per denoising step with CFG (2 transformer calls, 1 adapter call): {100 * fa / (2 * fw):.3f} %")
    print(f"  adapter wall time at this shape on CPU: {t_full:.2f} s")

    if a.skip_wall:
        return 0
    shape = latent_shape(a.cpu_frames, a.cpu_height, a.cpu_width)
    # random weights without paying for 1.4 B default initialisations: allocate, fill N(0, 0.02),
    # and take the (deterministic) buffers, e.g. the RoPE tables, from a one-layer twin
    wan = WanTransformer3DModel(**WAN21_T2V_13B).to_empty(device="cpu").eval()
    twin = dict(WanTransformer3DModel(**{**WAN21_T2V_13B, "num_layers": 1, "ffn_dim": 8}).named_buffers())
    with torch.no_grad():
        for prm in wan.parameters():
            prm.normal_(0, 0.02)
        for name, buf in wan.named_buffers():
            if name not in twin:
                raise RuntimeError(f"no reference value for buffer {name}")
            buf.copy_(twin[name])
        g = torch.Generator().manual_seed(0)
        x = torch.randn(shape, generator=g)
        text = torch.randn(1, a.text_len, 4096, generator=g)
        ts = torch.tensor([500.0])

        def once(fn):
            t0 = time.perf_counter()
            out = fn()
            return time.perf_counter() - t0, out

        run_wan = lambda: wan(hidden_states=x, timestep=ts, encoder_hidden_states=text, return_dict=False)[0]  # noqa: E731
        _, v = once(run_wan)  # warm-up
        if not bool(torch.isfinite(v).all()):
            raise RuntimeError("the random-weight transformer produced non-finite velocities")
        run_adapter = lambda: adapter(x, v, torch.tensor([0.5]), text, compute_residuals=False)  # noqa: E731
        once(run_adapter)
        # interleaved, so that load from other processes hits both alike; medians
        tws, tas = [], []
        for _ in range(a.repeats):
            tws.append(once(run_wan)[0])
            tas.append(once(run_adapter)[0])
        tw, ta = sorted(tws)[len(tws) // 2], sorted(tas)[len(tas) // 2]
    print(
        f"wall time per call at {a.cpu_frames}x{a.cpu_height}x{a.cpu_width} (latent {list(shape[1:])}), "
        f"{torch.get_num_threads()} CPU threads, median of {a.repeats} interleaved runs:"
    )
    print(f"  adapter {1e3 * ta:8.1f} ms   transformer {1e3 * tw:9.1f} ms   ratio {100 * ta / tw:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
