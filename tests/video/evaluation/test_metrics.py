"""Physics proxies: ground-truth synthetic clips score as physical; negative controls
(shuffled, time-reversed where it matters, dropped frames) score worse."""

import csv
import json
import os

import numpy as np
import pytest

from visionmoe.video.evaluation import benchmarks as B
from visionmoe.video.evaluation import controls as C
from visionmoe.video.evaluation import metrics as M
from visionmoe.video.data.synthetic import generate_clip

SEEDS = range(4)


@pytest.fixture(scope="module")
def clips():
    return {(s, k): generate_clip(s, k) for s in ("free_fall", "bounce", "projectile", "pendulum", "sliding", "smoke")
            for k in SEEDS}


@pytest.mark.parametrize("scenario", ["free_fall", "bounce", "projectile"])
def test_ground_truth_falls_are_physical_and_gravity_is_recovered(clips, scenario):
    for k in SEEDS:
        clip = clips[scenario, k]
        fit = M.gravity_fit(clip.frames)
        assert fit.falling and fit.physical, (scenario, k, fit)
        assert fit.accel == pytest.approx(clip.params["g"], rel=0.3)
        assert fit.residual_quadratic < 0.5
        if scenario == "bounce":
            assert fit.restitution < 1.0


@pytest.mark.parametrize("scenario", ["free_fall", "bounce", "projectile", "pendulum", "sliding", "smoke"])
def test_shuffled_frames_score_worse(clips, scenario):
    for k in SEEDS:
        fr = clips[scenario, k].frames
        sh = C.shuffle_frames(fr, seed=k)
        w0, w1 = M.flow_warp_error(fr), M.flow_warp_error(sh)
        a0, a1 = M.acceleration_consistency(fr), M.acceleration_consistency(sh)
        assert w1["warp_error"] > 1.3 * w0["warp_error"], (scenario, k, w0, w1)
        assert a1["accel_inconsistency"] > 3 * a0["accel_inconsistency"], (scenario, k, a0, a1)
        if scenario in ("free_fall", "bounce", "projectile"):
            assert not M.gravity_fit(sh).physical


@pytest.mark.parametrize("scenario", ["free_fall", "projectile", "pendulum"])
def test_dropped_frames_score_worse(clips, scenario):
    for k in SEEDS:
        fr = clips[scenario, k].frames
        dr = C.drop_frames(fr, num=2, seed=k)
        assert M.acceleration_consistency(dr)["accel_inconsistency"] > 1.2 * M.acceleration_consistency(fr)["accel_inconsistency"]
        if scenario != "pendulum":
            g0, g1 = M.gravity_fit(fr), M.gravity_fit(dr)
            assert g1.residual_quadratic > 2 * g0.residual_quadratic, (scenario, k, g0, g1)


@pytest.mark.parametrize("scenario", ["free_fall", "projectile"])
def test_object_hidden_for_two_frames_is_not_a_jump(clips, scenario):
    # the centroid track is split where the object is not found: differences across the gap
    # would read two frames of motion as one and score a smooth fall as jerky
    for k in SEEDS:
        fr = clips[scenario, k].frames
        hidden = fr.copy()
        hidden[8:10] = np.median(fr, axis=0).astype(np.uint8)  # the background alone
        assert np.isnan(M.object_track(hidden)[8:10]).all()
        a0, a1 = M.acceleration_consistency(fr), M.acceleration_consistency(hidden)
        assert a1["accel_inconsistency"] < 2 * a0["accel_inconsistency"] + 0.1, (scenario, k, a0, a1)
        # the score pools the KLT tracks and the centroid runs: it lies between the two parts
        parts = sorted((a0["accel_inconsistency_klt"], a0["accel_inconsistency_object"]))
        assert parts[0] - 1e-9 <= a0["accel_inconsistency"] <= parts[1] + 1e-9, a0


def test_time_reversal_where_it_matters(clips):
    # a bounce that gains height and a slide that accelerates by itself are unphysical;
    # a free fall reversed is a throw upwards, still physical (the control is not applied)
    for k in SEEDS:
        b = clips["bounce", k].frames
        assert M.gravity_fit(b).restitution < 1.0
        rev = M.gravity_fit(C.reverse_frames(b))
        assert rev.restitution > 1.0 and not rev.physical
        s = clips["sliding", k].frames
        assert M.acceleration_consistency(s)["tangential_accel"] < -0.05
        assert M.acceleration_consistency(C.reverse_frames(s))["tangential_accel"] > 0.05
        assert M.gravity_fit(C.reverse_frames(clips["free_fall", k].frames)).physical


