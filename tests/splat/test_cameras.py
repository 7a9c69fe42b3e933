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


# ----------------------------------------------------------------------------- scale-free helpers

from visionmoe.splat.cameras import (  # noqa: E402
    NEAR_FRACTION, frame_cameras, pose_distance, scene_frame, sphere_directions, transform_cameras,
)
from visionmoe.splat.evaluation import rotation_matrix, transform_scene  # noqa: E402


def elevations(dirs, up):
    return torch.rad2deg(torch.asin((dirs @ up).clamp(-1, 1)))


def test_sphere_directions_cover_the_band_evenly():
    up = torch.tensor([0.0, -1.0, 0.0], dtype=torch.float64)
    full = sphere_directions(400)
    torch.testing.assert_close(full.norm(dim=-1), torch.ones(400, dtype=torch.float64))
    assert float(full.mean(0).norm()) < 0.02  # area-uniform: no side favoured
    band = sphere_directions(64, min_elevation_deg=-30, max_elevation_deg=60, seed=3)
    el = elevations(band, up)
    assert float(el.min()) >= -30 - 1e-9 and float(el.max()) <= 60 + 1e-9
    # equal area per point: as many directions below the median sine as above it
    mid = (math.sin(math.radians(-30)) + math.sin(math.radians(60))) / 2
    assert abs(int(((band @ up) < mid).sum()) - 32) <= 2
    az = torch.atan2(band[:, 2], band[:, 0])
    assert len(set((torch.floor((az + math.pi) / (math.pi / 4))).long().tolist())) == 8  # every 45-degree sector
    assert torch.equal(band, sphere_directions(64, min_elevation_deg=-30, max_elevation_deg=60, seed=3))
    assert not torch.allclose(band, sphere_directions(64, min_elevation_deg=-30, max_elevation_deg=60, seed=4))
    with pytest.raises(CameraError, match="elevations"):
        sphere_directions(4, min_elevation_deg=10, max_elevation_deg=0)
    with pytest.raises(CameraError, match="positive int"):
        sphere_directions(0)


def test_scene_frame_is_robust_and_matches_orbit_cameras():
    scene = blob_scene(400)
    frame = scene_frame(scene)
    cams = orbit_cameras(scene, num_views=3, width=32, height=32)
    torch.testing.assert_close((cams.centers.double() - frame.centre).norm(dim=-1),
                               torch.full((3,), frame.orbit_distance(), dtype=torch.float64), atol=1e-4, rtol=1e-5)
    assert frame.near == pytest.approx(NEAR_FRACTION * frame.size)
    R = frame.axes
    torch.testing.assert_close(R @ R.T, torch.eye(3, dtype=torch.float64), atol=1e-9, rtol=0)
    assert float(torch.linalg.det(R)) == pytest.approx(1.0)
    assert abs(float(R[0, 0])) > 0.9 or abs(float(R[0, 2])) > 0.9  # blob is widest in x and z, thin in y
    # inf/NaN and -inf opacity logits, non-finite positions: ignored, the frame stays finite
    bad = blob_scene(400)
    bad.opacity_logits[:50] = float("inf")
    bad.opacity_logits[50:100] = -float("inf")
    bad.means[100:110] = float("nan")
    f2 = scene_frame(bad)
    assert torch.isfinite(f2.centre).all() and math.isfinite(f2.size) and f2.size > 0
    empty = blob_scene(5)
    empty.opacity_logits[:] = -float("inf")
    assert scene_frame(empty).size == 1.0


SIMILARITIES = [
    (torch.eye(3, dtype=torch.float64), [0.0, 0.0, 0.0], 1e-3),
    (torch.eye(3, dtype=torch.float64), [0.0, 0.0, 0.0], 1e3),
    (rotation_matrix([0.3, 1.0, 0.2], 37.0), [5.0, -3.0, 2.0], 1.7),
    (rotation_matrix([1.0, 0.0, 0.0], 90.0), [0.0, 100.0, 0.0], 0.2),
    (rotation_matrix([-0.5, 0.8, 0.6], 123.0), [-0.01, 0.02, 0.0], 0.01),
]


