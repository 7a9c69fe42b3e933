"""PGMS encoders of several commits side by side: the same scenes, targets and held-out views.

Each encoder is a checkout of this repository with its extension built in place (``NAME=DIR``;
``HEAD`` is this tree). Every encode runs in its own process with ``PYTHONPATH=DIR``: it calls
that checkout's ``visionmoe.splat.compress`` (``effort=`` only where the checkout has it) and its
own ``decompress``, and hands back the bytes, the CPU seconds of ``compress`` (all threads) and the
decoded Gaussians. This process renders every decoded scene with today's renderer on held-out
cameras (never one the encoder renders) against the original: PSNR, bytes, fill of the target.

Targets: ``--ratios`` (default 5) against the float32 .ply, and SOG's own file size (splat-transform
3.x, as ``bench_effort.py`` writes it; ``--no-peers`` skips it). SOG's k-means is seeded afresh on
every run, so its size moves by a few tenths of a percent: ``--sog-from results.json`` reuses an
earlier run's SOG sizes (and rows), so encoders benchmarked in two runs meet the same targets.

    git worktree add /tmp/wt_old c151941 && (cd /tmp/wt_old && VISIONMOE_WITH_CUDA=0 python setup.py build_ext --inplace)
    python scripts/bench_versions.py --checkout old=/tmp/wt_old --checkout HEAD=. --scenes a.ply b.ply

Writes results.md and results.json (after every scene) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compress import find_splat_transform, render_all  # noqa: E402
from bench_effort import machine, run_peer, run_scenes, scene_frame_size  # noqa: E402

from visionmoe.splat.encoder.compress import reference_ply_bytes  # noqa: E402
from visionmoe.splat.evaluation import check_disjoint, encoder_cameras, heldout_cameras  # noqa: E402
from visionmoe.splat.io import GaussianScene, read_ply  # noqa: E402
from visionmoe.splat.metrics import psnr  # noqa: E402

_FIELDS = ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest")

# Run in the checkout's own interpreter path: argv = scene, target json, effort, output file.
WORKER = r"""
import inspect, json, sys, time, torch
from visionmoe.splat import compress, decompress
scene, target, effort, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
if effort and "effort" in inspect.signature(compress).parameters:
    target["effort"] = effort
