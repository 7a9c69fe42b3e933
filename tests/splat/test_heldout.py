"""Held-out evaluation: default seeded views, the cameras.json hold-out rule, disjointness from
every view the encoder renders, render-vs-render scores, and similarity transforms of scenes."""

import json
import math

import pytest
import torch

from visionmoe.splat.cameras import (
    CameraError, Cameras, load_cameras_json, look_at, pose_distance, scene_frame, transform_cameras,
)
from visionmoe.splat.evaluation import (
    EVAL_SEED, HOLDOUT_EVERY, HeldoutError, check_disjoint, encoder_cameras, heldout_cameras,
    invariance_transforms, quat_from_rotmat, render_views, rotation_matrix, score_views, split_cameras,
    transform_scene,
)
from visionmoe.splat.io import GaussianScene

from pgms_helpers import random_scene


def object_scene(n=600, seed=0, degree=0):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=g) * torch.tensor([0.6, 0.3, 0.4])
    k = (degree + 1) ** 2 - 1
    return GaussianScene(means=means, quats=torch.randn(n, 4, generator=g), log_scales=torch.full((n, 3), -3.0)
                         + 0.3 * torch.randn(n, 3, generator=g), opacity_logits=torch.randn(n, generator=g) + 1,
                         sh_dc=torch.randn(n, 3, generator=g) * 0.6, sh_rest=torch.randn(n, k, 3, generator=g) * 0.2)


def test_default_heldout_views_cover_elevations_azimuths_and_distances():
    scene = object_scene()
    frame = scene_frame(scene)
    cams = heldout_cameras(scene, size=64)
    assert len(cams) == 32 and (cams.width, cams.height) == (64, 64)
    offset = cams.centers.double() - frame.centre
    dist = offset.norm(dim=-1) / frame.orbit_distance()
    assert float(dist.min()) >= 0.5 - 1e-6 and float(dist.max()) <= 1.3 + 1e-6
    assert float(dist.max() - dist.min()) > 0.6  # a viewer zooms in and out
    el = torch.rad2deg(torch.asin((offset / offset.norm(dim=-1, keepdim=True)) @ frame.up))
    assert -30 - 1e-6 <= float(el.min()) < -15 and 45 < float(el.max()) <= 60 + 1e-6
    az = torch.atan2(offset[:, 2], offset[:, 0])
    assert len(set(torch.floor((az + math.pi) / (math.pi / 2)).long().tolist())) == 4  # all four quadrants
    # every camera looks at the scene's centre, near plane scales with the scene
    for i in range(0, 32, 7):
        pc = cams.viewmats[i, :3, :3].double() @ frame.centre + cams.viewmats[i, :3, 3].double()
        assert float(pc[2]) > 0 and float(pc[:2].norm() / pc[2]) < 1e-4
    assert cams.near == pytest.approx(frame.near) and cams.near == pytest.approx(0.01 * frame.size)
    # seeded: reproducible, and another seed draws other views
    assert torch.equal(cams.viewmats, heldout_cameras(scene, size=64).viewmats)
    other = heldout_cameras(scene, size=64, seed=EVAL_SEED + 1)
    assert float(pose_distance(cams, other, frame.size).min()) > 1e-3


@pytest.mark.parametrize("num_views, view_size", [(16, 256), (4, 64), (32, 512)])
def test_heldout_views_never_equal_the_encoders_views(num_views, view_size):
    scene = object_scene()
    frame = scene_frame(scene)
    enc = encoder_cameras(scene, num_views=num_views, view_size=view_size)
    held = heldout_cameras(scene, num_views=64)
    least = check_disjoint(held, enc, frame.size)
    assert least > 0.01
    # a set that contains one of the encoder's poses (at any pixel size) is refused
    leaked = Cameras(torch.cat([held.viewmats[:2], enc.viewmats[2:3]]), held.Ks[:3].clone(), held.width, held.height,
                     held.near, held.far)  # same field of view (50 degrees) as the encoder's views
    with pytest.raises(HeldoutError, match="evaluation camera 2 equals encoder camera 2"):
        check_disjoint(leaked, enc, frame.size)


def test_encoder_cameras_are_the_given_ones():
    scene = object_scene()
    given = heldout_cameras(scene, num_views=5, seed=7)
    assert encoder_cameras(scene, given) is given


def inria_entry(i, view, W=80, H=60, f=70.0):
    c2w = torch.linalg.inv(view.double())
    return {"id": i, "img_name": f"{i:05d}", "width": W, "height": H, "position": c2w[:3, 3].tolist(),
            "rotation": c2w[:3, :3].tolist(), "fx": f, "fy": f}


def test_cameras_json_every_eighth_camera_is_held_out(tmp_path):
    n = 21
    views = [look_at(torch.tensor([3 * math.cos(a), -1.0, 3 * math.sin(a)]), torch.zeros(3), torch.tensor([0.0, -1, 0]))
             for a in torch.linspace(0, 2 * math.pi, n + 1)[:-1].tolist()]
    path = tmp_path / "cameras.json"
    path.write_text(json.dumps([inria_entry(i, v) for i, v in enumerate(views)]))
    split = split_cameras(load_cameras_json(path))
    assert HOLDOUT_EVERY == 8
    assert split.test_index == [0, 8, 16]
    assert split.train_index == [i for i in range(n) if i not in (0, 8, 16)]
    assert len(split.train) == 18 and len(split.test) == 3
    torch.testing.assert_close(split.test.viewmats, torch.stack([views[i] for i in (0, 8, 16)]).float(), atol=1e-5,
                               rtol=0)
    assert check_disjoint(split.test, split.train, 1.0) > 0.1
    assert split_cameras(load_cameras_json(path), every=4).test_index == [0, 4, 8, 12, 16, 20]
    with pytest.raises(CameraError, match="at least 2 cameras"):
        split_cameras(load_cameras_json(path)[[3]])
    with pytest.raises(CameraError, match="every must be"):
        split_cameras(load_cameras_json(path), every=1)


