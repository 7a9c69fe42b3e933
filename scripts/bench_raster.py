"""Benchmark the CPU Gaussian rasteriser (visionmoe.ops.rasterize).

Measures medians of forward and forward+backward on:
  * playbot_lod0 (500k Gaussians, SH degree 2) at 1024x768, the first orbit view;
  * a synthetic 2M-Gaussian SH-degree-3 scene (random, seeded) at 1024x768;
at 1 and 2 threads, and the ratio against the pure-PyTorch reference
(visionmoe.ops._torch_ref.rasterize) at a size the reference can handle.

Usage:
  python scripts/bench_raster.py --playbot PATH/playbot_lod0.ply[.xz] [--repeats 5] [--skip-2m]

The load average of the machine is printed before and after: other processes on the same
cores make every number slower.
"""

from __future__ import annotations

import argparse
import lzma
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from visionmoe.ops import _torch_ref as ref
from visionmoe.ops import build_info, rasterize
from visionmoe.splat import GaussianScene, orbit_cameras, read_ply


def load_scene(path: Path, tmp: Path) -> GaussianScene:
    if path.suffix == ".xz":
        plain = tmp / path.stem
        with lzma.open(path) as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        path = plain
    return read_ply(path)


def synthetic_scene(n: int, degree: int, seed: int = 0) -> GaussianScene:
    g = torch.Generator().manual_seed(seed)
    K = (degree + 1) ** 2
    means = torch.randn(n, 3, generator=g) * torch.tensor([1.0, 0.6, 1.0])
    return GaussianScene(
        means=means,
        quats=torch.randn(n, 4, generator=g),
        log_scales=torch.randn(n, 3, generator=g) * 0.4 - 4.6,
        opacity_logits=torch.randn(n, generator=g) * 1.5,
        sh_dc=torch.rand(n, 3, generator=g) * 2 - 1,
        sh_rest=torch.randn(n, K - 1, 3, generator=g) * 0.1,
    )


def median_time(fn, repeats: int, clock=time.perf_counter) -> float:
    fn()  # warm-up (allocations, OpenMP pool)
    times = []
    for _ in range(repeats):
        t = clock()
        fn()
        times.append(clock() - t)
    return statistics.median(times)


def bench_scene(name, scene, width, height, repeats, threads):
    cams = orbit_cameras(scene, num_views=1, width=width, height=height)
    params = [scene.means, scene.quats, scene.log_scales, scene.opacity_logits, scene.sh.contiguous()]

    def fwd():
        with torch.no_grad():
            return rasterize(*params, cams.viewmats, cams.Ks, width, height, sh_degree=scene.sh_degree)

    leaves = [p.detach().clone().requires_grad_() for p in params]

    def fwd_bwd():
        for p in leaves:
            p.grad = None
        out = rasterize(*leaves, cams.viewmats, cams.Ks, width, height, sh_degree=scene.sh_degree)
        (out.colors.sum() + out.alpha.sum()).backward()

    rows = []
    for t in threads:
        torch.set_num_threads(t)
        f = median_time(fwd, repeats)
        fb = median_time(fwd_bwd, max(3, repeats // 2))
        rows.append((name, t, f, fb))
        extra = ""
        if t == 1:  # CPU time of this process: less sensitive to other processes on the cores
            fc = median_time(fwd, repeats, time.process_time)
            fbc = median_time(fwd_bwd, max(3, repeats // 2), time.process_time)
            extra = f" (CPU time {fc:.3f} / {fbc:.3f})"
        print(f"| {name} | {scene.num_gaussians:,} | {width}x{height} | {t} | {f:.3f} | {fb:.3f} |{extra}", flush=True)
    return rows


def bench_reference(repeats: int):
    scene = synthetic_scene(2000, 3, seed=1)
    scene.means[:] = scene.means * 0.5
    cams = orbit_cameras(scene, num_views=1, width=64, height=48)
    params = [scene.means, scene.quats, scene.log_scales, scene.opacity_logits, scene.sh.contiguous()]
    args = (cams.viewmats, cams.Ks, 64, 48)

    def ours():
        with torch.no_grad():
            return rasterize(*params, *args, sh_degree=3)

    def theirs():
        with torch.no_grad():
            return ref.rasterize(*params, *args, sh_degree=3)

    diff = float((ours().colors - theirs().colors).abs().max())
    a, b = median_time(ours, repeats), median_time(theirs, max(3, repeats // 2))
    return a, b, diff


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--playbot", type=Path, help="playbot_lod0.ply or .ply.xz (from the shared scenes folder)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--skip-2m", action="store_true", help="skip the synthetic 2M-Gaussian SH3 scene")
    args = parser.parse_args()

    info = build_info()
    print(f"visionmoe._C: openmp={info.get('openmp')} threads={info.get('openmp_threads')} torch={torch.__version__}")
    print(f"load average before: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    threads = [1, 2] if (os.cpu_count() or 1) >= 2 else [1]
    print("\n| scene | Gaussians | image | threads | forward s (median) | forward+backward s (median) |")
    print("|---|---|---|---|---|---|")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.playbot:
            scene = load_scene(args.playbot, Path(tmp))
            rows += bench_scene("playbot_lod0 (SH2)", scene, args.width, args.height, args.repeats, threads)
            del scene
    if not args.skip_2m:
        scene = synthetic_scene(2_000_000, 3)
        rows += bench_scene("synthetic 2M (SH3)", scene, args.width, args.height, max(3, args.repeats // 2), threads)
        del scene
    torch.set_num_threads(max(threads))
    ours, theirs, diff = bench_reference(args.repeats)
    print(f"\nreference (pure PyTorch, dense) vs kernel, 2000 Gaussians SH3 at 64x48, {max(threads)} threads:")
    print(f"  kernel {ours * 1e3:.2f} ms, reference {theirs * 1e3:.1f} ms: kernel is {theirs / ours:.0f}x faster "
          f"(max colour difference {diff:.1e})")
    by_name = {}
    for name, t, f, fb in rows:
        by_name.setdefault(name, {})[t] = (f, fb)
    for name, d in by_name.items():
        if 1 in d and 2 in d:
            print(f"  {name}: 2-thread speed-up forward {d[1][0] / d[2][0]:.2f}x, "
                  f"forward+backward {d[1][1] / d[2][1]:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
