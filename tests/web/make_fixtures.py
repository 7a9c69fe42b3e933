"""Write .pgms files and their Python-decoded levels for the JavaScript decoder's tests.

    python tests/web/make_fixtures.py --out DIR                      # quick set (CI): the asset
                                                                     # scene at 5x and 20x + variants
    python tests/web/make_fixtures.py --out DIR --scenes A.ply B.ply --ratios 5 20 [--full]

DIR/manifest.json lists every file: its levels, the byte offset where each level's section
ends, the decoded Gaussian count per level and the sections present; DIR/<name>.L<l>.<array>.f32
hold the float32 arrays of ``decompress(data, level=l)`` (means, quats, log_scales,
opacity_logits, sh_dc, sh_rest; little-endian, C order). DIR/rans.json lists coder-4 test
vectors (symbols and the Python encoder's bytes, hex). Nothing here is stored in the repository.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "splat"))

from visionmoe.splat import compress, decompress  # noqa: E402
from visionmoe.splat.io import GaussianScene, read_ply  # noqa: E402
from visionmoe.splat.pgms import bitstream as bs  # noqa: E402
from visionmoe.splat.pgms import rans  # noqa: E402

ARRAYS = ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest")
ASSET = ROOT / "assets" / "fruit_drops_minimal.ply"


def dump(out: Path, name: str, data: bytes, seconds: float | None = None) -> dict:
    (out / f"{name}.pgms").write_bytes(data)
    secs = list(bs.iter_sections(data))
    ends = [s.offset + 16 + len(s.payload) for s in secs if s.tag == "LEVL"]
    counts, py_ms = [], []
    for lv in range(len(ends)):
        t = time.perf_counter()
        sc = decompress(data, level=lv)
        py_ms.append(1000 * (time.perf_counter() - t))
        counts.append(sc.num_gaussians)
        for k in ARRAYS:
            np.ascontiguousarray(getattr(sc, k).numpy(), "<f4").tofile(out / f"{name}.L{lv}.{k}.f32")
    return {"name": name, "file": f"{name}.pgms", "bytes": len(data), "version": list(bs.read_preamble(data)),
            "levels": len(ends), "level_ends": ends, "counts": counts, "sh_degree": round((sc.sh_rest.shape[1] + 1) ** 0.5) - 1, "sections": sorted({s.tag for s in secs}),
            "python_decode_ms": py_ms, "encode_s": seconds}


def lossy_grid_scene(n: int = 3000, seed: int = 3) -> GaussianScene:
    """Attributes on small value sets, as in scenes decoded from 8-bit formats (exercises PALT)."""
    g = torch.Generator().manual_seed(seed)
    rgb = torch.randint(0, 256, (n, 3), generator=g).float() / 255
    alpha = (torch.randint(1, 255, (n,), generator=g).float() / 255)
    scales = torch.linspace(-5, -2, 64)[torch.randint(0, 64, (n, 3), generator=g)]
    return GaussianScene(
        means=torch.randn(n, 3, generator=g), quats=torch.randn(n, 4, generator=g), log_scales=scales,
        opacity_logits=torch.log(alpha / (1 - alpha)), sh_dc=(rgb - 0.5) / 0.28209479177387814,
        sh_rest=torch.zeros(n, 0, 3))


def quick_set() -> list[tuple[str, GaussianScene, dict]]:
    from pgms_helpers import random_scene

    fast = dict(num_views=4, view_size=64, refine_steps=0, verify_views=1, prune_search=0)
    asset = read_ply(ASSET)

    def synthetic(scene, **kw):  # given contributions: no renders at all
        w = torch.rand(scene.num_gaussians, generator=torch.Generator().manual_seed(1)) + 0.1
        return scene, dict(contributions=w, refine_steps=0, verify_views=0, prune_search=0, **kw)

    return [
        ("fruit_drops_minimal_5x", asset, dict(ratio=5, **fast)),
        ("fruit_drops_minimal_20x", asset, dict(ratio=20, **fast)),
        ("random_sh0", *synthetic(random_scene(3000, 0, seed=11), ratio=8)),
        ("random_sh2_pinned", *synthetic(random_scene(3000, 2, seed=12), ratio=4, preset=(5, 5))),
        ("lossy_grid_palettes", *synthetic(lossy_grid_scene(), ratio=4)),
        # coded as given (no XFRM section): the world frame
        ("random_sh1_world_frame", *synthetic(random_scene(2000, 1, seed=14), ratio=6, frame="world")),
        ("single_node_levels", *synthetic(random_scene(40, 1, seed=13), ratio=3)),
        # a target below the coarsest rung: every node stays in level 0, the finest level is empty
        ("empty_finest_level", *synthetic(random_scene(300, 0, seed=9), ratio=400)),
        # exact duplicate rows, one of them 20 times (format 5.1: the fine tier's copy counts)
        ("exact_copies", *synthetic(copies_scene(), ratio=3)),
    ]


def copies_scene() -> GaussianScene:
    """A scene whose rows repeat bit for bit: 30% of them twice, one 20 times."""
    from pgms_helpers import random_scene

    base = random_scene(1500, 1, seed=15)
    g = torch.Generator().manual_seed(16)
    rows = torch.cat([torch.arange(1500), torch.randperm(1500, generator=g)[:450], torch.full((19,), 7)])
    return base.subset(rows[torch.randperm(len(rows), generator=g)])


def rans_vectors() -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for n, alphabet, lanes, conc in [(1, 1, None, 1.0), (7, 3, None, 1.0), (5000, 40, 7, 0.3), (20000, 300, None, 0.5),
                                     (3000, 65536, None, 1.0), (100000, 16, 64, 0.2)]:
        u = rng.choice(alphabet, size=n, p=rng.dirichlet(np.full(alphabet, conc))) if alphabet > 1 else np.zeros(n, int)
        a = int(u.max()) + 1
        body = rans.encode(u, a, lanes=lanes)
        out.append({"n": n, "alphabet": a, "symbols": u.tolist(), "body": body.hex()})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--scenes", nargs="*", type=Path, help="INRIA .ply scenes (default: the quick set)")
    ap.add_argument("--ratios", nargs="*", type=float, default=[5, 20])
    ap.add_argument("--full", action="store_true", help="encode the scenes with the default (slow) settings")
    ap.add_argument("--pgms", nargs="*", type=Path, help="existing .pgms files to include as they are")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    entries = []
    jobs = []
    if args.scenes:
        opts = {} if args.full else dict(num_views=4, view_size=64, refine_steps=0, verify_views=1, prune_search=0)
        for p in args.scenes:
            sc = read_ply(p)
            for r in args.ratios:
                jobs.append((f"{p.stem}_{r:g}x", sc, dict(ratio=r, **opts)))
    elif not args.pgms:
        jobs = quick_set()
    for name, sc, kw in jobs:
        t = time.perf_counter()
        data = compress(sc, **kw).data
        entries.append(dump(args.out, name, data, time.perf_counter() - t))
        print(f"{name}: {len(data)} bytes, levels {entries[-1]['counts']}, {entries[-1]['sections']}", flush=True)
    for p in args.pgms or []:
        entries.append(dump(args.out, p.stem, p.read_bytes()))
        print(f"{p.stem}: {entries[-1]['bytes']} bytes, levels {entries[-1]['counts']}", flush=True)
    (args.out / "manifest.json").write_text(json.dumps({"files": entries}, indent=1))
    (args.out / "rans.json").write_text(json.dumps(rans_vectors()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
