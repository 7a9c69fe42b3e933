"""Niantic .spz (visionmoe.splat.formats.spz): splat-transform's files read within the format's
precision, our writer byte-identical to splat-transform's, every SH degree, axes, bad input."""

import gzip
import struct

import numpy as np
import pytest
import torch

from conftest import FIELDS, FIXTURES
from visionmoe.splat.formats import read_spz, spz_bytes, write_spz
from visionmoe.splat.formats.spz import COLOR_SCALE
from visionmoe.splat.io import SceneError


def assert_within_spz_precision(back, src, fractional_bits=12):
    """Every attribute within half a quantisation step of the source (where the source is in range)."""
    assert back.num_gaussians == src.num_gaussians and back.sh_degree == src.sh_degree
    assert ((back.means - src.means).abs() <= 0.5 / 2 ** fractional_bits + 1e-6).all()
    alpha = lambda s: torch.sigmoid(s.opacity_logits.double())  # noqa: E731
    assert ((alpha(back) - alpha(src)).abs() <= 0.5 / 255 + 1e-6).all()
    inside = (src.sh_dc * COLOR_SCALE).abs() < 0.5 - 1 / 255
    assert ((back.sh_dc - src.sh_dc).abs()[inside] <= 0.5 / (COLOR_SCALE * 255) + 1e-5).all()
    inside = (src.log_scales > -10) & (src.log_scales < 5.9)
    assert ((back.log_scales - src.log_scales).abs()[inside] <= 1 / 32 + 1e-5).all()
    q = src.quats / src.quats.norm(dim=1, keepdim=True)
    assert (1 - (back.quats * q).sum(1).abs() < 1e-5).all()  # the same rotation, up to sign
    err = (back.sh_rest - src.sh_rest).abs()
    inside = src.sh_rest.abs() < 0.93
    assert (err[:, :3][inside[:, :3]] <= 4.5 / 128 + 1e-6).all()  # 5 bits for degree 1
    assert (err[:, 3:][inside[:, 3:]] <= 8.5 / 128 + 1e-6).all()  # 4 bits above


@pytest.mark.parametrize("name", ["fruit48.spz", "fruit48.v3.spz"])
def test_reads_splat_transform_files(fruit48, name):
    back = read_spz(FIXTURES / name)
    assert_within_spz_precision(back, fruit48)


def test_versions_3_and_4_decode_alike_and_sh0(fruit64_sh0):
    v3, v4 = read_spz(FIXTURES / "fruit48.v3.spz"), read_spz(FIXTURES / "fruit48.spz")
    for f in FIELDS:
        assert torch.equal(getattr(v3, f), getattr(v4, f)), f
    assert_within_spz_precision(read_spz(FIXTURES / "fruit64_sh0.spz"), fruit64_sh0)


def test_writer_is_byte_identical_to_splat_transform(fruit48, fruit64_sh0):
    assert spz_bytes(fruit48) == (FIXTURES / "fruit48.spz").read_bytes()
    assert spz_bytes(fruit64_sh0) == (FIXTURES / "fruit64_sh0.spz").read_bytes()
    # version 3: the same gzip payload (gzip settings differ)
    ours = gzip.decompress(spz_bytes(fruit48, version=3))
    assert ours == gzip.decompress((FIXTURES / "fruit48.v3.spz").read_bytes())


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
@pytest.mark.parametrize("version", [3, 4])
def test_round_trip_every_sh_degree(fruit, tmp_path, degree, version):
    src = fruit.subset(torch.arange(300) * 15).with_sh_degree(degree)
    path = write_spz(src, tmp_path / "a.spz", version=version)
    assert path.read_bytes()[:4] == (b"\x1f\x8b\x08\x00" if version == 3 else b"NGSP")
    assert_within_spz_precision(read_spz(path), src)


def test_axes_rub_is_a_half_turn_about_x(fruit48, tmp_path):
    path = write_spz(fruit48, tmp_path / "rub.spz", axes="rub")
    raw = read_spz(path)  # the stored RUB values
    assert torch.allclose(raw.means, fruit48.means * torch.tensor([1.0, -1.0, -1.0]), atol=2.5e-4)
    back = read_spz(path, axes="rub")
    assert_within_spz_precision(back, fruit48)


def test_far_positions_keep_their_range(fruit48, tmp_path):
    far = fruit48.subset(torch.arange(48))
    far.means[:, 0] += 5000.0
    back = read_spz(write_spz(far, tmp_path / "far.spz"))
    assert_within_spz_precision(back, far, fractional_bits=10)  # 5000 needs 13 integer bits of 24
    with pytest.raises(SceneError, match="beyond"):
        far.means[0, 0] = 1e9
        spz_bytes(far)


def test_version_2_rotations(tmp_path):
    """Version 2 stores x, y, z in 8 bits each (byte / 127.5 - 1) and derives w >= 0."""
    n = 2
    head = struct.pack("<IIIBBBB", 0x5053474E, 2, n, 0, 12, 0, 0)
    body = bytes(9 * n) + bytes([255, 255]) + bytes([128] * 6) + bytes([160] * 6) + bytes([255, 128, 128, 128, 128, 191])
    (tmp_path / "v2.spz").write_bytes(gzip.compress(head + body))
    s = read_spz(tmp_path / "v2.spz")
    x = np.array([255, 128, 128, 128, 128, 191], np.float64).reshape(2, 3) / 127.5 - 1
    w = np.sqrt(np.maximum(0, 1 - (x * x).sum(1)))
    assert np.allclose(s.quats.numpy(), np.concatenate([w[:, None], x], 1), atol=1e-7)
    assert torch.allclose(s.log_scales, torch.full((2, 3), 160 / 16 - 10.0))


def _edits():
    v4 = (FIXTURES / "fruit48.spz").read_bytes()
    v3 = (FIXTURES / "fruit48.v3.spz").read_bytes()
    payload = gzip.decompress(v3)
    return [
        ("empty", b"", "truncated .spz"),
        ("magic", b"XXXX" + v4[4:], "expected the magic 'NGSP'"),
        ("version 5", v4[:4] + struct.pack("<I", 5) + v4[8:], "version 5 is not supported"),
        ("version 1", gzip.compress(payload[:4] + struct.pack("<I", 1) + payload[8:]), "version 1 is not supported"),
        ("SH degree 4", v4[:12] + bytes([4]) + v4[13:], "SH degree 4"),
        ("truncated v4", v4[:-40], "truncated .spz"),
        ("truncated header", v4[:20], "truncated .spz"),
        ("truncated v3", v3[:len(v3) // 2], "truncated|corrupt"),
        ("short v3 payload", gzip.compress(payload[:-10]), "truncated .spz"),
        ("streams", v4[:15] + bytes([7]) + v4[16:], "7 streams"),
        ("corrupt zstd", v4[:32 + 16 * 6] + bytes(len(v4) - 32 - 16 * 6), "corrupt .spz stream"),
        ("plain v3", payload, "must be gzip-compressed"),
        ("no Gaussians", v4[:8] + struct.pack("<I", 0) + v4[12:], "empty .spz"),
    ]


@pytest.mark.parametrize("what, raw, message", _edits(), ids=[e[0] for e in _edits()])
def test_bad_input_one_error_line(tmp_path, what, raw, message):
    (tmp_path / "bad.spz").write_bytes(raw)
    with pytest.raises(SceneError, match=message) as exc:
        read_spz(tmp_path / "bad.spz")
    assert "\n" not in str(exc.value)
    with pytest.raises(SceneError, match="no such file"):
        read_spz(tmp_path / "missing.spz")
