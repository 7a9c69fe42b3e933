"""Scene I/O: INRIA .ply variants read back exactly; malformed files give one clear SceneError."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from plyfile import PlyData, PlyElement, PlyProperty
from pgms_helpers import ASSET, inria_names, random_scene, scene_columns

from visionmoe.splat.io import GaussianScene, SceneError, read_ply, write_ply


def assert_same(a: GaussianScene, b: GaussianScene):
    for name in ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0, msg=name)


def write_custom(path, scene, *, dtype="<f4", text=False, byte_order="<", extra=(), drop=(), order=None):
    cols = scene_columns(scene)
    names = inria_names(3 * scene.sh_rest.shape[1]) if order is None else order
    names = [n for n in names if n not in drop]
    fields = [(n, dtype if not isinstance(dtype, dict) else dtype.get(n, "<f4")) for n in names]
    fields += [(n, t) for n, t, _ in extra]
    data = np.empty(scene.num_gaussians, dtype=fields)
    for n in names:
        data[n] = cols.get(n, 0.0)
    for n, _, v in extra:
        data[n] = v
    PlyData([PlyElement.describe(data, "vertex")], text=text, byte_order=byte_order).write(str(path))
    return path


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_round_trip_each_degree(tmp_path, degree):
    s = random_scene(50, degree)
    write_ply(s, tmp_path / "a.ply")
    back = read_ply(tmp_path / "a.ply")
    assert back.sh_degree == degree
    assert_same(s, back)


@pytest.mark.parametrize("text,byte_order", [(True, "<"), (False, ">"), (False, "<")])
def test_ascii_and_big_endian(tmp_path, text, byte_order):
    s = random_scene(30, 2)
    write_ply(s, tmp_path / "a.ply", ascii=text, byte_order=byte_order)
    back = read_ply(tmp_path / "a.ply")
    if text:  # ascii stores decimal text: equal to float32 rounding
        torch.testing.assert_close(back.means, s.means)
        torch.testing.assert_close(back.sh_rest, s.sh_rest)
    else:
        assert_same(s, back)


def test_doubles_extra_properties_and_order(tmp_path):
    s = random_scene(20, 1)
    names = list(reversed(inria_names(9, normals=False)))  # no normals, reversed order
    p = write_custom(tmp_path / "a.ply", s, dtype="<f8", order=names,
                     extra=[("red", "u1", 7), ("filter_3D", "<f4", 0.5)])
    assert_same(s, read_ply(p))


def test_real_asset_reads():
    s = read_ply(ASSET)
    assert s.num_gaussians == 4721 and s.sh_degree == 3
    assert torch.isfinite(s.means).all()


def test_missing_property(tmp_path):
    p = write_custom(tmp_path / "a.ply", random_scene(5, 0), drop=("scale_1",))
    with pytest.raises(SceneError, match=r"missing vertex properties \['scale_1'\]"):
        read_ply(p)


def test_partial_sh_bands(tmp_path):
    p = write_custom(tmp_path / "a.ply", random_scene(5, 1), drop=("f_rest_8",))
    with pytest.raises(SceneError, match="f_rest"):
        read_ply(p)


def test_integer_property_type(tmp_path):
    p = write_custom(tmp_path / "a.ply", random_scene(5, 0), dtype={"opacity": "<i4"})
    with pytest.raises(SceneError, match="opacity has type int, expected float"):
        read_ply(p)


def test_list_property_type(tmp_path):
    s = random_scene(4, 0)
    cols = scene_columns(s)
    names = inria_names(0)
    fields = [(n, "<f4") for n in names if n != "x"] + [("x", object)]
    data = np.empty(4, dtype=fields)
    for n in names:
        if n != "x":
            data[n] = cols.get(n, 0.0)
    for i in range(4):
        data["x"][i] = np.array([1.0, 2.0], np.float32)
    el = PlyElement.describe(data, "vertex", len_types={"x": "u1"}, val_types={"x": "f4"})
    PlyData([el]).write(str(tmp_path / "a.ply"))
    with pytest.raises(SceneError, match="x has type list"):
        read_ply(tmp_path / "a.ply")


def test_zero_gaussians(tmp_path):
    p = write_custom(tmp_path / "a.ply", random_scene(0, 0))
    with pytest.raises(SceneError, match="zero Gaussians"):
        read_ply(p)


@pytest.mark.parametrize("cut", [1, 100, 1000])
def test_truncated(tmp_path, cut):
    write_ply(random_scene(40, 1), tmp_path / "a.ply")
    raw = (tmp_path / "a.ply").read_bytes()
    (tmp_path / "b.ply").write_bytes(raw[:-cut])
    with pytest.raises(SceneError, match="truncated"):
        read_ply(tmp_path / "b.ply")


def test_truncated_ascii(tmp_path):
    write_ply(random_scene(40, 0), tmp_path / "a.ply", ascii=True)
    raw = (tmp_path / "a.ply").read_bytes()
    (tmp_path / "b.ply").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(SceneError, match="malformed or truncated"):
        read_ply(tmp_path / "b.ply")


def test_header_lies_about_count(tmp_path):
    write_ply(random_scene(10, 0), tmp_path / "a.ply")
    raw = (tmp_path / "a.ply").read_bytes().replace(b"element vertex 10", b"element vertex 999999999999")
    (tmp_path / "b.ply").write_bytes(raw)
    with pytest.raises(SceneError, match="more than"):
        read_ply(tmp_path / "b.ply")
    raw = (tmp_path / "a.ply").read_bytes().replace(b"element vertex 10", b"element vertex 90000000")
    (tmp_path / "c.ply").write_bytes(raw)
    with pytest.raises(SceneError, match="truncated"):
        read_ply(tmp_path / "c.ply")


@pytest.mark.parametrize("raw,match", [
    (b"", "not a .ply"),
    (b"PK\x03\x04 zip", "not a .ply"),
    (b"ply\nformat binary_little_endian 1.0\nelement vertex 3\n", "before 'end_header'"),
    (b"ply\nformat weird 1.0\nelement vertex 3\nend_header\n", "unknown format"),
    (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nend_header\n1\n", "missing vertex properties"),
    (b"ply\nformat ascii 1.0\nelement face 1\nproperty float x\nend_header\n1\n", "no 'vertex' element"),
])
def test_not_a_scene(tmp_path, raw, match):
    (tmp_path / "a.ply").write_bytes(raw)
    with pytest.raises(SceneError, match=match):
        read_ply(tmp_path / "a.ply")


def test_no_such_file(tmp_path):
    with pytest.raises(SceneError, match="no such file"):
        read_ply(tmp_path / "missing.ply")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_reject_and_drop(tmp_path, bad, caplog):
    s = random_scene(20, 1)
    s.sh_rest[3, 2, 1] = bad
    s.means[7, 0] = bad
    write_ply(s, tmp_path / "a.ply")
    with pytest.raises(SceneError, match="2 of 20 Gaussians have NaN/Inf"):
        read_ply(tmp_path / "a.ply")
    with caplog.at_level("WARNING"):
        back = read_ply(tmp_path / "a.ply", nonfinite="drop")
    assert back.num_gaussians == 18 and "dropped 2 of 20" in caplog.text
    keep = torch.ones(20, dtype=torch.bool)
    keep[[3, 7]] = False
    assert_same(s.subset(keep), back)


def test_all_nonfinite_dropped(tmp_path):
    s = random_scene(3, 0)
    s.opacity_logits[:] = float("nan")
    write_ply(s, tmp_path / "a.ply")
    with pytest.raises(SceneError, match="every Gaussian"):
        read_ply(tmp_path / "a.ply", nonfinite="drop")


def test_double_overflow_is_nonfinite(tmp_path):
    s = random_scene(4, 0)
    p = write_custom(tmp_path / "a.ply", s, dtype="<f8")
    ply = PlyData.read(str(p), mmap=False)
    ply["vertex"].data["x"][1] = 1e300
    ply.write(str(p))
    with pytest.raises(SceneError, match="1 of 4"):
        read_ply(p)


def test_write_is_atomic(tmp_path, monkeypatch):
    target = tmp_path / "a.ply"
    target.write_bytes(b"old")

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(PlyData, "write", boom)
    with pytest.raises(RuntimeError):
        write_ply(random_scene(3, 0), target)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.ply"]


def test_scene_shape_errors():
    s = random_scene(4, 0)
    with pytest.raises(SceneError, match="quats must have shape"):
        GaussianScene(s.means, s.quats[:, :3], s.log_scales, s.opacity_logits, s.sh_dc, s.sh_rest)
    assert PlyProperty  # plyfile API used above


def test_ply_files_get_umask_permissions_and_leave_no_temp_file(tmp_path):
    """.ply files go through the one atomic writer (visionmoe.common.files, tested in
    tests/common): the user's umask sets their permissions, and no temporary file stays."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        ply = write_ply(_tiny(), tmp_path / "b.ply")
        os.umask(0o077)
        private = write_ply(_tiny(), tmp_path / "c.ply")
    finally:
        os.umask(old)
    assert stat.S_IMODE(ply.stat().st_mode) == 0o644 and stat.S_IMODE(private.stat().st_mode) == 0o600
    assert sorted(x.name for x in tmp_path.iterdir()) == ["b.ply", "c.ply"]


def _tiny() -> GaussianScene:
    g = torch.Generator().manual_seed(0)
    return GaussianScene(means=torch.randn(4, 3, generator=g), quats=torch.randn(4, 4, generator=g),
                         log_scales=torch.randn(4, 3, generator=g), opacity_logits=torch.randn(4, generator=g),
                         sh_dc=torch.randn(4, 3, generator=g), sh_rest=torch.zeros(4, 0, 3))