def test_scores_render_vs_render():
    scene = object_scene()
    cams = heldout_cameras(scene, num_views=3, size=48)
    ref = render_views(scene, cams)
    assert ref.shape == (3, 48, 48, 3) and float(ref.max()) > 0.1
    same = score_views(ref, ref, "self")
    assert same.psnr == 100.0 and same.ssim == pytest.approx(1.0) and same.summary()["views"] == 3
    noisy = (ref + 0.01 * torch.randn_like(ref)).clamp(0, 1)
    sc = score_views(ref, noisy)
    assert 38 < sc.psnr < 42 and len(sc.per_view_psnr) == 3  # sigma 0.01 -> ~40 dB (less where clamped)


def test_quaternions_of_rotations():
    from visionmoe.ops._torch_ref import quat_to_rotmat

    for axis, angle in (([1, 0, 0], 90), ([0.2, -1, 0.3], 179.9), ([1, 1, 1], 0.0), ([0, 0, 1], 180)):
        R = rotation_matrix(axis, angle)
        torch.testing.assert_close(quat_to_rotmat(quat_from_rotmat(R)[None])[0], R, atol=1e-9, rtol=0)


@pytest.mark.parametrize("degree", [0, 1, 3])
def test_transformed_scene_looks_the_same_from_transformed_cameras(degree):
    """transform_scene moves positions, orientations, scales and turns the SH bands: the moved
    scene renders from the moved cameras exactly as the original from the original cameras."""
    scene = object_scene(400, degree=degree).to(dtype=torch.float64)
    frame = scene_frame(scene)
    cams = heldout_cameras(scene, num_views=4, size=40)
    ref = render_views(scene, cams.to(dtype=torch.float64))
    for T in invariance_transforms(frame):
        moved = transform_scene(scene, T.rotation, T.translation, T.scale)
        img = render_views(moved, transform_cameras(cams, T.rotation, T.translation, T.scale).to(dtype=torch.float64))
        assert float((img - ref).abs().max()) < 1e-4, T.name
    # SH bands that were not turned would show: the check has teeth
    if degree:
        T = invariance_transforms(frame)[0]
        wrong = transform_scene(scene, T.rotation, T.translation, T.scale)
        wrong.sh_rest.copy_(scene.sh_rest)
        img = render_views(wrong, transform_cameras(cams, T.rotation, T.translation, T.scale).to(dtype=torch.float64))
        assert float((img - ref).abs().max()) > 1e-2


def test_transform_scene_rejects_bad_transforms():
    scene = random_scene(8, degree=0)
    with pytest.raises(ValueError, match="proper"):
        transform_scene(scene, torch.diag(torch.tensor([1.0, 1.0, -1.0])))
    with pytest.raises(ValueError, match="scale"):
        transform_scene(scene, None, None, 0.0)
    with pytest.raises(ValueError, match="count"):
        invariance_transforms(scene_frame(scene), 7)


def test_evaluate_decoded_reports_heldout_and_seen_apart():
    from visionmoe.splat.evaluation import evaluate_decoded

    scene = object_scene(300)
    enc = encoder_cameras(scene, num_views=4, view_size=32)
    held = heldout_cameras(scene, num_views=3, size=48)
    noisy = GaussianScene(**{**scene.__dict__, "sh_dc": scene.sh_dc + 0.05})
    rep = evaluate_decoded(scene, noisy, held, enc, seen_views=2)
    assert 10 < rep.heldout.psnr < 60 and rep.seen is not None and "not held out" in rep.seen.label
    assert len(rep.seen.per_view_psnr) == 2 and rep.separation > 0.01
    assert rep.summary()["heldout"]["views"] == 3
    assert evaluate_decoded(scene, scene, held).heldout.psnr == 100.0
    with pytest.raises(HeldoutError):
        evaluate_decoded(scene, noisy, enc[[0, 1]].scaled(1.5), enc)


def test_eval_command_scores_held_out_views(tmp_path, capsys):
    """visionmoe-splat eval: held-out views by default, every 8th camera of a cameras.json held
    out (the encoder gets the others), the encoder's own views scored apart and labelled."""
    from visionmoe.splat.cli import main
    from visionmoe.splat.io import write_ply

    scene = object_scene(400)
    ply = write_ply(scene, tmp_path / "s.ply")
    fast = ["--refine-steps", "0", "--prune-search", "0", "--views", "4", "--view-size", "32", "--ratio", "6",
            "--quiet", "--eval-size", "32", "--json"]
    assert main(["eval", str(ply), "--eval-views", "3", "--seen-views", "2", *fast]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["views"].startswith("3 held-out views") and res["min_pose_distance"] > 1e-3
    assert res["seen"]["views"].startswith("2 views the encoder saw") and res["psnr_db"] > 15
    frame = scene_frame(scene)
    views = [look_at(frame.centre + 2.5 * frame.size * torch.tensor([math.cos(a), -0.3, math.sin(a)],
                                                                   dtype=torch.float64),
                     frame.centre, torch.tensor([0.0, -1, 0])) for a in torch.linspace(0, 6.0, 10).tolist()]
    cams = tmp_path / "cameras.json"
    cams.write_text(json.dumps([inria_entry(i, v, 64, 64, 60.0) for i, v in enumerate(views)]))
    assert main(["eval", str(ply), "--cameras", str(cams), "--seen-views", "0", *fast]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["views"].startswith("2 held-out cameras (every 8th") and res["seen"] is None