@pytest.mark.parametrize("R, t, s", SIMILARITIES)
def test_frame_cameras_frame_a_moved_scene_alike(R, t, s):
    """Scale-free cameras: for the scene moved by x -> s R x + t (up turned with it), the frame
    and the generated cameras move with it: every scene point lands on the same pixel, at the
    same depth relative to the scene size, and the clip planes scale."""
    scene = blob_scene(300)
    t = torch.tensor(t, dtype=torch.float64)
    moved = transform_scene(scene.to(dtype=torch.float64), R, t, s)
    f, g = scene_frame(scene), scene_frame(moved, up=R @ torch.tensor([0.0, -1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(g.centre, s * R @ f.centre + t, atol=1e-6 * max(1.0, s) + 1e-9 * t.norm(), rtol=1e-6)
    assert g.size == pytest.approx(s * f.size, rel=1e-6)
    torch.testing.assert_close(g.axes, f.axes @ R.T, atol=1e-6, rtol=0)
    dirs = sphere_directions(12, min_elevation_deg=-30, max_elevation_deg=60, up=f.up, seed=1,
                             azimuth_origin=f.azimuth_origin)
    dirs_m = sphere_directions(12, min_elevation_deg=-30, max_elevation_deg=60, up=g.up, seed=1,
                               azimuth_origin=g.azimuth_origin)
    a = frame_cameras(f, dirs, torch.linspace(0.5, 1.3, 12), 48, 40)
    b = frame_cameras(g, dirs_m, torch.linspace(0.5, 1.3, 12), 48, 40)
    assert b.near == pytest.approx(s * a.near) and b.far == pytest.approx(s * a.far)
    same = transform_cameras(a, R, t, s)
    assert float(pose_distance(same, b, g.size).diagonal().max()) < 1e-4  # float32 viewmats
    for i in (0, 5, 11):
        for p in (scene.means[3].double(), scene.means[200].double()):
            uv, z = project(a.viewmats[i].double(), a.Ks[i].double(), p)
            uv2, z2 = project(b.viewmats[i].double(), b.Ks[i].double(), s * R @ p + t)
            torch.testing.assert_close(uv2, uv, atol=2e-3, rtol=0)
            assert float(z2 / g.size) == pytest.approx(float(z / f.size), rel=1e-4)  # float32 viewmats


def test_frame_cameras_handle_the_poles_and_bad_input():
    f = scene_frame(blob_scene(100))
    cams = frame_cameras(f, torch.stack([f.up, -f.up]), 1.0, 16, 16)  # straight down and up: still valid
    R = cams.viewmats[:, :3, :3].double()
    torch.testing.assert_close(R @ R.transpose(1, 2), torch.eye(3, dtype=torch.float64).expand(2, 3, 3), atol=1e-6,
                               rtol=0)
    with pytest.raises(CameraError, match="directions"):
        frame_cameras(f, torch.zeros(1, 3), 1.0)
    with pytest.raises(CameraError, match="distances must be one number or 2"):
        frame_cameras(f, torch.eye(3)[:2], [1.0, 2.0, 3.0])
    with pytest.raises(CameraError, match="positive"):
        frame_cameras(f, torch.eye(3)[:2], -1.0)


def test_pose_distance_is_zero_only_for_the_same_view():
    f = scene_frame(blob_scene(100))
    a = frame_cameras(f, sphere_directions(5, seed=0), 1.0, 32, 32)
    d = pose_distance(a, a, f.size)
    assert float(d.diagonal().abs().max()) < 1e-6 and float((d + torch.eye(5, dtype=torch.float64)).min()) > 0.05
    bigger = a.scaled(2)  # same pose and field of view at another pixel size: the same view
    assert float(pose_distance(a, bigger, f.size).diagonal().max()) < 1e-6


def skewed_scene(n=400, seed=2):
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) ** 2) * torch.tensor([1.0, 0.3, 0.6])  # distinct spreads, skewed
    return GaussianScene(means=means, quats=torch.tensor([1.0, 0, 0, 0]).expand(n, 4).clone(),
                         log_scales=torch.full((n, 3), -4.0), opacity_logits=torch.full((n,), 2.0),
                         sh_dc=torch.zeros(n, 3), sh_rest=torch.zeros(n, 0, 3))


@pytest.mark.parametrize("R, t, s", SIMILARITIES)
def test_coverage_cameras_move_with_the_scene(R, t, s):
    """The encoder-side views need no up axis: they come from the scene's principal frame, so a
    moved scene gets the moved cameras (same images), whatever its orientation and units."""
    from visionmoe.splat.cameras import coverage_cameras
    from visionmoe.splat.evaluation import render_views

    scene = skewed_scene()
    moved = transform_scene(scene.to(dtype=torch.float64), R, torch.tensor(t, dtype=torch.float64), s)
    a = coverage_cameras(scene, 20, 32, distances=(1.0, 0.6))
    b = coverage_cameras(moved, 20, 32, distances=(1.0, 0.6))
    same = transform_cameras(a, R, torch.tensor(t, dtype=torch.float64), s)
    assert float(pose_distance(same, b, scene_frame(moved).size).diagonal().max()) < 1e-4
    assert b.near == pytest.approx(s * a.near, rel=1e-5)
    img_a, img_b = render_views(scene, a), render_views(moved.to(dtype=torch.float32), b)
    assert float((img_a - img_b).abs().max()) < 0.02


def test_coverage_cameras_see_the_whole_sphere():
    from visionmoe.splat.cameras import coverage_cameras

    scene = skewed_scene()
    f = scene_frame(scene)
    cams = coverage_cameras(scene, 32, 16, distances=(1.0, 0.6))
    off = cams.centers.double() - f.centre
    dist = off.norm(dim=-1) / f.orbit_distance()
    torch.testing.assert_close(dist[0::2], torch.ones(16, dtype=torch.float64), atol=1e-5, rtol=0)
    torch.testing.assert_close(dist[1::2], torch.full((16,), 0.6, dtype=torch.float64), atol=1e-5, rtol=0)
    dirs = off / off.norm(dim=-1, keepdim=True)
    # every axis direction, both ways, has a camera within 40 degrees
    for axis in torch.cat([torch.eye(3), -torch.eye(3)]).double():
        assert float((dirs @ axis).max()) > math.cos(math.radians(40))
    with pytest.raises(CameraError, match="distances"):
        coverage_cameras(scene, 4, 16, distances=())
