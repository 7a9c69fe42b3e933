"""Real-scene statistics as fixtures: the cases trained captures contain and synthetic test
scenes do not (|f_dc| up to 15, infinite or huge opacity logits, degenerate or huge scales,
30% exact duplicates, a scene that is mostly background). Each builder makes what it says;
the evaluation tools (scene frame, held-out views, renders, scores) stay sane on each."""

import math

import pytest
import torch

from visionmoe.splat.cameras import scene_frame
from visionmoe.splat.evaluation import heldout_cameras, render_views, score_views
from visionmoe.splat.io import GaussianScene

FIELDS = ("means", "quats", "log_scales", "opacity_logits", "sh_dc", "sh_rest")


def object_scene(n: int = 1500, seed: int = 0) -> GaussianScene:
    g = torch.Generator().manual_seed(seed)
    return GaussianScene(
        means=torch.randn(n, 3, generator=g) * torch.tensor([0.6, 0.3, 0.4]), quats=torch.randn(n, 4, generator=g),
        log_scales=torch.full((n, 3), -3.5) + 0.3 * torch.randn(n, 3, generator=g),
        opacity_logits=torch.randn(n, generator=g) + 1, sh_dc=torch.randn(n, 3, generator=g) * 0.6,
        sh_rest=torch.zeros(n, 0, 3))


def large_dc(s: GaussianScene) -> GaussianScene:
    """One Gaussian in 7 with DC colour coefficients up to |15| (saturated colours, seen in
    trained captures: the renderer clamps them, so they are visible as pure colours)."""
    dc = s.sh_dc.clone()
    dc[::7] = (dc[::7] * 25).clamp(-15, 15)
    dc[0] = torch.tensor([15.0, -15.0, 15.0])
    return GaussianScene(**{**{f: getattr(s, f) for f in FIELDS}, "sh_dc": dc})


def extreme_opacity(s: GaussianScene) -> GaussianScene:
    """+inf, -inf, +1e4 and -1e4 opacity logits, one Gaussian in 11 each."""
    op = s.opacity_logits.clone()
    op[::11], op[1::11], op[2::11], op[3::11] = math.inf, -math.inf, 1e4, -1e4
    return GaussianScene(**{**{f: getattr(s, f) for f in FIELDS}, "opacity_logits": op})


def degenerate_scales(s: GaussianScene) -> GaussianScene:
    """Flat discs (one log-scale -30), points (all three -25) and a few Gaussians larger than
    the scene (log-scale +3: 20 units on a 1-unit object)."""
    ls = s.log_scales.clone()
    ls[::9, 2] = -30.0
    ls[1::9] = -25.0
    ls[2::97] = 3.0
    return GaussianScene(**{**{f: getattr(s, f) for f in FIELDS}, "log_scales": ls})


def duplicated(s: GaussianScene, share: float = 0.3) -> GaussianScene:
    """The scene plus exact copies of its first Gaussians, so that ``share`` of the result are duplicates."""
    n = s.num_gaussians
    extra = int(round(share * n / (1 - share)))
    return s.subset(torch.cat([torch.arange(n), torch.arange(extra) % n]))


def mostly_background(s: GaussianScene, share: float = 0.8, radius: float = 50.0) -> GaussianScene:
    """The object inside a shell of large opaque background Gaussians at ``radius`` (a sky or
    far walls), ``share`` of all Gaussians."""
    n = s.num_gaussians
    m = int(round(share * n / (1 - share)))
    g = torch.Generator().manual_seed(5)
    d = torch.randn(m, 3, generator=g)
    bg = GaussianScene(means=d / d.norm(dim=-1, keepdim=True) * radius, quats=torch.randn(m, 4, generator=g),
                       log_scales=torch.full((m, 3), 0.5), opacity_logits=torch.full((m,), 3.0),
                       sh_dc=torch.rand(m, 3, generator=g), sh_rest=torch.zeros(m, 0, 3))
    return GaussianScene(**{f: torch.cat([getattr(s, f), getattr(bg, f)]) for f in FIELDS})


CASES = {"large_dc": large_dc, "extreme_opacity": extreme_opacity, "degenerate_scales": degenerate_scales,
         "duplicated": duplicated, "mostly_background": mostly_background}


def test_fixtures_are_what_they_say():
    s = object_scene()
    assert float(large_dc(s).sh_dc.abs().max()) == 15.0 and float((large_dc(s).sh_dc.abs() > 3).float().mean()) > 0.05
    op = extreme_opacity(s).opacity_logits
    assert bool(torch.isposinf(op).any() and torch.isneginf(op).any())
    assert float(op[torch.isfinite(op)].abs().max()) == 1e4
    ls = degenerate_scales(s).log_scales
    assert float(ls.min()) == -30.0 and float(ls.max()) == 3.0
    d = duplicated(s)
    unique = torch.unique(torch.cat([d.means, d.sh_dc, d.log_scales], 1), dim=0).shape[0]
    assert (d.num_gaussians - unique) / d.num_gaussians == pytest.approx(0.3, abs=0.01)
    b = mostly_background(s)
    assert float((b.means.norm(dim=-1) > 10).float().mean()) == pytest.approx(0.8, abs=0.01)


@pytest.mark.parametrize("case", [c for c in CASES if c != "mostly_background"])
def test_frame_and_heldout_views_ignore_extreme_values(case):
    """Values that do not move the Gaussians' centres leave the evaluation frame where it was
    (within the weight shift: duplicates and infinite logits re-weight the same positions)."""
    s = object_scene()
    f0, f = scene_frame(s), scene_frame(CASES[case](s))
    assert torch.isfinite(f.centre).all() and torch.isfinite(f.axes).all()
    assert float((f.centre - f0.centre).norm()) < 0.1 * f0.size
    assert f.size == pytest.approx(f0.size, rel=0.1)


@pytest.mark.parametrize("case", list(CASES))
def test_renders_and_scores_stay_finite(case):
    s = CASES[case](object_scene(600))
    cams = heldout_cameras(s, num_views=3, size=32)
    img = render_views(s, cams)
    assert torch.isfinite(img).all() and float(img.max()) > 0.05  # the views see the scene
    sc = score_views(img, img.flip(0))
    assert math.isfinite(sc.psnr) and math.isfinite(sc.ssim)


def test_mostly_background_frame_spans_the_background():
    """The default frame weighs every Gaussian alike: with 80% of them on a far shell it spans
    the shell (views from outside it). Held-out views of such a scene should come from its
    cameras.json (split_cameras); documented in docs/EVALUATION.md."""
    s = mostly_background(object_scene(600))
    f = scene_frame(s)
    assert f.size == pytest.approx(50.0, rel=0.05)
