"""The per-primitive SH grid is quantised in row blocks into int32: the same symbols and the same
decoded coefficients as the whole-array int64 computation, and the same stream bytes."""

from __future__ import annotations

import numpy as np
import torch

from visionmoe.splat.pgms import quantize
from visionmoe.splat.pgms.bitstream import encode_ints
from visionmoe.splat.pgms.quantize import ShGrid, Tables, decode_sh, encode_sh


def _reference(sh_rest: torch.Tensor, grid: ShGrid, keep: np.ndarray):
    k = grid.coefficients
    shq = np.round(sh_rest[:, :k].numpy().astype(np.float64) / grid.step).astype(np.int64)
    shq[~keep] = 0
    rest = np.zeros((len(keep), sh_rest.shape[1], 3), np.float32)
    rest[keep, :k] = (shq[keep] * grid.step).astype(np.float32)
    return shq, rest


def test_sh_grid_in_blocks_matches_the_whole_array(monkeypatch):
    g = torch.Generator().manual_seed(3)
    n = 1000
    sh_rest = torch.randn(n, 15, 3, generator=g) * 0.4
    sh_rest[::17] = 0.0  # exact zeros and values on the rounding boundary
    sh_rest[5, 0, 0] = 0.5 * 0.01
    keep = torch.rand(n, generator=g).numpy() < 0.7
    grid = ShGrid(degree=2, step=0.01)  # the first 8 coefficients of the 15
    ref_q, ref_rest = _reference(sh_rest, grid, keep)
    monkeypatch.setattr(quantize, "_SH_ROWS", 64)  # 16 blocks, the last one partial
    sym, rest = encode_sh(sh_rest, Tables(np.zeros((1, 9), np.float32), grid, keep), None)
    assert sym["sh_q"].dtype == np.int32
    assert np.array_equal(sym["sh_q"], ref_q)
    assert np.array_equal(rest.view(np.uint32), ref_rest.view(np.uint32))  # bit for bit, signs of zero too
    assert encode_ints(sym["sh_q"][keep][:, 3]) == encode_ints(ref_q[keep][:, 3])
    assert np.array_equal(decode_sh(sym, grid, n, 15), ref_rest)


def test_sh_grid_values_beyond_int32_keep_int64():
    sh_rest = torch.zeros(4, 3, 3)
    sh_rest[1, 0, 0] = 3e4  # / 1e-5 = 3e9, beyond int32
    keep = np.ones(4, bool)
    sym, _ = encode_sh(sh_rest, Tables(np.zeros((1, 9), np.float32), ShGrid(degree=1, step=1.0001e-5), keep), None)
    assert sym["sh_q"].dtype == np.int64 and sym["sh_q"][1, 0, 0] == round(3e4 / 1.0001e-5)
