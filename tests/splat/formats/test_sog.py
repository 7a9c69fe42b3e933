"""PlayCanvas SOG (visionmoe.splat.formats.sog): splat-transform's bundled and unbundled files read
within the format's precision, our writer's round trip for every SH degree, bad input."""

import io
import json
import zipfile

import numpy as np
import pytest
import torch

from conftest import FIELDS, FIXTURES
from visionmoe.splat.formats import read_sog, write_sog
from visionmoe.splat.formats._common import morton_order
from visionmoe.splat.formats.sog import _fit_codebook, _optimal_centres, palette_size, texture_size
from visionmoe.splat.io import SceneError


def in_file_order(scene):
    """SOG writers store the Gaussians along splat-transform's Morton curve."""
    return scene.subset(torch.from_numpy(morton_order(scene.means.numpy())))


def nearest(book, x):
    book = torch.as_tensor(np.asarray(book, np.float32))
    return book[(x.reshape(-1, 1) - book.reshape(1, -1)).abs().argmin(1)].reshape(x.shape)


def assert_within_sog_precision(back, src, meta, sh_rms=0.03):
    """Positions within 16 bits of their log-transformed range, rotations within 8 bits, scales
    and colours the nearest codebook entry, opacity within 8 bits, SH bands within ``sh_rms``."""
    assert back.num_gaussians == src.num_gaussians and back.sh_degree == src.sh_degree
    span = torch.tensor(meta["means"]["maxs"]) - torch.tensor(meta["means"]["mins"])
    step = (src.means.abs() + 1) * torch.expm1(span / 65535 * 1.001)  # a 16-bit step (splat-transform truncates)
    assert ((back.means - src.means).abs() <= step + 1e-6).all()
    q = src.quats / src.quats.norm(dim=1, keepdim=True)
    assert (1 - (back.quats * q).sum(1).abs() < 4e-4).all()
    for attr, key in (("log_scales", "scales"), ("sh_dc", "sh0")):
        want = nearest(meta[key]["codebook"], getattr(src, attr))
        assert torch.allclose(getattr(back, attr), want, atol=1e-5), attr
    alpha = lambda s: torch.sigmoid(s.opacity_logits.double())  # noqa: E731
    assert ((alpha(back) - alpha(src)).abs() <= 1 / 255 + 1e-6).all()  # splat-transform truncates, we round
    if src.sh_degree:
        assert ((back.sh_rest - src.sh_rest) ** 2).mean().sqrt() < sh_rms


def meta_of(path):
    if path.name == "meta.json":
        return json.loads(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read("meta.json"))


def test_reads_splat_transform_bundle(fruit48):
    path = FIXTURES / "fruit48.sog"
    assert_within_sog_precision(read_sog(path), in_file_order(fruit48), meta_of(path))


def test_reads_splat_transform_unbundled(fruit64_sh0):
    path = FIXTURES / "fruit64_sh0_meta" / "meta.json"
    assert_within_sog_precision(read_sog(path), in_file_order(fruit64_sh0), meta_of(path))


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_round_trip_every_sh_degree(fruit, tmp_path, degree):
    src = fruit.subset(torch.arange(200) * 23).with_sh_degree(degree)  # palette: one entry per Gaussian
    path = write_sog(src, tmp_path / "a.sog")
    meta = meta_of(path)
    assert meta["count"] == 200 and meta["version"] == 2 and ("shN" in meta) == (degree > 0)
    assert_within_sog_precision(read_sog(path), in_file_order(src), meta, sh_rms=0.01)


def test_round_trip_palette_and_unbundled_form(fruit, tmp_path):
    src = fruit.subset(torch.arange(1100) * 4)  # more than 1024 Gaussians: a k-means palette
    path = write_sog(src, tmp_path / "a.sog", iterations=4)
    meta = meta_of(path)
    assert meta["shN"]["bands"] == 3 and meta["shN"]["count"] == palette_size(1100) == 1024
    back = read_sog(path)
    assert_within_sog_precision(back, in_file_order(src), meta, sh_rms=0.03)
    folder = write_sog(src, tmp_path / "folder" / "meta.json", iterations=4)
    unbundled = read_sog(folder)
    for f in FIELDS:
        assert torch.equal(getattr(unbundled, f), getattr(back, f)), f
    with zipfile.ZipFile(path) as z:  # the same files, byte for byte: the writer is deterministic
        assert sorted(z.namelist()) == sorted(p.name for p in folder.parent.iterdir())
        assert all(z.read(name) == (folder.parent / name).read_bytes() for name in z.namelist())
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())


def test_few_distinct_values_are_kept_exactly(fruit64_sh0, tmp_path):
    flat = fruit64_sh0.subset(torch.arange(64))
    flat.log_scales[:] = torch.tensor([-3.0, -4.5, -6.25])
    back = read_sog(write_sog(flat, tmp_path / "s.sog"))
    assert torch.equal(back.log_scales, flat.log_scales)


