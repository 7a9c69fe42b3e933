#!/usr/bin/env python
"""Benchmark the CUDA kernels of visionmoe._C against named baselines, in one run on one GPU.

1. rasterize, forward and forward+backward, 1024x768, one view: playbot_lod0 (if given) and a
   synthetic 2M-Gaussian SH3 scene. Baseline: our C++ kernel on all the machine's CPU cores.
   Then the pure-PyTorch dense reference on the same GPU, at a size it can hold.
2. MoE route + dispatch + combine, forward + backward. Baseline: the pure-PyTorch path on the
   same GPU (visionmoe.ops._torch_ref).
3. nearest_center. Baseline: torch.cdist + argmin on the same GPU.
4. Optionally (--pgms SCENE ...), PGMS encodes of each scene on the CPU (the baseline, every
   core) and on the GPU, same options, in one run: encode wall and CPU seconds (medians over
   --pgms-repeats), bytes, whether the two files are byte-identical, held-out PSNR of each
   (visionmoe.splat.evaluation.heldout_cameras, scored on the GPU) and the time per stage.
   ``--encode-only`` skips 1-3.

Every CUDA result is also compared with its CPU twin (max abs difference), so a run doubles
as a correctness check on real sizes. Medians over repeats, torch.cuda.synchronize() around
each timed call. Usage: python scripts/bench_cuda.py [--playbot PATH.ply[.xz]] [--repeats 10] [--pgms SCENE.ply[.xz] ...]
       python scripts/bench_cuda.py --encode-only --pgms ../shared/scenes/guitar.ply.xz \
           ../shared/scenes/academic_tarot_cards.ply.xz --pgms-effort default --pgms-repeats 3
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

from visionmoe import ops
from visionmoe.ops import _torch_ref as ref
from visionmoe.splat import GaussianScene, orbit_cameras, read_ply

CUDA = torch.device("cuda")


def median_time(fn, repeats: int, warmup: int = 2, device: torch.device = CUDA) -> float:
    """Median wall time of ``fn``; on a GPU, synchronised before and after each call."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def synthetic_scene(n: int, degree: int, seed: int = 0) -> GaussianScene:
    g = torch.Generator().manual_seed(seed)
    K = (degree + 1) ** 2
    return GaussianScene(
        means=torch.randn(n, 3, generator=g) * torch.tensor([1.0, 0.6, 1.0]),
        quats=torch.randn(n, 4, generator=g),
        log_scales=torch.randn(n, 3, generator=g) * 0.4 - 4.6,
        opacity_logits=torch.randn(n, generator=g) * 1.5,
        sh_dc=torch.rand(n, 3, generator=g) * 2 - 1,
        sh_rest=torch.randn(n, K - 1, 3, generator=g) * 0.1,
    )


def load_scene(path: Path) -> GaussianScene:
    if path.suffix != ".xz":
        return read_ply(path)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / path.stem
        with lzma.open(path) as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return read_ply(plain)


