"""scripts/make_float_scenes.py: a fresh float 3DGS fitted to renders of a scene (smoke test at
toy size: the count asked for, values on no grid, the fit improves, the file reads back)."""

import torch

from visionmoe.splat.evaluation import heldout_cameras, render_views, score_views
from visionmoe.splat.io import GaussianScene, read_ply, write_ply


def source_scene(n=400):
    g = torch.Generator().manual_seed(1)
    # a lossy-looking source: every value on a coarse grid
    q = lambda t, step: torch.round(t / step) * step  # noqa: E731
    return GaussianScene(means=q(torch.randn(n, 3, generator=g) * 0.5, 0.01),
                         quats=q(torch.randn(n, 4, generator=g), 0.1),
                         log_scales=q(torch.full((n, 3), -2.5) + 0.2 * torch.randn(n, 3, generator=g), 0.05),
                         opacity_logits=q(torch.randn(n, generator=g) + 2, 0.25),
                         sh_dc=q(torch.randn(n, 3, generator=g) * 0.7, 0.05), sh_rest=torch.zeros(n, 0, 3))


def test_fit_makes_a_float_scene_of_the_asked_count(tmp_path, load_script):
    mod = load_script("make_float_scenes")
    src = source_scene()
    fitted = mod.fit(src, gaussians=250, steps=40, size=32, views_per_step=2, sh_degree=1, seed=0, log_every=0)
    assert fitted.num_gaussians == 250 and fitted.sh_degree == 1
    for name in ("means", "log_scales", "opacity_logits", "sh_dc"):
        t = getattr(fitted, name)
        assert torch.isfinite(t).all(), name
    # values on no grid: hardly any repeat (the source's sit on a 0.01 grid)
    assert torch.unique(fitted.means[:, 0]).numel() > 0.95 * 250
    # it learns: on views it never trained on, the fit is closer to the source than its start
    init = mod.fit(src, gaussians=250, steps=0, size=32, views_per_step=2, sh_degree=1, seed=0, log_every=0)
    cams = heldout_cameras(src, num_views=4, size=48)
    ref = render_views(src, cams)
    assert score_views(ref, render_views(fitted, cams)).psnr > score_views(ref, render_views(init, cams)).psnr + 1
    path = write_ply(fitted, tmp_path / "fit.ply")
    back = read_ply(path)
    torch.testing.assert_close(back.means, fitted.means)
    # the same seed starts from the same scene
    again = mod.fit(src, gaussians=250, steps=0, size=32, views_per_step=2, sh_degree=1, seed=0, log_every=0)
    assert torch.equal(again.means, init.means)


def test_training_views_stay_in_the_asked_band(load_script):
    from visionmoe.splat.cameras import scene_frame

    mod = load_script("make_float_scenes")
    frame = scene_frame(source_scene())
    cams = mod.random_cameras(frame, 200, 16, torch.Generator().manual_seed(0), elevations=(-30.0, 60.0))
    off = cams.centers.double() - frame.centre
    el = torch.rad2deg(torch.asin((off / off.norm(dim=-1, keepdim=True)) @ frame.up))
    assert float(el.min()) >= -30 - 1e-4 and float(el.max()) <= 60 + 1e-4 and float(el.max() - el.min()) > 70
    whole = mod.random_cameras(frame, 200, 16, torch.Generator().manual_seed(0))
    off = whole.centers.double() - frame.centre
    el = torch.rad2deg(torch.asin((off / off.norm(dim=-1, keepdim=True)) @ frame.up))
    assert float(el.min()) < -60 and float(el.max()) > 60
