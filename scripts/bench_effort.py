"""PGMS's three efforts beside SOG and SPZ on the same scenes, in one run: CPU time and held-out PSNR.

For each scene: splat-transform 3.x writes SPZ and SOG (timed as CPU seconds of the child
process, user + system, and wall); then PGMS at ``--effort`` fast, default and max, each at
20x (``--ratio``) and at SOG's own file size (``compress(size=)``), timed as CPU seconds of this
process (all threads) and wall. Every file is decoded and rendered by visionmoe's renderer on
the same held-out cameras (``heldout_cameras``, never one the encoder renders) against the
original's renders: PSNR and bytes. ``--repeats 3`` encodes each PGMS row three times and keeps
the median times (the bytes are the same every time on the CPU).

    python scripts/bench_effort.py --scenes-dir ../shared/scenes --out out/bench_effort
    python scripts/bench_effort.py --scenes a.ply b.ply --efforts fast,default --repeats 3

Writes results.md (one table) and results.json after every scene. The machine is described in
the table's header line (CPU model, cores, torch threads).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compress import find_splat_transform, render_all, scene_paths  # noqa: E402

from visionmoe.splat import compress, decompress  # noqa: E402
from visionmoe.splat.encoder.compress import reference_ply_bytes  # noqa: E402
from visionmoe.splat.evaluation import check_disjoint, encoder_cameras, heldout_cameras  # noqa: E402
from visionmoe.splat.io import read_ply  # noqa: E402
from visionmoe.splat.metrics import psnr  # noqa: E402


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_peer(cmd: list[str]) -> tuple[float, float]:
    """-> (CPU seconds, wall seconds) of one splat-transform command."""
    c, t = child_cpu(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[-3:])} failed: {(r.stderr or r.stdout).strip()[-300:]}")
    return child_cpu() - c, time.perf_counter() - t


def timed_compress(scene, repeats: int, **kw):
    """-> (result, median CPU seconds, median wall seconds) over ``repeats`` encodes."""
    cpu, wall, res = [], [], None
    for _ in range(repeats):
        c, t = time.process_time(), time.perf_counter()
        res = compress(scene, **kw)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - t)
    return res, statistics.median(cpu), statistics.median(wall)


def machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                 platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    return f"{model}, {os.cpu_count()} cores, torch {torch.__version__} on {torch.get_num_threads()} threads"


def bench_scene(path: Path, tool, args, tmp: Path) -> list[dict]:
    scene = read_ply(path)
    name = path.name.removesuffix(".ply")
    ref_bytes = reference_ply_bytes(scene.num_gaussians, scene.sh_degree)
    cams = heldout_cameras(scene, num_views=args.views, size=args.size)
    for effort in args.efforts.split(","):  # no held-out view is one the encoder renders at any effort
        check_disjoint(cams, encoder_cameras(scene, effort=effort), scene_frame_size(scene))
    ref = render_all(scene, cams)
    rows = []

    def record(method, nbytes, cpu, wall, decoded, **extra):
        row = {"scene": name, "gaussians": scene.num_gaussians, "sh": scene.sh_degree, "method": method,
               "bytes": nbytes, "ratio": ref_bytes / nbytes, "psnr": float(psnr(render_all(decoded, cams), ref)),
               "cpu_s": cpu, "wall_s": wall, **extra}
        rows.append(row)
        print(f"  {method:>26}: {nbytes:>10} B {row['ratio']:6.2f}x  PSNR {row['psnr']:6.2f}  "
              f"CPU {cpu:7.1f}s  wall {wall:6.1f}s", flush=True)

    sog_bytes = None
    if tool:
        sog = ("SOG", [], ".sog") if scene.sh_degree == 0 or scene.num_gaussians <= 20000 else ("SOG (SH0)", ["-H", "0"], ".sog")
        for method, extra, ext in (("SPZ", [], ".spz"), sog):
            enc_file, back = tmp / f"{name}{ext}", tmp / f"{name}.{ext[1:]}.back.ply"
            try:
                cpu, wall = run_peer([*tool, "-w", "-q", "-g", "cpu", str(path), *extra, str(enc_file)])
                run_peer([*tool, "-w", "-q", str(enc_file), str(back)])
            except RuntimeError as exc:
                print(f"  {method}: skipped ({exc})")
                continue
            record(method, enc_file.stat().st_size, cpu, wall, read_ply(back, nonfinite="drop"))
            if ext == ".sog":
                sog_bytes = enc_file.stat().st_size
    for effort in args.efforts.split(","):
        targets = [("20x" if args.ratio == 20 else f"{args.ratio:g}x", {"ratio": args.ratio})]
        if sog_bytes:
            targets.append(("at SOG's size", {"size": sog_bytes}))
        for label, target in targets:
            res, cpu, wall = timed_compress(scene, args.repeats, effort=effort, **target)
            record(f"PGMS {effort} {label}", res.nbytes, cpu, wall, decompress(res.data), effort=effort,
                   target=label, target_bytes=res.target_bytes, stage_s={k: round(v, 2) for k, v in res.timings.items()})
    return rows


def scene_frame_size(scene) -> float:
    from visionmoe.splat.cameras import scene_frame
    return scene_frame(scene).size


def table(rows: list[dict], args) -> str:
    out = [f"{args.views} held-out views at {args.size} px; CPU = user + system seconds of the encode "
           f"(median of {args.repeats} for PGMS); {machine()}", "",
           "| scene | method | bytes | ratio | PSNR (dB) | CPU (s) | wall (s) | CPU / SOG's |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        sog = next((s for s in rows if s["scene"] == r["scene"] and s["method"].startswith("SOG")), None)
        rel = f"{r['cpu_s'] / sog['cpu_s']:.1f}x" if sog else ""
        out.append(f"| {r['scene']} | {r['method']} | {r['bytes']:,} | {r['ratio']:.1f}x | {r['psnr']:.2f} | "
                   f"{r['cpu_s']:.1f} | {r['wall_s']:.1f} | {rel} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenes", nargs="*", help=".ply files (default: every *.ply.xz in --scenes-dir)")
    ap.add_argument("--scenes-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "scenes"))
    ap.add_argument("--efforts", default="fast,default,max")
    ap.add_argument("--ratio", type=float, default=20.0)
    ap.add_argument("--views", type=int, default=16)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--node-dir", default="out/node")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--out", default="out/bench_effort")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tool = None if args.no_peers else find_splat_transform(Path(args.node_dir), True)
    run_scenes(scene_paths(args), out, lambda path, tmp: bench_scene(path, tool, args, tmp),
               lambda rows: table(rows, args))
    return 0


def run_scenes(paths, out: Path, bench, render_table) -> list[dict]:
    """``bench(path, tmp) -> rows`` for each scene, a scratch folder under ``out`` each; results.json
    and results.md (``render_table(rows)``) rewritten after every scene, the table printed at the end."""
    rows = []
    print(machine())
    for path in paths:
        print(path.name, flush=True)
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            rows += bench(path, Path(tmp))
        (out / "results.json").write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))
        (out / "results.md").write_text(render_table(rows))
    print()
    print(render_table(rows))
    return rows


if __name__ == "__main__":
    sys.exit(main())
