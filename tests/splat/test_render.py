"""splat.render backends and the `visionmoe-splat render` command."""

import subprocess
import sys

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from visionmoe.ops import rasterize
from visionmoe.splat import GaussianScene, RenderError, orbit_cameras, render, write_ply
from visionmoe.splat.cli import main


def sphere_scene(N=400, sh_degree=1, seed=0):
    """Coloured Gaussians on a sphere: the top half red, the bottom half blue (world up = -y)."""
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(N, 3, generator=g)
    means = d / d.norm(dim=-1, keepdim=True)
    sh_dc = torch.zeros(N, 3)
    top = means[:, 1] < 0
    sh_dc[top, 0] = 1.5
    sh_dc[~top, 2] = 1.5
    K = (sh_degree + 1) ** 2
    return GaussianScene(
        means=means, quats=torch.randn(N, 4, generator=g), log_scales=torch.full((N, 3), -2.0),
        opacity_logits=torch.full((N,), 3.0), sh_dc=sh_dc, sh_rest=torch.randn(N, K - 1, 3, generator=g) * 0.05,
    )


def test_render_matches_rasterize_and_is_upright():
    scene = sphere_scene()
    cams = orbit_cameras(scene, num_views=2, width=48, height=40)
    out = render(scene, cams, backend="cpu", return_contributions=True)
    want = rasterize(scene.means, scene.quats, scene.log_scales, scene.opacity_logits, scene.sh, cams.viewmats,
                     cams.Ks, 48, 40, sh_degree=1, return_contributions=True)
    torch.testing.assert_close(out.colors, want.colors)
    assert out.contributions.shape == (2, scene.num_gaussians)
    img = out.colors[0]
    assert float(img[:12, :, 0].mean()) > float(img[:12, :, 2].mean())  # red on top
    assert float(img[-12:, :, 2].mean()) > float(img[-12:, :, 0].mean())  # blue at the bottom
    assert torch.equal(render(scene, cams, backend="auto").colors, out.colors)


def test_render_lower_sh_degree_and_background():
    scene = sphere_scene()
    cams = orbit_cameras(scene, num_views=1, width=16, height=16)
    out = render(scene, cams, sh_degree=0, background=[1.0, 1.0, 1.0])
    want = rasterize(scene.means, scene.quats, scene.log_scales, scene.opacity_logits, scene.sh_dc[:, None],
                     cams.viewmats, cams.Ks, 16, 16, sh_degree=0, background=torch.ones(3))
    torch.testing.assert_close(out.colors, want.colors)
    with pytest.raises(RenderError, match="sh_degree must be an int in"):
        render(scene, cams, sh_degree=2)
    with pytest.raises(RenderError, match="backend must be one of"):
        render(scene, cams, backend="opengl")


def test_render_is_differentiable():
    scene = sphere_scene(100)
    scene.sh_dc.requires_grad_()
    cams = orbit_cameras(scene, num_views=1, width=16, height=16)
    render(scene, cams).colors.sum().backward()
    assert scene.sh_dc.grad is not None and float(scene.sh_dc.grad.abs().sum()) > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
@pytest.mark.parametrize("backend", ["cuda", "gsplat"])
def test_gpu_backends_without_gpu_are_clear_errors(backend):
    scene = sphere_scene(10)
    cams = orbit_cameras(scene, num_views=1, width=8, height=8)
    with pytest.raises(RenderError, match="needs a CUDA GPU"):
        render(scene, cams, backend=backend)
    assert "gsplat" not in sys.modules or backend == "gsplat"


@pytest.mark.cuda
def test_cuda_and_gsplat_backends_agree_with_cpu():
    scene = sphere_scene(2000, sh_degree=2)
    cams = orbit_cameras(scene, num_views=2, width=96, height=80)
    cpu = render(scene, cams, backend="cpu")
    gpu = render(scene, cams, backend="cuda")
    torch.testing.assert_close(gpu.colors.cpu(), cpu.colors, atol=2e-3, rtol=1e-3)
    pytest.importorskip("gsplat")
    ref = render(scene.to("cuda"), cams, backend="gsplat")
    assert float((ref.colors.cpu() - cpu.colors).abs().mean()) < 2e-2


# ----------------------------------------------------------------------------- CLI


def test_cli_render_writes_pngs(tmp_path, capsys):
    ply = write_ply(sphere_scene(300), tmp_path / "sphere.ply")
    out = tmp_path / "views"
    assert main(["render", str(ply), "--out", str(out), "--views", "3", "--width", "40", "--height", "32"]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["view_000.png", "view_001.png", "view_002.png"]
    img = iio.imread(out / "view_000.png")
    assert img.shape == (32, 40, 3) and img.dtype == np.uint8 and img.max() > 100
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv_tail, message",
    [(["missing.ply"], "does not exist"), (["bad.ply"], "error:"), (["sphere.ply", "--cameras", "nope.json"], "cannot read")],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, argv_tail, message):
    write_ply(sphere_scene(20), tmp_path / "sphere.ply")
    (tmp_path / "bad.ply").write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 5\nend_header\n\x00")
    argv = ["render"] + [str(tmp_path / a) if a.endswith((".ply", ".json")) else a for a in argv_tail]
    assert main(argv + ["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("visionmoe-splat render: error:") and message in err[0]
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_python_m_entry_point_usage_error():
    proc = subprocess.run([sys.executable, "-m", "visionmoe.splat", "render"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--out" in proc.stderr


def test_several_views_render_as_each_view_alone():
    """Several cameras are binned one thread per camera, one camera by rows of tiles: the
    images are the same bits either way."""
    from pgms_helpers import ASSET

    from visionmoe.splat.encoder.contribution import default_cameras
    from visionmoe.splat.io import read_ply

    scene = read_ply(ASSET)
    cams = default_cameras(scene, num_views=4, size=96)
    with torch.no_grad():
        together = render(scene, cams, return_contributions=True)
        for i in range(len(cams)):
            alone = render(scene, cams[[i]], return_contributions=True)
            assert torch.equal(together.colors[i], alone.colors[0])
            assert torch.equal(together.contributions[i], alone.contributions[0])


def test_resolve_device_names_and_defaults():
    from visionmoe.splat.render import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("tpu", "gpu", 3.5, "meta"):
        with pytest.raises(RenderError, match="device must be"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(RenderError, match="torch sees none"):
            resolve_device("cuda")