c = time.process_time()
res = compress(scene, **target)
cpu = time.process_time() - c
d = decompress(res.data)
torch.save({k: getattr(d, k) for k in %r}, out)
print(json.dumps({"bytes": len(res.data), "cpu_s": cpu}))
""" % (_FIELDS,)


def encode_with(checkout: Path, scene: Path, target: dict, effort: str, tmp: Path) -> tuple[dict, GaussianScene]:
    out = (tmp / "decoded.pt").resolve()
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    r = subprocess.run([sys.executable, "-c", WORKER, str(scene.resolve()), json.dumps(target), effort, str(out)],
                       capture_output=True, text=True, env=env, cwd=checkout)
    if r.returncode != 0:
        raise RuntimeError((r.stderr or r.stdout).strip()[-400:])
    info = json.loads(r.stdout.strip().splitlines()[-1])
    return info, GaussianScene(**torch.load(out))


def bench_scene(path: Path, checkouts: dict[str, Path], tool, args, tmp: Path) -> list[dict]:
    scene = read_ply(path)
    name = path.name.removesuffix(".ply")
    ref_bytes = reference_ply_bytes(scene.num_gaussians, scene.sh_degree)
    cams = heldout_cameras(scene, num_views=args.views, size=args.size)
    check_disjoint(cams, encoder_cameras(scene, effort=args.effort), scene_frame_size(scene))
    ref = render_all(scene, cams)
    targets = [(f"{r:g}x", {"ratio": r}) for r in args.ratios]
    rows = []
    earlier = [r for r in args.sog_rows if r["scene"] == name]
    if earlier:
        rows.append(dict(earlier[0]))
        targets.append(("SOG's size", {"size": earlier[0]["bytes"]}))
    elif tool:
        sog = tmp / f"{name}.sog"
        extra = [] if scene.sh_degree == 0 or scene.num_gaussians <= 20000 else ["-H", "0"]
        cpu, _ = run_peer([*tool, "-w", "-q", "-g", "cpu", str(path), *extra, str(sog)])
        back = tmp / f"{name}.sog.ply"
        run_peer([*tool, "-w", "-q", str(sog), str(back)])
        size = sog.stat().st_size
        rows.append({"scene": name, "target": "SOG's size", "encoder": "SOG" + (" (SH0)" if extra else ""),
                     "bytes": size, "target_bytes": size, "cpu_s": cpu,
                     "psnr": float(psnr(render_all(read_ply(back, nonfinite="drop"), cams), ref))})
        print(f"  SOG: {size} B  PSNR {rows[-1]['psnr']:.2f}  CPU {cpu:.1f}s", flush=True)
        targets.append(("SOG's size", {"size": size}))
    for label, target in targets:
        want = target.get("size") or ref_bytes / target["ratio"]
        for cname, cdir in checkouts.items():
            try:
                info, decoded = encode_with(cdir, path, dict(target), args.effort, tmp)
            except RuntimeError as exc:
                print(f"  {cname} {label}: failed ({exc})", flush=True)
                continue
            row = {"scene": name, "target": label, "encoder": cname, "bytes": info["bytes"], "target_bytes": int(want),
                   "cpu_s": info["cpu_s"], "psnr": float(psnr(render_all(decoded, cams), ref))}
            rows.append(row)
            print(f"  {cname:>10} {label:>11}: {row['bytes']:>9} B ({100 * row['bytes'] / want:5.1f}% of the "
                  f"target)  PSNR {row['psnr']:6.2f}  CPU {row['cpu_s']:6.1f}s", flush=True)
    return rows


def table(rows: list[dict], args) -> str:
    out = [f"{args.views} held-out views at {args.size} px; CPU = user + system seconds of `compress` (all "
           f"threads), effort {args.effort} where the encoder has efforts; {machine()}", "",
           "| scene | target | encoder | bytes | fill | PSNR (dB) | CPU (s) |", "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['scene']} | {r['target']} | {r['encoder']} | {r['bytes']:,} | "
                   f"{100 * r['bytes'] / r['target_bytes']:.1f}% | {r['psnr']:.2f} | {r['cpu_s']:.1f} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkout", action="append", default=[], metavar="NAME=DIR",
                    help="an encoder: a checkout with its extension built in place (repeatable; default HEAD=.)")
    ap.add_argument("--scenes", nargs="+", required=True, help=".ply files")
    ap.add_argument("--ratios", type=lambda s: [float(x) for x in s.split(",")], default=[5.0])
    ap.add_argument("--effort", default="default", help="passed to encoders that have efforts")
    ap.add_argument("--views", type=int, default=16)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--node-dir", default="out/node")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--sog-from", help="results.json of an earlier run: its SOG sizes are the targets")
    ap.add_argument("--out", default="out/bench_versions")
    args = ap.parse_args()
    checkouts = {}
    for spec in args.checkout or ["HEAD=."]:
        cname, _, cdir = spec.partition("=")
        if not cdir or not (Path(cdir) / "visionmoe").is_dir():
            ap.error(f"--checkout {spec!r}: want NAME=DIR, DIR a checkout of this repository")
        checkouts[cname] = Path(cdir).resolve()
    args.sog_rows = [] if not args.sog_from else [
        r for r in json.loads(Path(args.sog_from).read_text())["rows"] if r["encoder"].startswith("SOG")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tool = None if args.no_peers else find_splat_transform(Path(args.node_dir), True)
    run_scenes(map(Path, args.scenes), out, lambda path, tmp: bench_scene(path, checkouts, tool, args, tmp),
               lambda rows: table(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
