"""Write a scene with exact duplicate Gaussians, as generator exports hold them.

    python scripts/make_copies_scene.py plant.ply plant_dup28.ply --fraction 0.28 --seed 28

A random ``--fraction`` of the rows is appended once more, bit for bit, and all rows are
shuffled (seeded). The benchmarks of exact duplicates (docs/BENCHMARKS.md, "Exact duplicates")
encode such scenes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from visionmoe.splat.io import read_ply, write_ply


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--fraction", type=float, default=0.28, help="share of the rows written twice (0-1)")
    ap.add_argument("--seed", type=int, default=28)
    args = ap.parse_args(argv)
    if not 0 < args.fraction <= 1:
        ap.error(f"--fraction must be in (0, 1], got {args.fraction}")
    scene = read_ply(args.source)
    n = scene.num_gaussians
    rng = np.random.default_rng(args.seed)
    rows = np.concatenate([np.arange(n), rng.choice(n, int(args.fraction * n), replace=False)])
    rows = rows[rng.permutation(len(rows))]
    write_ply(scene.subset(torch.from_numpy(rows)), args.out)
    print(f"{args.out}: {len(rows)} Gaussians, {len(rows) - n} of them copies of another")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
