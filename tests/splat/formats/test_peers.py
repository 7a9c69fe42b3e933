"""Round trips with PlayCanvas splat-transform (``make peers``): our readers decode its files (and
GaussianSplats3D's .ksplat) value for value as it does, it reads the .spz and .sog we write as we
do, and our .spz bytes equal its own for every SH degree."""

import pytest
import torch

from conftest import FIELDS, FIXTURES
from visionmoe.splat import read_ply, write_ply
from visionmoe.splat.formats import read_any, spz_bytes, write_any

pytestmark = pytest.mark.peer


def decoded_by_splat_transform(splat_transform, path, tmp_path):
    out = tmp_path / (path.name.replace(".", "_") + ".decoded.ply")
    splat_transform(path, out)
    return read_ply(out)


def assert_same(ours, theirs, what):
    assert ours.num_gaussians == theirs.num_gaussians and ours.sh_degree == theirs.sh_degree, what
    for f in FIELDS:
        assert torch.equal(getattr(ours, f), getattr(theirs, f)), f"{what}: {f}"


@pytest.mark.parametrize("name", ["fruit48.spz", "fruit48.v3.spz", "fruit64_sh0.spz", "fruit48.sog",
                                  "fruit64_sh0_meta/meta.json", "fruit48.l0.ksplat", "fruit48.l1.ksplat",
                                  "fruit48.l2.ksplat", "fruit64_sh0.l1.ksplat"])
def test_our_readers_decode_as_splat_transform(splat_transform, tmp_path, name):
    path = FIXTURES / name
    assert_same(read_any(path), decoded_by_splat_transform(splat_transform, path, tmp_path), name)


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_splat_transform_reads_our_files(splat_transform, fruit, tmp_path, degree):
    src = fruit.subset(torch.arange(150) * 31).with_sh_degree(degree)
    for name in ("ours.spz", "ours.sog", "unbundled/meta.json"):
        path = write_any(src, tmp_path / name)
        assert_same(read_any(path), decoded_by_splat_transform(splat_transform, path, tmp_path), name)


@pytest.mark.parametrize("degree", [1, 2])
def test_our_spz_bytes_equal_splat_transforms(splat_transform, fruit, tmp_path, degree):
    src = fruit.subset(torch.arange(100) * 47).with_sh_degree(degree)
    write_ply(src, tmp_path / "src.ply")
    splat_transform(tmp_path / "src.ply", tmp_path / "theirs.spz")
    assert spz_bytes(src) == (tmp_path / "theirs.spz").read_bytes()