def test_static_and_flicker():
    clip = generate_clip("free_fall", 0)
    still = np.repeat(clip.frames[:1], 9, axis=0)
    w = M.flow_warp_error(still)
    assert w["motion"] == 0 and w["flicker"] == 0 and w["warp_error"] == 0
    rng = np.random.default_rng(0)
    noisy = np.clip(still.astype(np.int16) + rng.integers(-12, 13, size=(9, 1, 1, 1)), 0, 255).astype(np.uint8)
    assert M.flow_warp_error(noisy)["flicker"] > 0.01  # global brightness flicker
    with pytest.raises(ValueError, match="\\[F, H, W, 3\\]"):
        M.flow_warp_error(still[..., 0])


def test_score_video_row():
    row = M.score_video(generate_clip("projectile", 0).frames)
    for key in ("warp_error", "flicker", "motion", "accel_inconsistency", "gravity_accel", "gravity_physical"):
        assert key in row


def test_exports(tmp_path):
    vid = tmp_path / "a.mp4"
    vid.write_bytes(b"\x00" * 16)
    pj = tmp_path / "prompts.json"
    pj.write_text(json.dumps([{"caption": "a ball falls", "physical_laws": "gravity"}, {"caption": "ice melts"}]))
    out = B.export_phygenbench(str(pj), {1: str(vid)}, str(tmp_path / "pgb"))
    assert os.path.isfile(os.path.join(out, "output_video_2.mp4"))
    pc = tmp_path / "videophy2.csv"
    with open(pc, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["caption", "action"])
        w.writeheader()
        w.writerows([{"caption": "water is poured", "action": "pour"}, {"caption": "a ball bounces", "action": "x"}])
    path = B.export_videophy2(str(pc), {0: str(vid), 1: str(vid)}, str(tmp_path / "vp2"))
    rows = list(csv.DictReader(open(path)))
    assert [r["caption"] for r in rows] == ["water is poured", "a ball bounces"]
    assert all(os.path.isfile(r["videopath"]) for r in rows)
    with pytest.raises(ValueError, match="outside"):
        B.export_phygenbench(str(pj), {5: str(vid)}, str(tmp_path / "x"))
    with pytest.raises(FileNotFoundError):
        B.export_videophy2(str(tmp_path / "missing.csv"), {}, str(tmp_path / "y"))


def test_eval_physics_script(tmp_path, capsys):
    import importlib.util

    from visionmoe.video.data.synthetic import write_video

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    spec = importlib.util.spec_from_file_location("eval_physics", os.path.join(root, "scripts", "eval_physics.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    vids = tmp_path / "videos"
    vids.mkdir()
    write_video(str(vids / "0_free_fall.mp4"), generate_clip("free_fall", 1).frames)
    write_video(str(vids / "1_bounce.mp4"), generate_clip("bounce", 1).frames)
    (vids / "2_broken.mp4").write_bytes(b"nope")
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"caption": "a ball falls"}, {"caption": "a ball bounces"}, {"caption": "x"}]))
    assert mod.main([str(vids), "--controls", "--csv", str(tmp_path / "t.csv"), "--out", str(tmp_path / "t.md"),
                     "--phygenbench-prompts", str(prompts), "--export-dir", str(tmp_path / "exp")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    by = {r["video"]: r for r in rows}
    assert by["0_free_fall.mp4"]["gravity_physical"] == "True"
    assert by["0_free_fall.mp4 [shuffled]"]["gravity_physical"] == "False"
    assert float(by["mean [shuffled] (n=2)"]["accel_inconsistency"]) > 3 * float(by["mean (n=2)"]["accel_inconsistency"])
    assert "1 video(s) could not be read" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "exp" / "phygenbench")) == ["output_video_1.mp4", "output_video_2.mp4",
                                                                     "prompts.json"]


@pytest.mark.parametrize("flag", ["--out", "--csv"])
def test_eval_physics_checks_outputs_before_scoring(tmp_path, capsys, monkeypatch, flag):
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    spec = importlib.util.spec_from_file_location("eval_physics", os.path.join(root, "scripts", "eval_physics.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    vids = tmp_path / "videos"
    vids.mkdir()
    (vids / "a.mp4").write_bytes(b"never read")
    monkeypatch.setattr(mod, "read_frames", lambda *_: pytest.fail("scored before checking the output path"))
    with pytest.raises(SystemExit) as e:
        mod.main([str(vids), flag, str(tmp_path / "no" / "such" / "t.md")])
    assert e.value.code == 2
    assert "does not exist" in capsys.readouterr().err
