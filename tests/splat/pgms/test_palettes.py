"""Format 2.0+ value tables (section PALT): lossless fine-tier coding of attributes that sit on a
small set of values (scenes decoded from lossy formats), and its validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pgms_helpers import random_scene

from visionmoe.splat import compress, decompress
from visionmoe.splat.encoder.allocator import GEOMETRY_LADDER
from visionmoe.splat.encoder.palettes import detect_palettes
from visionmoe.splat.io import SceneError
from visionmoe.splat.pgms import bitstream as bs

SH_C0 = 0.28209479177387814
TOP = len(GEOMETRY_LADDER) - 1


def grid_scene(n: int = 1200, seed: int = 3):
    """DC on an 8-bit colour grid, opacity on an 8-bit alpha grid, log-scales from a 48-value table."""
    s = random_scene(n, 0, seed=seed)
    g = np.random.default_rng(seed)
    col = g.integers(0, 256, (n, 3)) / 255.0
    s.sh_dc[:] = torch.from_numpy(((col - 0.5) / SH_C0).astype(np.float32))
    a = g.integers(1, 255, n) / 255.0
    s.opacity_logits[:] = torch.from_numpy(np.log(a / (1 - a)).astype(np.float32))
    table = np.linspace(-5.0, -2.0, 48).astype(np.float32)
    s.log_scales[:] = torch.from_numpy(table[g.integers(0, 48, (n, 3))])
    return s


@pytest.fixture(scope="module")
def grid_pgms():
    s = grid_scene()
    # coded as given: in the canonical frame a decoded log-scale is the table's value plus the
    # frame's log-scale, one float32 rounding away (checked below)
    res = compress(s, ratio=2, contributions=torch.full((s.num_gaussians,), 5.0), preset=(TOP, 0), frame="world")
    return s, res


def test_palette_channels_are_lossless(grid_pgms):
    src, res = grid_pgms
    assert res.primitives == src.num_gaussians
    assert "PALT" in [sec.tag for sec in bs.iter_sections(res.data)]
    dec = decompress(res.data)
    for name, cols in (("sh_dc", 3), ("log_scales", 3)):
        for c in range(cols):
            np.testing.assert_array_equal(np.sort(getattr(dec, name)[:, c].numpy()), np.sort(getattr(src, name)[:, c].numpy()))
    np.testing.assert_allclose(np.sort(dec.opacity_logits.numpy()), np.sort(src.opacity_logits.numpy()), rtol=0, atol=1e-6)
    canon = decompress(compress(src, ratio=2, contributions=torch.full((src.num_gaussians,), 5.0), preset=(TOP, 0)).data)
    for c in range(3):
        np.testing.assert_array_equal(np.sort(canon.sh_dc[:, c].numpy()), np.sort(src.sh_dc[:, c].numpy()))
        np.testing.assert_allclose(np.sort(canon.log_scales[:, c].numpy()), np.sort(src.log_scales[:, c].numpy()),
                                   rtol=0, atol=5e-7)


def test_palette_file_is_deterministic_and_progressive(grid_pgms):
    src, res = grid_pgms
    again = compress(src, ratio=2, contributions=torch.full((src.num_gaussians,), 5.0), preset=(TOP, 0), frame="world")
    assert again.data == res.data
    assert bs.read_preamble(res.data) == bs.VERSION == (5, 0)
    secs = [sec for sec in bs.iter_sections(res.data) if sec.tag == "LEVL"]
    end0 = secs[0].offset + 16 + len(secs[0].payload)
    coarse = decompress(res.data[:end0], level=0)
    assert 0 < coarse.num_gaussians < src.num_gaussians


def test_coarse_rung_does_not_use_palettes():
    s = grid_scene()
    res = compress(s, ratio=2, contributions=torch.full((s.num_gaussians,), 5.0), preset=(0, 0))
    assert "PALT" not in [sec.tag for sec in bs.iter_sections(res.data)]


def test_detect_palettes_rejects_continuous_channels():
    s = random_scene(400, 0, seed=1)
    assert detect_palettes(s) is None


def _replace_palt(data: bytes, pal: bs.Palettes) -> bytes:
    out = bytearray()
    out += data[:12]
    for sec in bs.iter_sections(data):
        payload = sec.payload
        if sec.tag == "PALT":
            w = bs.StreamWriter()
            bs.write_palettes(w, pal)
            payload = w.getvalue()
        out += bs.pack_section(sec.tag, payload, sec.level)
    return bytes(out)


def test_bad_palettes_are_format_errors(grid_pgms):
    _, res = grid_pgms
    pal = bs.read_palettes(next(sec for sec in bs.iter_sections(res.data) if sec.tag == "PALT").payload)
    # a table that is not strictly increasing
    bad = bs.Palettes({**pal.values, "dc0": pal.values["dc0"][::-1].copy()}, dict(pal.mode))
    with pytest.raises(bs.FormatError, match="strictly increasing"):
        decompress(_replace_palt(res.data, bad))
    # a table shorter than the indices the level codes
    short = bs.Palettes({**pal.values, "ls1": pal.values["ls1"][:3].copy()}, dict(pal.mode))
    with pytest.raises(bs.FormatError):
        decompress(_replace_palt(res.data, short))
    # prediction is only defined for the DC channels
    wrong = bs.Palettes(dict(pal.values), {**pal.mode, "op": bs.PALETTE_PREDICTED})
    with pytest.raises(bs.FormatError, match="predicted"):
        decompress(_replace_palt(res.data, wrong))


DATA = Path(__file__).resolve().parents[1] / "data"


def test_older_format_files_still_decode():
    """format2.pgms was written by the format 2.0 encoder (absolute fine-tier shapes, world-axis
    offsets; random_scene(300, 1, seed=2), ratio 6, preset (3, 3)); format2_decoded.npz is what
    that release decoded it to."""
    data = (DATA / "format2.pgms").read_bytes()
    assert bs.read_preamble(data) == (2, 0)
    assert "PALT" not in [sec.tag for sec in bs.iter_sections(data)]
    want = np.load(DATA / "format2_decoded.npz")
    got = decompress(data)
    for k in want.files:
        np.testing.assert_array_equal(getattr(got, k).numpy(), want[k], err_msg=k)
    # 1.x differs from 2.x only in the DC residuals (no colour decorrelation)
    v1 = decompress(data[:8] + bytes([1, 0, 0, 0]) + data[12:])
    for k in ("means", "quats", "log_scales", "opacity_logits"):
        np.testing.assert_array_equal(getattr(v1, k).numpy(), want[k], err_msg=k)
    with pytest.raises(SceneError, match="version 6.0"):
        decompress(data[:8] + bytes([6, 0, 0, 0]) + data[12:])