def raster_timings(scene: GaussianScene, device: torch.device, width: int, height: int, repeats: int):
    cams = orbit_cameras(scene, num_views=1, width=width, height=height)
    params = [t.to(device) for t in (scene.means, scene.quats, scene.log_scales, scene.opacity_logits, scene.sh)]
    views = (cams.viewmats.to(device), cams.Ks.to(device))
    leaves = [p.detach().clone().requires_grad_() for p in params]

    def fwd():
        with torch.no_grad():
            return ops.rasterize(*params, *views, width, height, sh_degree=scene.sh_degree)

    def fwd_bwd():
        for p in leaves:
            p.grad = None
        out = ops.rasterize(*leaves, *views, width, height, sh_degree=scene.sh_degree)
        (out.colors.sum() + out.alpha.sum()).backward()
        return [p.grad for p in leaves]

    f = median_time(fwd, repeats, device=device)
    fb = median_time(fwd_bwd, max(3, repeats // 2), device=device)
    return f, fb, fwd().colors.cpu(), [g.cpu() for g in fwd_bwd()]


def bench_raster(name: str, scene: GaussianScene, repeats: int) -> None:
    gpu_f, gpu_fb, gpu_img, gpu_grads = raster_timings(scene, CUDA, 1024, 768, repeats)
    cpu_f, cpu_fb, cpu_img, cpu_grads = raster_timings(scene, torch.device("cpu"), 1024, 768, max(3, repeats // 3))
    img_diff = float((gpu_img - cpu_img).abs().max())
    grad_rel = max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(gpu_grads, cpu_grads))
    print(f"| {name} | {scene.num_gaussians:,} | forward | {cpu_f * 1e3:.1f} | {gpu_f * 1e3:.2f} | {cpu_f / gpu_f:.0f}x |")
    print(f"| {name} | {scene.num_gaussians:,} | forward+backward | {cpu_fb * 1e3:.1f} | {gpu_fb * 1e3:.2f} "
          f"| {cpu_fb / gpu_fb:.0f}x |")
    print(f"  CUDA vs CPU: max colour difference {img_diff:.1e}, largest relative gradient difference {grad_rel:.1e}")


def bench_raster_reference(repeats: int) -> None:
    scene = synthetic_scene(20_000, 3, seed=1)
    scene.means[:] = scene.means * 0.5
    cams = orbit_cameras(scene, num_views=1, width=128, height=96)
    params = [t.to(CUDA) for t in (scene.means, scene.quats, scene.log_scales, scene.opacity_logits, scene.sh)]
    args = (cams.viewmats.to(CUDA), cams.Ks.to(CUDA), 128, 96)

    def ours():
        with torch.no_grad():
            return ops.rasterize(*params, *args, sh_degree=3)

    def theirs():
        with torch.no_grad():
            return ref.rasterize(*params, *args, sh_degree=3)

    diff = float((ours().colors - theirs().colors).abs().max())
    a, b = median_time(ours, repeats), median_time(theirs, max(3, repeats // 2))
    print(f"\nrasterize, 20,000 Gaussians SH3 at 128x96 on the GPU: kernel {a * 1e3:.2f} ms, pure-PyTorch dense "
          f"reference {b * 1e3:.1f} ms: {b / a:.0f}x faster (max colour difference {diff:.1e})")


def bench_moe(repeats: int, tokens: int = 262_144, features: int = 64, experts: int = 8, k: int = 2) -> None:
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(tokens, features, generator=gen).to(CUDA)
    router = (torch.randn(features, experts, generator=gen) / features**0.5).to(CUDA)
    scales = (torch.rand(experts, 1, generator=gen) + 0.5).to(CUDA)
    cot = torch.randn(tokens, features, generator=gen).to(CUDA)

    def step(impl):
        x = x0.clone().requires_grad_(True)
        route = impl.topk_route(x @ router, k)
        buf, plan = impl.dispatch(x, route.indices, experts)
        y = torch.cat([c * scales[e] for e, c in enumerate(buf.split(plan.counts.tolist()))])
        out = impl.combine(y, route.weights, None, plan=plan)
        loss = (out * cot).sum() + 0.01 * route.aux_loss + 0.001 * route.z_loss
        loss.backward()
        return out.detach(), x.grad

    (o1, g1), (o2, g2) = step(ops), step(ref)
    ours, theirs = median_time(lambda: step(ops), repeats), median_time(lambda: step(ref), repeats)
    print(f"\n| MoE route + dispatch + combine, fwd + bwd, {tokens:,} tokens x {features}, {experts} experts, k={k} "
          f"| pure PyTorch on the GPU {theirs * 1e3:.2f} ms | {ours * 1e3:.2f} ms | {theirs / ours:.2f}x |")
    print(f"  max difference: output {float((o1 - o2).abs().max()):.1e}, input gradient {float((g1 - g2).abs().max()):.1e}")


def bench_nearest(repeats: int, points: int = 4_000_000, centers: int = 4096, dim: int = 45) -> None:
    gen = torch.Generator().manual_seed(0)
    p, c = torch.randn(points, dim, generator=gen).to(CUDA), torch.randn(centers, dim, generator=gen).to(CUDA)

    def cdist_path():
        return torch.cat([torch.cdist(block, c).argmin(dim=1) for block in p.split(262_144)])

    ours, theirs = median_time(lambda: ops.nearest_center(p, c), repeats), median_time(cdist_path, repeats)
    idx_ours, idx_ref = ops.nearest_center(p, c), cdist_path()
    ours_idx = idx_ours[0] if isinstance(idx_ours, tuple) else idx_ours
    agree = float((ours_idx.long() == idx_ref.long()).float().mean())
    print(f"| nearest_center, {points:,} x {dim} points vs {centers:,} centres | torch.cdist + argmin on the GPU "
          f"{theirs * 1e3:.1f} ms | {ours * 1e3:.1f} ms | {theirs / ours:.2f}x |")
    print(f"  same nearest centre as cdist for {agree * 100:.3f}% of points (ties and float rounding differ)")


def _encode_once(scene: GaussianScene, device: str, ratio: float, effort: str):
    """One encode on ``device``: -> (result, wall s, CPU s of this process)."""
    from visionmoe.splat import compress

    if device == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    res = compress(scene, ratio=ratio, device=device, effort=effort)
    if device == "cuda":
        torch.cuda.synchronize()
    return res, time.perf_counter() - wall, time.process_time() - cpu


def bench_pgms(paths: list[Path], ratio: float, effort: str, repeats: int) -> None:
    """PGMS encode on the CPU (every core) and on the GPU, same options: the renders run on the
    device, the codec on the CPU either way. Baseline: the CPU encode of the same run."""
    from visionmoe.splat import decompress
    from visionmoe.splat.evaluation import heldout_cameras
    from visionmoe.splat.metrics import psnr
    from visionmoe.splat.render import render

    print(f"\nPGMS {ratio:g}x, effort {effort}, medians of {repeats}; held-out PSNR on 16 views of 512 px\n"
          "\n| scene | Gaussians | device | encode wall (s) | encode CPU (s) | bytes | held-out PSNR (dB) "
          "| CPU / CUDA wall | seconds per stage |\n|---|---:|---|---:|---:|---:|---:|---:|---|")
    for path in paths:
        scene = load_scene(path)
        cams = heldout_cameras(scene, num_views=16, size=512)
        with torch.no_grad():
            ref = render(scene.to(CUDA), cams).colors
        rows = {}
        for device in ("cpu", "cuda"):
            runs = [_encode_once(scene, device, ratio, effort) for _ in range(repeats)]
            wall = statistics.median(r[1] for r in runs)
            cpu = statistics.median(r[2] for r in runs)
            res = runs[-1][0]
            with torch.no_grad():
                got = float(psnr(render(decompress(res.data).to(CUDA), cams).colors, ref))
            rows[device] = (res, wall, cpu, got)
        for device, (res, wall, cpu, got) in rows.items():
            speed = f"{rows['cpu'][1] / wall:.1f}x" if device == "cuda" else "1.0x"
            stages = ", ".join(f"{k} {v:.1f}" for k, v in res.timings.items() if k != "total")
            print(f"| {path.name} | {scene.num_gaussians:,} | {device} | {wall:.1f} | {cpu:.1f} | {res.nbytes:,} | "
                  f"{got:.2f} | {speed} | {stages} |", flush=True)
        same = rows["cpu"][0].data == rows["cuda"][0].data
        print(f"  {path.name}: CUDA file {'byte-identical to' if same else 'differs from'} the CPU file "
              f"({rows['cuda'][3] - rows['cpu'][3]:+.3f} dB held-out)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--playbot", type=Path, help="playbot_lod0.ply or .ply.xz (from the shared scenes folder)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--skip-2m", action="store_true")
    parser.add_argument("--pgms", type=Path, nargs="*", default=[], help="scenes (.ply[.xz]) to encode on the GPU")
    parser.add_argument("--pgms-ratio", type=float, default=20.0)
    parser.add_argument("--pgms-effort", choices=("fast", "default", "max"), default="default")
    parser.add_argument("--pgms-repeats", type=int, default=1, help="encodes per device and scene (median)")
    parser.add_argument("--encode-only", action="store_true", help="only the PGMS encodes (--pgms)")
    args = parser.parse_args()
    if not torch.cuda.is_available() or not ops.build_info().get("cuda"):
        raise SystemExit("bench_cuda.py needs a CUDA GPU and a CUDA build of visionmoe._C")
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"GPU: {torch.cuda.get_device_name()}, CPU baseline: {os.cpu_count()} cores, {torch.get_num_threads()} "
          f"threads, torch {torch.__version__}\nbuild: {ops.build_info()}")
    if args.encode_only:
        if not args.pgms:
            raise SystemExit("--encode-only needs scenes: --pgms SCENE.ply[.xz] ...")
        bench_pgms(args.pgms, args.pgms_ratio, args.pgms_effort, max(1, args.pgms_repeats))
        return
    print("\n| scene | Gaussians | pass | CPU kernel (ms) | CUDA kernel (ms) | speed-up |\n|---|---|---|---|---|---|")
    if args.playbot:
        bench_raster("playbot_lod0 (SH2)", load_scene(args.playbot), args.repeats)
    if not args.skip_2m:
        bench_raster("synthetic 2M (SH3)", synthetic_scene(2_000_000, 3), args.repeats)
    bench_raster_reference(args.repeats)
    print("\n| benchmark | baseline | CUDA kernel | speed-up |\n|---|---|---|---|")
    bench_moe(args.repeats)
    bench_nearest(args.repeats)
    if args.pgms:
        bench_pgms(args.pgms, args.pgms_ratio, args.pgms_effort, max(1, args.pgms_repeats))


if __name__ == "__main__":
    main()
