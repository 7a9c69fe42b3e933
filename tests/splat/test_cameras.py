"""Cameras: orbit generation (centre, distance, up axis, determinism) and INRIA cameras.json."""

import json
import math

import pytest
import torch

from visionmoe.splat.cameras import CameraError, Cameras, load_cameras_json, look_at, orbit_cameras
from visionmoe.splat.io import GaussianScene


def blob_scene(N=500, centre=(1.0, -2.0, 0.5), seed=0):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(N, 3, generator=g) * torch.tensor([1.0, 0.5, 1.0]) + torch.tensor(centre)
    return GaussianScene(
        means=means, quats=torch.tensor([1.0, 0, 0, 0]).expand(N, 4).clone(), log_scales=torch.full((N, 3), -3.0),
        opacity_logits=torch.full((N,), 2.0), sh_dc=torch.zeros(N, 3), sh_rest=torch.zeros(N, 0, 3),
    )


def project(view, K, point):
    pc = view[:3, :3] @ point + view[:3, 3]
    return (K[:2, :2] @ (pc[:2] / pc[2]) + K[:2, 2]), pc[2]


def test_orbit_looks_at_weighted_centre_and_is_deterministic():
    scene = blob_scene()
    cams = orbit_cameras(scene, num_views=6, width=64, height=48)
    again = orbit_cameras(scene, num_views=6, width=64, height=48)
    assert torch.equal(cams.viewmats, again.viewmats) and len(cams) == 6
    centre = scene.means.mean(0)  # equal opacities: the weighted centre is the plain mean
    for i in range(6):
        uv, z = project(cams.viewmats[i].double(), cams.Ks[i].double(), centre.double())
        assert z > 0
        torch.testing.assert_close(uv, torch.tensor([32.0, 24.0], dtype=torch.float64), atol=1e-3, rtol=0)
        R = cams.viewmats[i, :3, :3].double()
        torch.testing.assert_close(R @ R.T, torch.eye(3, dtype=torch.float64), atol=1e-6, rtol=0)
    dists = (cams.centers - centre).norm(dim=-1)
    torch.testing.assert_close(dists, dists[:1].expand(6), atol=1e-4, rtol=1e-4)  # one orbit radius


def test_orbit_weights_by_opacity():
    scene = blob_scene(200)
    scene.opacity_logits[:100] = -20.0  # first half invisible
    scene.means[:100] += 100.0
    cams = orbit_cameras(scene, num_views=2, width=32, height=32)
    uv, z = project(cams.viewmats[0].double(), cams.Ks[0].double(), scene.means[100:].mean(0).double())
    assert z > 0 and float((uv - 16).abs().max()) < 1.0


def test_orbit_up_axis_points_up_in_the_image():
    scene = blob_scene(centre=(0.0, 0.0, 0.0))
    for up, vec in (("-y", [0.0, -1.0, 0.0]), ("+z", [0.0, 0.0, 1.0])):
        cams = orbit_cameras(scene, num_views=4, width=32, height=32, up=up, elevation_deg=0.0)
        for i in range(4):
            top, _ = project(cams.viewmats[i].double(), cams.Ks[i].double(), torch.tensor(vec, dtype=torch.float64))
            assert top[1] < 16 - 1  # image y grows downwards: "up" lands above the centre


def test_orbit_bad_arguments():
    scene = blob_scene(10)
    with pytest.raises(CameraError, match="num_views"):
        orbit_cameras(scene, num_views=0)
    with pytest.raises(CameraError, match="up must be"):
        orbit_cameras(scene, up="w")
    with pytest.raises(CameraError, match="fov_deg"):
        orbit_cameras(scene, fov_deg=190)


def test_cameras_validation_and_indexing():
    cams = orbit_cameras(blob_scene(10), num_views=3, width=8, height=6)
    assert len(cams[1]) == 1 and len(cams[0:2]) == 2
    with pytest.raises(CameraError, match=r"Ks must be a tensor of shape \(3, 3, 3\)"):
        Cameras(cams.viewmats, cams.Ks[:2], 8, 6)
    with pytest.raises(CameraError, match="width must be a positive int"):
        Cameras(cams.viewmats, cams.Ks, 0, 6)


