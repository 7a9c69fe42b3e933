"""GaussianSplats3D .ksplat (visionmoe.splat.formats.ksplat): the library's own files at compression
levels 0-2 read within each level's precision, SH degree 0 and 2, bad input."""

import struct

import numpy as np
import pytest
import torch

from conftest import FIXTURES
from visionmoe.splat.formats import read_ksplat
from visionmoe.splat.formats._common import SH_C0
from visionmoe.splat.io import SceneError


def matched(back, src):
    """The source Gaussians in the file's order (GaussianSplats3D regroups them into buckets)."""
    d = torch.cdist(back.means.double(), src.means.double())
    assert d.min(1).values.max() < 2e-3 and len(set(d.argmin(1).tolist())) == back.num_gaussians
    return src.subset(d.argmin(1))


@pytest.mark.parametrize("level, pos_tol, rel_tol, sh_tol", [(0, 0, 1e-6, 0), (1, 2e-3, 1e-3, 1e-3), (2, 2e-3, 1e-3, 0.01)])
def test_reads_each_compression_level(fruit48, level, pos_tol, rel_tol, sh_tol):
    back = read_ksplat(FIXTURES / f"fruit48.l{level}.ksplat")
    src = matched(back, fruit48.with_sh_degree(2))  # the library keeps SH degree 2 at most
    assert back.num_gaussians == 48 and back.sh_degree == 2
    assert ((back.means - src.means).abs() <= pos_tol + 1e-6).all()
    assert torch.allclose(back.log_scales.exp(), src.log_scales.exp(), rtol=rel_tol, atol=1e-7)
    q = src.quats / src.quats.norm(dim=1, keepdim=True)
    assert (1 - (back.quats / back.quats.norm(dim=1, keepdim=True) * q).sum(1).abs() < 1e-5 + rel_tol).all()
    alpha = lambda s: torch.sigmoid(s.opacity_logits.double())  # noqa: E731
    assert ((alpha(back) - alpha(src)).abs() <= 1 / 255 + 1e-6).all()  # the library truncates to 8 bits
    colour = (src.sh_dc * SH_C0 + 0.5).clamp(0, 1)
    assert ((back.sh_dc * SH_C0 + 0.5 - colour).abs() <= 1 / 255 + 1e-6).all()
    inside = src.sh_rest.abs() < 1.5  # level 2 stores SH in 8 bits over [-1.5, 1.5] (the header's range)
    assert ((back.sh_rest - src.sh_rest).abs()[inside] <= sh_tol + 2e-3 * src.sh_rest.abs()[inside] + 1e-7).all()


def test_reads_sh_degree_0(fruit64_sh0):
    back = read_ksplat(FIXTURES / "fruit64_sh0.l1.ksplat")
    assert back.num_gaussians == 64 and back.sh_degree == 0
    assert ((back.means - matched(back, fruit64_sh0).means).abs() <= 2e-3).all()


def _edits():
    raw = (FIXTURES / "fruit48.l1.ksplat").read_bytes()

    def put(fmt, offset, value, data=raw):
        return data[:offset] + struct.pack(fmt, value) + data[offset + struct.calcsize(fmt):]

    return [
        ("empty", b"", "truncated .ksplat"),
        ("short header", raw[:1000], "truncated .ksplat"),
        ("version 0.0", put("<B", 1, 0), "version 0.0 is not supported"),
        ("version 1.1", put("<B", 0, 1), "version 1.1 is not supported"),
        ("level 3", put("<H", 20, 3), "compression level 3"),
        ("no Gaussians", put("<I", 16, 0), "empty .ksplat"),
        ("count mismatch", put("<I", 16, 47), "announces 47 Gaussians, the sections hold 48"),
        ("sections", put("<I", 4, 100000), "section headers need"),
        ("truncated data", raw[:-100], "truncated .ksplat"),
        ("SH degree 5", put("<H", 4096 + 40, 5), "SH degree 5"),
        ("overfull section", put("<I", 4096, 49), "holds 49 Gaussians but has room for 48"),
    ]


@pytest.mark.parametrize("what, raw, message", _edits(), ids=[e[0] for e in _edits()])
def test_bad_input_one_error_line(tmp_path, what, raw, message):
    (tmp_path / "bad.ksplat").write_bytes(raw)
    with pytest.raises(SceneError, match=message) as exc:
        read_ksplat(tmp_path / "bad.ksplat")
    assert "\n" not in str(exc.value)


def test_bucket_refs_are_checked(tmp_path):
    raw = bytearray((FIXTURES / "fruit48.l1.ksplat").read_bytes())
    struct.pack_into("<I", raw, 4096 + 36, 0)  # no partial bucket: the 48 Gaussians fit no bucket
    (tmp_path / "b.ksplat").write_bytes(bytes(raw))
    with pytest.raises(SceneError):
        read_ksplat(tmp_path / "b.ksplat")
    assert np.isfinite(read_ksplat(FIXTURES / "fruit48.l2.ksplat").sh_rest.numpy()).all()
