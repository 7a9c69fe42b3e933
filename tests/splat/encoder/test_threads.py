"""Encoding on several threads at once gives the bytes of single-threaded runs: the options of
an encode travel as arguments (a module-level flag once carried ``write_pgms``'s ``fast`` to
the stream coders, so a full encode on one thread could run with another's probe coders)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from pgms_helpers import random_scene

from visionmoe.splat import compress
from visionmoe.splat.pgms import bitstream as bs
from visionmoe.splat.pgms.quantize import Quantizer


def _levels(seed: int):
    g = np.random.default_rng(seed)
    n0, n1 = 2000, 6000
    coarse = {"shape": g.integers(0, 64, n0), "pos": g.integers(-40, 40, (n0, 3)),
              "dc": g.integers(-9, 9, (n0, 3)), "op": g.integers(0, 255, n0)}
    fine = {"ls": g.integers(-5, 5, (n1, 3)), "rot_i": g.integers(0, 4, n1), "rot_q": g.integers(0, 255, (n1, 3)),
            "pos": np.round(g.normal(0, 6, (n1, 3))).astype(np.int64), "dc": g.integers(-3, 3, (n1, 3)),
            "op": g.integers(0, 16, n1)}
    counts = np.full(n0, 3)
    meta = bs.FileMeta(sh_degree=0, origin=np.zeros(3), quant=Quantizer(0.1, 0.05, 0.05, 1e-6, 8, 8),
                       source_gaussians=n1, reference_bytes=10**6)
    cb = g.normal(0, 1, (64, 9)).astype(np.float32)
    return meta, cb, [coarse, fine], [counts, np.zeros(n1, np.int64)]


def test_write_pgms_on_two_threads_with_different_settings_gives_the_serial_bytes():
    meta, cb, syms, counts = _levels(0)
    serial = {fast: bs.write_pgms(meta, cb, None, syms, counts, fast=fast) for fast in (False, True)}
    assert serial[True] != serial[False]  # the probe coders code some stream differently
    barrier = threading.Barrier(2)

    def run(fast: bool):
        out = []
        for _ in range(6):
            barrier.wait()
            out.append(bs.write_pgms(meta, cb, None, syms, counts, fast=fast))
        return out

    with ThreadPoolExecutor(2) as pool:
        results = {fast: pool.submit(run, fast) for fast in (False, True)}
        for fast, fut in results.items():
            assert all(data == serial[fast] for data in fut.result()), f"fast={fast}"


def test_compress_on_two_threads_with_different_targets_gives_the_serial_bytes():
    scene = random_scene(1500, 1, seed=2)
    contrib = torch.rand(1500, generator=torch.Generator().manual_seed(3)) * 5 + 0.1
    settings = [dict(ratio=8, preset=(6, 4)), dict(ratio=25)]
    serial = [compress(scene, contributions=contrib, verify_views=0, refine_steps=0, **s).data for s in settings]
    with ThreadPoolExecutor(2) as pool:
        threaded = list(pool.map(lambda s: compress(scene, contributions=contrib, verify_views=0, refine_steps=0, **s).data,
                                 settings))
    assert threaded == serial
