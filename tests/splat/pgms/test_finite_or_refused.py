"""Finite or refused (issue 52): every decoded or read scene is finite after activation in float32,
or the reader says why in one line; the .pgms rules both decoders share (coders per version,
band matrices that are rotations). Files are built from small encodes and edited here."""

from __future__ import annotations

import math
import struct
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from pgms_helpers import random_scene

import hostile as h
from visionmoe.splat import FormatError, compress, decompress
from visionmoe.splat.formats import read_compressed_ply, read_splat
from visionmoe.splat.io import SceneError, read_ply, write_ply
from visionmoe.splat.pgms import bitstream as bs
from visionmoe.splat.pgms import coders
from visionmoe.splat.pgms.decode import decode_coded

FORMATS = Path(__file__).resolve().parents[1] / "data" / "formats"


def _encode(scene, **kw) -> bytes:
    w = torch.rand(scene.num_gaussians, generator=torch.Generator().manual_seed(1)) + 0.1
    return compress(scene, contributions=w, refine_steps=0, verify_views=0, prune_search=0, **kw).data


@pytest.fixture(scope="module")
def sh1() -> bytes:
    return _encode(random_scene(200, 1, seed=3), ratio=6, preset=(3, 3))


def _edit_xfrm(data: bytes, fn) -> bytes:
    version, secs = h.parse(data)
    i = next(k for k, s in enumerate(secs) if s.tag == "XFRM")
    p = bytearray(secs[i].payload)
    fn(p)
    secs[i] = replace(secs[i], payload=bytes(p))
    return h.pack(secs, version)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg
    return msg


def test_large_log_scales_with_a_large_xfrm_scale_are_refused():
    """The issue's reproducer: coded log-scales near 25 plus ln(1e30) ~ 69 decoded to 94, where
    exp overflows float32 (7,844 infinite scales written with exit 0). Now a FormatError."""
    scene = random_scene(200, 0, seed=11)
    scene.log_scales = torch.full_like(scene.log_scales, 25.0)
    data = _edit_xfrm(_encode(scene, ratio=4), lambda p: struct.pack_into("<2d", p, 56, 1e30, math.log(1e30)))
    with pytest.raises(FormatError) as exc, warnings.catch_warnings():
        warnings.simplefilter("error")
        decompress(data)
    assert "log-scales leave [-80, 80]" in _one_line(exc)
    assert torch.isfinite(decode_coded(data).log_scales.exp()).all()  # the coded frame itself is fine


def test_a_valid_large_xfrm_scale_still_decodes(sh1):
    data = _edit_xfrm(sh1, lambda p: struct.pack_into("<2d", p, 56, 1e30, math.log(1e30)))
    scene = decompress(data)
    assert torch.isfinite(scene.log_scales.exp()).all() and torch.isfinite(scene.means).all()


@pytest.mark.parametrize("row_op", ["negate", "swap"])
def test_band_matrices_must_be_rotations(sh1, row_op):
    def reflect(p):
        D = np.frombuffer(bytes(p[72:108]), "<f4").reshape(3, 3).copy()
        if row_op == "negate":
            D[1] *= -1
        else:
            D[[0, 2]] = D[[2, 0]]
        p[72:108] = D.tobytes()

    with pytest.raises(FormatError) as exc:
        decompress(_edit_xfrm(sh1, reflect))
    assert "not a rotation (orthogonal within 1e-5, determinant +1)" in _one_line(exc)


@pytest.mark.parametrize("coder", [coders.CODER_LZMA, coders.CODER_RANS])
def test_format_1_to_3_coders_are_refused_in_a_5x_file(sh1, coder):
    version, secs = h.parse(sh1)
    i = next(k for k, s in enumerate(secs) if s.tag == "LEVL")
    streams = h.parse_streams(secs[i].payload)
    st = streams[0]
    u = coders.zigzag(bs.StreamReader(st.pack(), "x").ints("s"))  # the stream's symbols, re-coded below
    body = (coders.lzma_compress(coders.planes(u, st.width)) if coder == coders.CODER_LZMA
            else coders.rans_encode(u, st.alphabet))
    streams[0] = replace(st, coder=coder, body=body)
    secs[i] = replace(secs[i], payload=h.pack_streams(streams))
    with pytest.raises(FormatError) as exc:
        decompress(h.pack(secs, version))
    assert f"coder {coder}" in _one_line(exc) and "format 5.x does not allow" in str(exc.value)


def test_legacy_coders_still_read_in_legacy_files():
    data = (Path(__file__).resolve().parents[1] / "data" / "format2.pgms").read_bytes()
    assert decompress(data).num_gaussians > 0


def _huge_colour_ranges(tmp_path: Path) -> Path:
    raw = bytearray((FORMATS / "fruit40_sh1.compressed.ply").read_bytes())
    start = raw.index(b"end_header\n") + len(b"end_header\n")
    raw[start + 12 * 4: start + 13 * 4] = np.float32(-3.4e38).tobytes()  # min_r
    raw[start + 15 * 4: start + 16 * 4] = np.float32(3.4e38).tobytes()  # max_r
    p = tmp_path / "huge.compressed.ply"
    p.write_bytes(bytes(raw))
    return p


def test_compressed_ply_with_huge_colour_ranges_is_refused_without_warnings(tmp_path):
    p = _huge_colour_ranges(tmp_path)
    with pytest.raises(SceneError) as exc, warnings.catch_warnings():
        warnings.simplefilter("error")
        read_compressed_ply(p)
    msg = _one_line(exc)
    assert "of 40 Gaussians have NaN/Inf values after activation" in msg and "colour" in msg


def test_compressed_ply_drop_counts_what_it_drops(tmp_path, caplog):
    with caplog.at_level("WARNING"):
        scene = read_compressed_ply(_huge_colour_ranges(tmp_path), nonfinite="drop")
    assert 0 < scene.num_gaussians < 40 and torch.isfinite(scene.sh_dc).all()
    assert f"dropped {40 - scene.num_gaussians} of 40" in caplog.text


def test_ply_with_log_scales_beyond_float32_exp(tmp_path):
    s = random_scene(10, 0, seed=2)
    s.log_scales[4, 1] = 89.0  # finite, but exp(89) overflows float32
    write_ply(s, tmp_path / "a.ply")
    with pytest.raises(SceneError, match=r"1 of 10 Gaussians .* log-scales above 88\.72"):
        read_ply(tmp_path / "a.ply")
    assert read_ply(tmp_path / "a.ply", nonfinite="drop").num_gaussians == 9


def test_splat_of_another_format_is_one_error_without_warnings(tmp_path, sh1):
    p = tmp_path / "renamed.splat"
    p.write_bytes(sh1[: len(sh1) // 32 * 32])
    with pytest.raises(SceneError) as exc, warnings.catch_warnings():
        warnings.simplefilter("error")
        read_splat(p)
    _one_line(exc)
