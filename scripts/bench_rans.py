#!/usr/bin/env python
"""Benchmark the .pgms rANS coder (format coder 4): compiled loops (visionmoe._C) against the
numpy loops they replace, in one run, on the same streams; optionally whole .pgms decodes.

Streams: Laplacian-like symbols (alphabet 35, the shape of a fine level's residual streams)
of 2k, 60k and 500k symbols; the coder picks precision and lanes as it does in files. Prints
medians over repeats, the ratio against the numpy baseline, and the machine.
Usage: python scripts/bench_rans.py [--repeats 7] [FILE.pgms ...]
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager

import numpy as np
from bench_routing import machine, median_time  # the benchmarks' timing rule and machine line

from visionmoe.ops import rans as compiled_ops
from visionmoe.splat.pgms import rans
from visionmoe.splat.pgms.decode import decompress


@contextmanager
def numpy_loops():
    available = compiled_ops.available
    compiled_ops.available = lambda: False
    try:
        yield
    finally:
        compiled_ops.available = available


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help=".pgms files to decode whole (numpy vs compiled loops)")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    if not compiled_ops.available():
        raise SystemExit("bench_rans: visionmoe._C is not built (make build)")
    print(f"machine: {machine()}")
    print(f"{'case':34s} {'numpy (ms)':>11s} {'compiled (ms)':>14s} {'speed-up':>9s}")
    rng = np.random.default_rng(0)
    for n in (2_000, 60_000, 500_000):
        u = np.clip(np.round(rng.laplace(17, 3, size=n)), 0, 34).astype(np.int64)
        body = rans.encode(u, 35)
        assert (rans.decode(body, n, 35) == u).all()
        with numpy_loops():
            assert rans.encode(u, 35) == body  # the same bytes either way
            enc_np = median_time(lambda: rans.encode(u, 35), args.repeats)
            dec_np = median_time(lambda: rans.decode(body, n, 35), args.repeats)
        enc_c = median_time(lambda: rans.encode(u, 35), args.repeats)
        dec_c = median_time(lambda: rans.decode(body, n, 35), args.repeats)
        for what, a, b in (("encode", enc_np, enc_c), ("decode", dec_np, dec_c)):
            print(f"{what + f' {n:,} symbols':34s} {a * 1e3:11.2f} {b * 1e3:14.2f} {a / b:8.1f}x")
    for path in args.files:
        with numpy_loops():
            full_np = median_time(lambda: decompress(path), args.repeats)
        full_c = median_time(lambda: decompress(path), args.repeats)
        name = f"decompress {os.path.basename(path)}"
        print(f"{name:34s} {full_np * 1e3:11.1f} {full_c * 1e3:14.1f} {full_np / full_c:8.1f}x")


if __name__ == "__main__":
    main()
