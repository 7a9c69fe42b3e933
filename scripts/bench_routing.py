#!/usr/bin/env python
"""Benchmark the routing ops against the pure-PyTorch path and faiss-cpu, in one run.

1. MoE routing, forward + backward: topk_route -> dispatch -> expert -> combine -> loss,
   ours (visionmoe._C) vs the pure-PyTorch reference (visionmoe.ops._torch_ref).
2. nearest_center: ours (BLAS GEMM + fused arg-min) vs faiss IndexFlatL2 vs torch.cdist.

Prints medians over repeats and ratios against the named baseline, plus the machine.
Usage: python scripts/bench_routing.py [--tokens 65536 --features 64 --experts 8 --k 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from visionmoe import ops
from visionmoe.ops import _torch_ref as ref


def median_time(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, load average {load:.2f} at start")


def bench_moe(args) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(0)
    T, D, E, k = args.tokens, args.features, args.experts, args.k
    x0 = torch.randn(T, D, generator=gen)
    router = torch.randn(D, E, generator=gen) / D**0.5
    scales = torch.rand(E, 1, generator=gen) + 0.5
    cot = torch.randn(T, D, generator=gen)

    def step(impl):
        x = x0.clone().requires_grad_(True)
        logits = x @ router
        route = impl.topk_route(logits, k)
        buf, plan = impl.dispatch(x, route.indices, E)
        # A per-expert elementwise "expert" keeps the compute identical in both paths.
        y = torch.cat([c * scales[e] for e, c in enumerate(buf.split(plan.counts.tolist()))])
        out = impl.combine(y, route.weights, None, plan=plan)
        loss = (out * cot).sum() + 0.01 * route.aux_loss + 0.001 * route.z_loss
        loss.backward()

    return median_time(lambda: step(ops), args.repeats), median_time(lambda: step(ref), args.repeats)


def bench_nearest(args) -> dict[str, float]:
    gen = torch.Generator().manual_seed(0)
    points = torch.randn(args.points, args.dim, generator=gen)
    centers = torch.randn(args.centers, args.dim, generator=gen)
    results = {"visionmoe nearest_center": median_time(lambda: ops.nearest_center(points, centers), args.nc_repeats, 1)}

    def cdist_path():
        for block in points.split(8192):
            torch.cdist(block, centers).argmin(dim=1)

    results["torch.cdist + argmin"] = median_time(cdist_path, args.nc_repeats, 1)
    try:
        import faiss

        faiss.omp_set_num_threads(torch.get_num_threads())
        index = faiss.IndexFlatL2(args.dim)
        index.add(centers.numpy())
        pts = points.numpy()
        results["faiss IndexFlatL2"] = median_time(lambda: index.search(pts, 1), args.nc_repeats, 1)
    except ImportError:
        print("faiss-cpu not installed: skipping the faiss baseline (pip install faiss-cpu)")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--centers", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=45)
    parser.add_argument("--nc-repeats", type=int, default=3)
    parser.add_argument("--skip-nearest", action="store_true")
    args = parser.parse_args()

    print(f"machine: {machine()}")
    print(f"build: {ops.build_info()}")
    ours, torch_path = bench_moe(args)
    print(f"\n## MoE route + dispatch + combine, forward + backward ({args.tokens} tokens x {args.features} "
          f"features, {args.experts} experts, k={args.k}; median of {args.repeats})")
    print("| path | time (ms) | speed-up vs pure PyTorch |\n|---|---|---|")
    print(f"| pure PyTorch (_torch_ref) | {torch_path * 1e3:.1f} | 1.00x |")
    print(f"| visionmoe._C | {ours * 1e3:.1f} | {torch_path / ours:.2f}x |")

    if not args.skip_nearest:
        results = bench_nearest(args)
        base_name = "faiss IndexFlatL2" if "faiss IndexFlatL2" in results else "torch.cdist + argmin"
        base = results[base_name]
        print(f"\n## nearest_center ({args.points} x {args.dim} points, {args.centers} centres; median of {args.nc_repeats})")
        print(f"| path | time (s) | time / {base_name} |\n|---|---|---|")
        for name, seconds in results.items():
            print(f"| {name} | {seconds:.2f} | {seconds / base:.2f}x |")


if __name__ == "__main__":
    main()
