#!/usr/bin/env python
"""PGMS demo: compress the default scene in assets/, decode it, and write a side-by-side PNG.

    python scripts/demo_splat.py [--scene assets/fruit_drops_minimal.ply] [--ratio 20] [--out out/demo_splat.png]

Top row: the original scene from three orbit views; bottom row: the decoded .pgms from the
same views; the title gives size, ratio against the float32 .ply, PSNR/SSIM and timings.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

from visionmoe.splat import compress, decompress, read_ply  # noqa: E402
from visionmoe.splat.cameras import orbit_cameras  # noqa: E402
from visionmoe.splat.metrics import psnr, ssim  # noqa: E402
from visionmoe.splat.render import render  # noqa: E402


def splat_demo(scene_path: Path, ratio: float, out: Path, size: int = 320) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scene = read_ply(scene_path)
    t = time.perf_counter()
    res = compress(scene, ratio=ratio)
    enc_s = time.perf_counter() - t
    pgms = out.with_suffix(".pgms")
    out.parent.mkdir(parents=True, exist_ok=True)
    res.save(pgms)
    t = time.perf_counter()
    dec = decompress(pgms)
    dec_s = time.perf_counter() - t
    cams = orbit_cameras(scene, num_views=3, width=size, height=size)
    with torch.no_grad():
        a = render(scene, cams).colors.clamp(0, 1)
        b = render(dec, cams).colors.clamp(0, 1)
    figs = {"bytes": res.nbytes, "ratio": res.ratio, "psnr": float(psnr(b, a)), "ssim": float(ssim(b, a)),
            "encode_s": enc_s, "decode_s": dec_s, "gaussians": scene.num_gaussians, "primitives": dec.num_gaussians}
    fig, axes = plt.subplots(2, 3, figsize=(9, 6.4))
    for i in range(3):
        axes[0, i].imshow(a[i].numpy())
        axes[1, i].imshow(b[i].numpy())
        for r in (0, 1):
            axes[r, i].set_xticks([])
            axes[r, i].set_yticks([])
    axes[0, 0].set_ylabel(f"original\n{scene.num_gaussians} Gaussians, {res.reference_bytes / 1e6:.2f} MB .ply")
    axes[1, 0].set_ylabel(f"PGMS decoded\n{dec.num_gaussians} primitives, {res.nbytes / 1e3:.1f} kB")
    fig.suptitle(f"{scene_path.name}: PGMS {res.ratio:.1f}x ({res.nbytes:,} bytes); PSNR {figs['psnr']:.2f} dB, "
                 f"SSIM {figs['ssim']:.4f}\nencode {enc_s:.1f} s, decode {dec_s:.2f} s (CPU), "
                 f"render vs render on 3 orbit views", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return figs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scene", default=str(REPO / "assets" / "fruit_drops_minimal.ply"))
    ap.add_argument("--ratio", type=float, default=20.0)
    ap.add_argument("--out", default=str(REPO / "out" / "demo_splat.png"))
    args = ap.parse_args()
    figs = splat_demo(Path(args.scene), args.ratio, Path(args.out))
    print(f"pgms: {figs['gaussians']} Gaussians -> {figs['bytes']} bytes ({figs['ratio']:.1f}x), "
          f"PSNR {figs['psnr']:.2f} dB, SSIM {figs['ssim']:.4f}, encode {figs['encode_s']:.1f} s, "
          f"decode {figs['decode_s']:.2f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