def test_codebook_is_optimal_on_separated_clusters():
    rng = np.random.default_rng(0)
    centres = np.linspace(-5, 5, 256)
    x = (centres[rng.integers(0, 256, 20000)] + rng.normal(0, 1e-4, 20000)).astype(np.float32)
    book, label = _fit_codebook(x)
    assert np.abs(book - centres).max() < 1e-3 and np.abs(book[label] - x).max() < 1e-3
    assert np.allclose(_optimal_centres(np.array([0, 0.1, 10, 10.2, 50], np.float32), k=3), [0.05, 10.1, 50], atol=1e-6)
    assert texture_size(48) == (8, 8) and texture_size(4721) == (72, 68)


def _zip(files: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def _bundle_edits():
    with zipfile.ZipFile(FIXTURES / "fruit48.sog") as z:
        files = {n: z.read(n) for n in z.namelist()}
    meta = json.loads(files["meta.json"])

    def with_meta(**changes):
        m = dict(meta, **changes)
        return _zip({**files, "meta.json": json.dumps({k: v for k, v in m.items() if v is not None})})

    return [
        ("not a zip", b"PK\x03\x04 not really", "not a readable zip"),
        ("no meta.json", _zip({k: v for k, v in files.items() if k != "meta.json"}), "no meta.json"),
        ("version 1", with_meta(version=None), "version 1 SOG"),
        ("version 3", with_meta(version=3), "SOG version 3 is not supported"),
        ("bad json", _zip({**files, "meta.json": b"{"}), "not valid JSON"),
        ("missing texture", _zip({k: v for k, v in files.items() if k != "quats.webp"}), "'quats.webp'"),
        ("count too large", with_meta(count=10_000), "too few for 10000"),
        ("count zero", with_meta(count=0), "count 0"),
        ("no means", with_meta(means=None), "lacks means"),
        ("short codebook", with_meta(scales=dict(meta["scales"], codebook=[0.0])), "past its 1-entry codebook"),
        ("bad bands", with_meta(shN=dict(meta["shN"], bands=7)), "shN.bands 7"),
        ("not webp", _zip({**files, "sh0.webp": b"RIFF0000WEBPjunk"}), "not a readable WebP"),
    ]


@pytest.mark.parametrize("what, raw, message", _bundle_edits(), ids=[e[0] for e in _bundle_edits()])
def test_bad_bundle_one_error_line(tmp_path, what, raw, message):
    (tmp_path / "bad.sog").write_bytes(raw)
    with pytest.raises(SceneError, match=message) as exc:
        read_sog(tmp_path / "bad.sog")
    assert "\n" not in str(exc.value)


def test_bad_unbundled_names_stay_in_their_folder(tmp_path):
    meta = json.loads((FIXTURES / "fruit64_sh0_meta" / "meta.json").read_bytes())
    (tmp_path / "secret.webp").write_bytes((FIXTURES / "fruit64_sh0_meta" / "quats.webp").read_bytes())
    (tmp_path / "scene").mkdir()
    for texture in (FIXTURES / "fruit64_sh0_meta").glob("*.webp"):
        (tmp_path / "scene" / texture.name).write_bytes(texture.read_bytes())
    meta["quats"]["files"] = ["../secret.webp"]
    (tmp_path / "scene" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SceneError, match="not a plain file name"):
        read_sog(tmp_path / "scene" / "meta.json")
    with pytest.raises(SceneError, match="no such file"):
        read_sog(tmp_path / "missing.sog")


@pytest.mark.slow
def test_large_scene_palette_is_a_sample_of_its_own_sh(tmp_path):
    """Past PALETTE_TRAIN palette entries the writer keeps a seeded sample of the Gaussians' SH."""
    from visionmoe.splat.formats.sog import PALETTE_TRAIN
    from visionmoe.splat.io import GaussianScene

    g = torch.Generator().manual_seed(0)
    n = PALETTE_TRAIN + 200
    scene = GaussianScene(means=torch.randn(n, 3, generator=g), quats=torch.randn(n, 4, generator=g),
                          log_scales=torch.randn(n, 3, generator=g) - 4, opacity_logits=torch.randn(n, generator=g),
                          sh_dc=torch.randn(n, 3, generator=g), sh_rest=0.1 * torch.randn(n, 3, 3, generator=g))
    path = write_sog(scene, tmp_path / "big.sog")
    meta = meta_of(path)
    assert meta["shN"]["count"] == PALETTE_TRAIN == palette_size(n)
    back = read_sog(path)
    src = in_file_order(scene)
    assert back.num_gaussians == n and ((back.sh_rest - src.sh_rest) ** 2).mean().sqrt() < 0.03
    assert ((back.sh_dc - nearest(meta["sh0"]["codebook"], src.sh_dc)).abs() < 1e-5).all()
