"""scripts/bench_compress.py: the encoder's view size reaches compress(), and a bad one is a
one-line error before anything is written."""

import sys

import torch

from visionmoe.splat.io import GaussianScene, write_ply


def small_scene(n=300):
    g = torch.Generator().manual_seed(3)
    return GaussianScene(means=torch.randn(n, 3, generator=g) * 0.5, quats=torch.randn(n, 4, generator=g),
                         log_scales=torch.full((n, 3), -2.5) + 0.2 * torch.randn(n, 3, generator=g),
                         opacity_logits=torch.randn(n, generator=g) + 2, sh_dc=torch.randn(n, 3, generator=g) * 0.7,
                         sh_rest=torch.zeros(n, 0, 3))


def test_a_bad_view_size_is_a_one_line_error_and_writes_nothing(tmp_path, monkeypatch, capsys, load_script):
    mod = load_script("bench_compress")
    out = tmp_path / "bench"
    monkeypatch.setattr(sys, "argv", ["bench_compress.py", "--no-peers", "--view-size", "0", "--out", str(out)])
    assert mod.main() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --view-size must be a positive number of pixels, got 0"]
    assert not out.exists()


def test_the_view_size_reaches_the_encoder(tmp_path, monkeypatch, load_script):
    mod = load_script("bench_compress")
    ply = tmp_path / "small.ply"
    write_ply(small_scene(), ply)
    seen = []
    real = mod.compress

    def spy(scene, **kw):
        seen.append(kw.get("view_size"))
        return real(scene, **kw)

    monkeypatch.setattr(mod, "compress", spy)
    monkeypatch.setattr(sys, "argv", ["bench_compress.py", "--scenes", str(ply), "--targets", "20", "--views", "2",
                                      "--size", "32", "--seen-views", "0", "--no-peers", "--view-size", "48",
                                      "--out", str(tmp_path / "bench")])
    torch.manual_seed(0)
    assert mod.main() == 0
    assert seen == [48]
