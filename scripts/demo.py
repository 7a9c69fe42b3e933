#!/usr/bin/env python
"""`make demo`: the main job on embedded defaults, offline.

1. what the compiled extension contains, and a label-prior-masked MoE routing example;
2. PGMS: compress the scene in assets/, decode it, write a side-by-side PNG (out/demo_splat.png);
3. PILA: generate physics clips with the toy world model shipped in the package
   (visionmoe/video/models/assets/toy_world) with and without its trained PILA adapter (and the scale-0
   control), write both mp4 files, the strip image and the physics-metric table (out/demo_video/).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from visionmoe import ops

REPO = Path(__file__).resolve().parents[1]


def routing_example() -> None:
    torch.manual_seed(0)
    tokens, features, experts = 4096, 32, 6
    x = torch.randn(tokens, features)
    router = torch.nn.Linear(features, experts)
    layers = [torch.nn.Linear(features, features) for _ in range(experts)]
    prior = torch.tensor([True, True, False, True, False, True])  # e.g. categories allowed by a prompt
    with torch.no_grad():
        route = ops.topk_route(router(x), k=2, prior_mask=prior)
        out = ops.moe_apply(x, route.weights, route.indices, layers)
    counts = ops.routing_plan(route.indices, experts).counts.tolist()
    print(f"routing: {tokens} tokens -> experts {counts} (masked experts 2 and 4 get none)")
    print(f"routing: load-balance loss {route.aux_loss:.3f} (1.0 = balanced), z-loss {route.z_loss:.3f}, "
          f"output {tuple(out.shape)}")


def main() -> None:
    info = ops.build_info()
    print("visionmoe._C build:", ", ".join(f"{k}={v}" for k, v in info.items()))
    routing_example()
    from demo_splat import splat_demo  # PGMS: compress the default scene in assets/, decode, compare

    out = REPO / "out" / "demo_splat.png"
    f = splat_demo(REPO / "assets" / "fruit_drops_minimal.ply", 20.0, out)
    print(f"pgms: {f['gaussians']} Gaussians -> {f['bytes']} bytes ({f['ratio']:.1f}x vs float32 .ply), "
          f"PSNR {f['psnr']:.2f} dB, SSIM {f['ssim']:.4f}, encode {f['encode_s']:.1f} s, decode {f['decode_s']:.2f} s; "
          f"side-by-side {out}")
    video_demo(REPO / "out" / "demo_video")


def video_demo(out: Path) -> None:
    script = Path(__file__).with_name("eval_toy_world.py")
    cmd = [sys.executable, str(script), "--num", "4", "--threads", "2", "--out", str(out)]
    subprocess.run(cmd, check=True)
    print(f"pila: base and PILA videos, strip and table in {out}")


if __name__ == "__main__":
    main()
