"""Peak memory and time of PGMS ``compress`` on a deterministic synthetic scene (default: 2M Gaussians, SH3).

No real SH3 scene of this size is available (see the shared scenes' README), so this script
generates one: clustered Gaussians (surface-like blobs around random centres) with random
orientations, scales, opacities and SH coefficients, the same for a given ``--seed``. Numbers
measured on it are synthetic-scene numbers; say so next to them.

The compression runs in a child process; its peak resident set (``ru_maxrss`` from
``wait4``) is the number reported, which counts torch/numpy allocations that tracemalloc
does not see. A watchdog in the parent kills the child if its RSS passes ``--kill-gb``.

    python scripts/bench_memory.py                          # 2M SH3, ratio 20
    python scripts/bench_memory.py --gaussians 500000 --degree 2 --ratio 50
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def synthetic_scene(n: int, degree: int, seed: int = 0):
    """Deterministic clustered synthetic 3DGS scene of ``n`` Gaussians at SH ``degree``."""
    import torch

    from visionmoe.splat.io import GaussianScene

    g = torch.Generator().manual_seed(seed)
    clusters = max(16, n // 4000)
    centres = torch.rand(clusters, 3, generator=g) * 2 - 1
    radius = torch.rand(clusters, generator=g) * 0.15 + 0.05
    cid = torch.randint(0, clusters, (n,), generator=g)
    # points on a noisy sphere shell around each centre: surface-like, as trained scenes are
    d = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=1)
    means = centres[cid] + d * radius[cid, None] * (1 + 0.05 * torch.randn(n, 1, generator=g))
    k = (degree + 1) ** 2 - 1
    base_col = torch.randn(clusters, 3, generator=g) * 0.8
    return GaussianScene(
        means=means.float(),
        quats=torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=1),
        log_scales=torch.randn(n, 3, generator=g) * 0.3 - 5.0,
        opacity_logits=torch.randn(n, generator=g) * 1.5 + 1.0,
        sh_dc=base_col[cid] + 0.2 * torch.randn(n, 3, generator=g),
        sh_rest=torch.randn(n, k, 3, generator=g) * 0.05,
    )


def child(args) -> None:
    import resource

    import torch

    torch.set_num_threads(args.threads)
    from visionmoe.splat.memory import KEEP_FREED_MEMORY_MAX_GAUSSIANS, keep_freed_memory
    from visionmoe.splat import compress, decompress

    if args.gaussians <= KEEP_FREED_MEMORY_MAX_GAUSSIANS:  # as the visionmoe-splat command line does
        keep_freed_memory()

    t = time.perf_counter()
    scene = synthetic_scene(args.gaussians, args.degree, args.seed)
    gen_s = time.perf_counter() - t
    rss_scene = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    # RSS sampled every 50 ms and attributed to the compress stage reported by the progress callback
    state = {"stage": "setup", "peaks": {}, "running": True}

    def progress(stage, done, total):
        state["stage"] = stage

    def sample():
        while state["running"]:
            r = _rss_gb(os.getpid())
            st = state["stage"]
            state["peaks"][st] = max(state["peaks"].get(st, 0.0), r)
            time.sleep(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t = time.perf_counter()
    res = compress(scene, ratio=args.ratio, progress=progress)
    enc_s = time.perf_counter() - t
    state["running"] = False
    t = time.perf_counter()
    dec = decompress(res.data)
    dec_s = time.perf_counter() - t
    print(json.dumps({
        "gaussians": args.gaussians, "sh_degree": args.degree, "ratio_target": args.ratio, "bytes": res.nbytes,
        "ratio": round(res.ratio, 3), "target_met": res.target_met, "generate_s": round(gen_s, 2),
        "encode_s": round(enc_s, 2), "decode_s": round(dec_s, 2), "decoded_gaussians": dec.num_gaussians,
        "peak_rss_after_generation_gb": round(rss_scene, 3),
        "peak_rss_by_stage_gb": {k_: round(v, 2) for k_, v in state["peaks"].items()},
        "timings_s": {k_: round(v, 2) for k_, v in res.timings.items()},
    }), flush=True)


def _rss_gb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaussians", type=int, default=2_000_000)
    ap.add_argument("--degree", type=int, default=3)
    ap.add_argument("--ratio", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-gb", type=float, default=8.0, help="pass/fail line (default 8 GB, the issue's budget)")
    ap.add_argument("--kill-gb", type=float, default=12.0, help="watchdog: kill the child above this RSS")
    ap.add_argument("--out", help="also write the JSON result here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    cmd = [sys.executable, __file__, "--child", "--gaussians", str(args.gaussians), "--degree", str(args.degree),
           "--ratio", str(args.ratio), "--seed", str(args.seed), "--threads", str(args.threads)]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    killed = {"flag": False, "max_seen": 0.0}

    def watch():
        while proc.poll() is None:
            r = _rss_gb(proc.pid)
            killed["max_seen"] = max(killed["max_seen"], r)
            if r > args.kill_gb:
                killed["flag"] = True
                proc.kill()
                return
            time.sleep(0.2)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - t
    import resource

    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
    if killed["flag"]:
        print(f"child killed: RSS passed {args.kill_gb} GB (peak seen {killed['max_seen']:.2f} GB)")
        return 1
    if proc.returncode != 0:
        print(f"child failed with status {proc.returncode}")
        return 1
    result = json.loads(out.strip().splitlines()[-1])
    result.update({"peak_rss_gb": round(peak, 3), "wall_s": round(wall, 1), "budget_gb": args.budget_gb,
                   "within_budget": peak <= args.budget_gb, "scene": "synthetic (scripts/bench_memory.py)"})
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