def inria_entry(i, view, W, H, fx, fy):
    c2w = torch.linalg.inv(view.double())
    return {"id": i, "img_name": f"{i:05d}", "width": W, "height": H,
            "position": c2w[:3, 3].tolist(), "rotation": c2w[:3, :3].tolist(), "fx": fx, "fy": fy}


def test_load_cameras_json_roundtrip(tmp_path):
    views = [look_at(torch.tensor([3.0, -1.0, 2.0 + i]), torch.zeros(3), torch.tensor([0.0, -1.0, 0.0])) for i in range(3)]
    path = tmp_path / "cameras.json"
    path.write_text(json.dumps([inria_entry(i, v, 80, 60, 70.0, 71.0) for i, v in enumerate(views)]))
    cams = load_cameras_json(path)
    assert (cams.width, cams.height) == (80, 60)
    torch.testing.assert_close(cams.viewmats, torch.stack(views).float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(cams.Ks[0], torch.tensor([[70.0, 0, 40], [0, 71.0, 30], [0, 0, 1]]))
    half = load_cameras_json(path, width=40, height=30)
    torch.testing.assert_close(half.Ks[0], torch.tensor([[35.0, 0, 20], [0, 35.5, 15], [0, 0, 1]]))


@pytest.mark.parametrize(
    "content, match",
    [("{not json", "not valid JSON"), ("[]", "non-empty JSON list"), ('[{"width": 4}]', "camera 0 needs"),
     ('[{"width": 4, "height": 4, "position": [0,0,0], "rotation": [[1,0,0],[0,1,0],[0,0,1]], "fx": -1, "fy": 1}]',
      "invalid values")],
)
def test_load_cameras_json_errors(tmp_path, content, match):
    path = tmp_path / "cameras.json"
    path.write_text(content)
    with pytest.raises(CameraError, match=match):
        load_cameras_json(path)
    with pytest.raises(CameraError, match="cannot read"):
        load_cameras_json(tmp_path / "missing.json")


def test_concat_keeps_order_and_rejects_mismatched_sizes():
    scene = blob_scene(10)
    a = orbit_cameras(scene, num_views=2, width=16, height=16)
    b = orbit_cameras(scene, num_views=3, width=16, height=16, elevation_deg=45.0)
    both = Cameras.concat([a, b])
    assert len(both) == 5
    assert torch.equal(both.viewmats[:2], a.viewmats) and torch.equal(both.viewmats[2:], b.viewmats)
    with pytest.raises(CameraError, match="image size"):
        Cameras.concat([a, orbit_cameras(scene, num_views=1, width=8, height=16)])
    with pytest.raises(CameraError, match="at least one"):
        Cameras.concat([])


def test_scaled_cameras_see_the_same_image_at_another_size():
    """A point projects to factor x its pixel coordinates (corner origin) in the scaled cameras,
    and a render at twice the size, averaged over 2x2 blocks, is close to the render at the size."""
    from visionmoe.splat.render import render

    scene = blob_scene(300)
    scene.log_scales.fill_(-1.5)  # several pixels wide: the renderer's fixed 0.3 px blur is negligible
    scene.opacity_logits.fill_(-2.0)
    cams = orbit_cameras(scene, num_views=2, width=40, height=30)
    big = cams.scaled(2)
    assert (big.width, big.height) == (80, 60) and torch.equal(big.viewmats, cams.viewmats)
    for i in range(2):
        p = scene.means[7].double()
        uv, _ = project(cams.viewmats[i].double(), cams.Ks[i].double(), p)
        uv2, _ = project(big.viewmats[i].double(), big.Ks[i].double(), p)
        torch.testing.assert_close(uv2, 2 * uv, atol=1e-4, rtol=1e-6)
    with torch.no_grad():
        small, large = render(scene, cams).colors, render(scene, big).colors
    pooled = large.reshape(2, 30, 2, 40, 2, 3).mean((2, 4))
    assert float((pooled - small).abs().mean()) < 0.07 * float(small.abs().mean())  # 5% here; 1 px off: 10%
    assert cams.scaled(1.5).width == 60
    for bad in (0, -1.0, float("nan"), "2"):
        with pytest.raises(CameraError, match="scale factor"):
            cams.scaled(bad)
