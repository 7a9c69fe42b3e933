"""Rigid-body trajectory projection: the law fit, the pixel projection, the scheduler wrapper on
tiny Wan pipelines, and the projection through the toy world's VAE."""

import numpy as np
import pytest
import torch

from visionmoe.video.evaluation import metrics as M
from visionmoe.video.data.synthetic import generate_clip
from visionmoe.video.models.tiny import load_tiny_wan
from visionmoe.video.hooks.trajectory_projection import attach_trajectory_projection, detach_trajectory_projection
from visionmoe.video.physics.laws import fit_law_track
from visionmoe.video.physics.rigid_body import project_clip


def jittery_ball_clip(seed=0, frames=17, size=64, jitter=1.2, ghost=False):
    """A disc falling on a parabola over the toy world's background (a simulator clip's temporal
    median), its centre jittered by ``jitter`` px and its radius by 15% per frame (what the toy
    world's model draws); with ``ghost`` a green disc 14 px to its left as well, which outshines
    the ball in about 40% of the frames and is faint in the others (the toy world draws such
    ghosts)."""
    rng = np.random.default_rng(seed)
    bg = np.median(generate_clip("free_fall", seed).frames, 0).astype(np.float64) / 255
    t = np.arange(frames, dtype=np.float64)
    y = 8 + 0.4 * t + 0.5 * 0.18 * t * t + rng.normal(0, jitter, frames)
    x = 30 + 0.3 * t + rng.normal(0, jitter, frames)
    r = 4.5 * (1 + rng.uniform(-0.15, 0.15, frames))
    strength = np.where(rng.random(frames) < 0.4, 1.0, 0.3)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    out = np.empty((frames, size, size, 3))
    for i in range(frames):
        d = np.sqrt((yy - y[i]) ** 2 + (xx - x[i]) ** 2)
        a = np.clip(r[i] + 0.5 - d, 0, 1)[..., None]
        out[i] = bg * (1 - a) + np.array([0.9, 0.2, 0.15]) * a
        if ghost:
            g = strength[i] * np.clip(r[i] + 0.5 - np.sqrt((yy - y[i]) ** 2 + (xx - x[i] + 14) ** 2), 0, 1)
            out[i] = out[i] * (1 - g[..., None]) + np.array([0.3, 1.0, 0.3]) * g[..., None]
    return np.clip(np.rint(out * 255), 0, 255).astype(np.uint8)


def to_unit(u8):
    return u8.astype(np.float32) / 127.5 - 1


def to_u8(f):
    return np.clip(np.rint((f + 1) * 127.5), 0, 255).astype(np.uint8)


def test_fit_law_track_is_exact_on_the_law_and_cuts_at_bounces():
    t = np.arange(17, dtype=np.float64)
    y = 5 + 0.3 * t + 0.5 * 0.2 * t * t
    x = 30 + 0.1 * t
    fy, fx = fit_law_track(y, x)
    assert np.allclose(fy, y) and np.allclose(fx, x)
    ly, _ = fit_law_track(y, x, "lines")  # the wrong law cannot follow the acceleration
    assert np.abs(ly - y).max() > 0.5
    _, _, ay, ax = fit_law_track(y[4:12], x[4:12], t=t[4:12], at=np.array([0.0, 2.0, 16.0]))
    assert np.allclose(ay, y[[0, 2, 16]]) and np.allclose(ax, x[[0, 2, 16]])  # the law carried on
    # a bounce: two parabolas with one acceleration; the contact frame (8), which neither segment
    # fits, lies on the law too, also when it is drawn 1.5 px off
    yb = np.concatenate([5 + 0.5 * 0.8 * np.arange(9) ** 2, 30.6 - 4 * np.arange(1, 9) + 0.4 * np.arange(1, 9) ** 2])
    fyb, _ = fit_law_track(yb, np.zeros_like(yb))
    assert len(M.bounce_segments(yb)) == 2 and np.abs(fyb - yb).max() < 0.2
    off = yb.copy()
    off[8] -= 1.5
    fyo, _ = fit_law_track(off, np.zeros_like(yb))
    assert abs(fyo[8] - yb[8]) < 0.1
    with pytest.raises(ValueError, match="law"):
        fit_law_track(y, x, "orbits")


def test_projection_makes_a_jittery_ball_rigid_and_lawful():
    before_jerk, after_jerk, before_res, after_res = [], [], [], []
    for seed in range(4):
        clip = jittery_ball_clip(seed)
        out, shift = project_clip(to_unit(clip))
        proj = to_u8(out)
        tb, ta = M.guarded_track(clip), M.guarded_track(proj)
        assert ta.frames_tracked == 17 and 0.3 < shift < 3.0
        assert abs(ta.area.mean() / tb.area.mean() - 1) < 0.15  # the ball keeps its size
        before_jerk.append(M.scale_free_jerk(tb.positions))
        after_jerk.append(M.scale_free_jerk(ta.positions))
        before_res.append(M.gravity_fit(track=tb.positions).residual_quadratic)
        after_res.append(M.gravity_fit(track=ta.positions).residual_quadratic)
    assert np.mean(after_jerk) < 0.5 * np.mean(before_jerk)
    assert np.mean(after_res) < 0.5 * np.mean(before_res)


def test_a_ghost_beside_the_ball_neither_moves_its_track_nor_blends_its_template():
    """Two blobs that take turns at outshining each other: a centroid over the whole frame jumps
    between them, and a template aligned on it blends both with the background; the projection
    follows one of them and keeps its colour. (The domain check is off: it refuses a clip whose
    second blob is strong in most frames, as in seed 0; tests/video/physics/test_domain.py.)"""
    for seed in range(3):
        clip = jittery_ball_clip(seed, ghost=True)
        out, _ = project_clip(to_unit(clip), check_domain=False)
        proj = to_u8(out)
        tr = M.guarded_track(proj)
        assert tr.frames_tracked == 17
        ball = M.guarded_track(jittery_ball_clip(seed)).positions  # the same ball without its ghost
        off = min(np.linalg.norm(tr.positions - (ball - [dx, 0]), axis=1).mean() for dx in (0, 14))
        assert off < 2.0  # on the ball's or on the ghost's (jittered) path, not between them
        rgb = np.stack([proj[i, cy, cx] for i, (cx, cy) in enumerate(np.rint(tr.positions).astype(int))]) / 255.0
        red = (rgb[:, 0] > 0.7) & (rgb[:, 1] < 0.35)
        green = (rgb[:, 1] > 0.7) & (rgb[:, 0] < 0.45)
        assert red.all() or green.all()  # one body in one colour, not a blend


def test_faint_frames_do_not_steer_the_fit_and_the_body_stays_drawn():
    clip = jittery_ball_clip(2)
    bg = np.median(generate_clip("free_fall", 2).frames, 0)
    faded = clip.copy()
    faded[7:10] = np.rint(bg + 0.1 * (clip[7:10].astype(np.float64) - bg)).astype(np.uint8)  # nearly gone
    out, _ = project_clip(to_unit(faded))
    tr = M.guarded_track(to_u8(out))
    assert tr.frames_tracked == 17 and tr.contrast[7:10].min() > 0.5 * tr.contrast[[6, 10]].min()
    assert M.gravity_fit(track=tr.positions).residual_quadratic < 0.5
    late = clip.copy()
    late[:3] = bg  # the object shows from frame 3 on: the law carries it back to frame 0
    out, _ = project_clip(to_unit(late))
    tr = M.guarded_track(to_u8(out))
    assert tr.frames_tracked == 17 and M.gravity_fit(track=tr.positions).residual_quadratic < 0.5
    out, _ = project_clip(to_unit(late), strength=0.0)  # no law, nothing to carry it: as drawn
    assert np.array_equal(to_u8(out[:3]), late[:3])


def test_strength_zero_keeps_the_track_and_empty_clips_pass_through():
    clip = jittery_ball_clip(1)
    out, shift = project_clip(to_unit(clip), strength=0.0)
    assert shift == 0.0
    tb, ta = M.guarded_track(clip), M.guarded_track(to_u8(out))
    assert np.abs(ta.positions - tb.positions).max() < 1.0  # rigid shape, same path
    empty = np.zeros((9, 32, 32, 3), np.float32)
    same, s = project_clip(empty)
    assert s == 0.0 and np.array_equal(same, empty)
    with pytest.raises(ValueError, match="F, H, W, 3"):
        project_clip(np.zeros((9, 32, 32), np.float32))


def run(pipe, steps=3):
    return pipe(prompt="a ball falls", negative_prompt="", height=32, width=32, num_frames=9,
                num_inference_steps=steps, guidance_scale=4.0, generator=torch.Generator().manual_seed(0),
                output_type="latent", max_sequence_length=16).frames


@pytest.mark.parametrize("version", ["2.1", "2.2"])
def test_steps_zero_and_detach_are_the_base_pipeline(version):
    pipe = load_tiny_wan(version)
    base = run(pipe)
    p = attach_trajectory_projection(pipe, steps=0)
    assert torch.equal(run(pipe), base) and p.calls == 0
    sigmas = []
    p = attach_trajectory_projection(pipe, steps=2, check_domain=False)  # a tiny random Wan draws noise
    apply = p.apply
    p.apply = lambda v, x, sigma: sigmas.append(sigma) or apply(v, x, sigma)
    projected = run(pipe)
    assert p.calls == 2 and torch.isfinite(projected).all()
    assert sigmas == sorted(sigmas, reverse=True) and 0 < sigmas[-1] < sigmas[0] < 1  # the last two steps
    detach_trajectory_projection(pipe)
    assert "step" not in vars(pipe.scheduler)
    assert torch.equal(run(pipe), base)


def run_video(pipe, steps=3, callback=None):
    return pipe(prompt="a ball falls", negative_prompt="", height=32, width=32, num_frames=9,
                num_inference_steps=steps, guidance_scale=4.0, generator=torch.Generator().manual_seed(0),
                output_type="pt", max_sequence_length=16, callback_on_step_end=callback).frames


@pytest.mark.parametrize("version", ["2.1", "2.2"])
def test_pixels_project_the_decoded_video_and_leave_the_latents(version):
    pipe = load_tiny_wan(version)
    base_latents, base = run(pipe), run_video(pipe)
    p = attach_trajectory_projection(pipe, space="pixels", check_domain=False)  # a tiny random Wan draws noise
    assert torch.equal(run(pipe), base_latents) and p.calls == 0  # output_type="latent": nothing decoded
    seen = []

    def decode_mid_run(pipe_, i, t, kw):  # a decode during denoising is not the output
        if i < 2:
            pipe_.vae.decode(kw["latents"], return_dict=False)
            seen.append(p.calls)
        return {}

    out = run_video(pipe, callback=decode_mid_run)
    assert seen == [0, 0] and p.calls == 1 and len(p.shifts) == 1
    # the expected output: the base's decoded video with project_clip applied, then post-processed
    vae = pipe.vae
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        video = vae.decode(base_latents * std + mean, return_dict=False)[0]  # p is no longer armed
    assert p.calls == 1
    clamped = video.float().clamp(-1, 1)
    projected, _ = project_clip(clamped[0].permute(1, 2, 3, 0).numpy(), check_domain=False)
    expected = video.float() + (torch.from_numpy(projected).permute(3, 0, 1, 2)[None] - clamped)
    expected = pipe.video_processor.postprocess_video(expected, output_type="pt")
    assert torch.allclose(out, expected, atol=1e-6) and not torch.equal(out, base)
    p = attach_trajectory_projection(pipe, steps=0, space="pixels")
    assert torch.equal(run_video(pipe), base) and p.calls == 0
    detach_trajectory_projection(pipe)
    assert "decode" not in vars(pipe.vae) and "step" not in vars(pipe.scheduler)
    assert torch.equal(run_video(pipe), base)
    attach_trajectory_projection(pipe, space="pixels")
    theirs = pipe.vae.decode = lambda *a, **k: None  # someone else's wrapper, set after attach
    detach_trajectory_projection(pipe)
    assert pipe.vae.decode is theirs and "step" not in vars(pipe.scheduler)  # detach removes only its own


def test_projection_through_the_toy_world_vae_lowers_the_jerk():
    from visionmoe.video.models.toy_world import load_toy_world

    pipe = load_toy_world()
    proj = attach_trajectory_projection(pipe)
    vae = pipe.vae
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    clips = [jittery_ball_clip(s) for s in (5, 6)]
    video = torch.from_numpy(np.stack([to_unit(c) for c in clips])).permute(0, 4, 1, 2, 3)
    with torch.no_grad():
        x0 = (vae.encode(video).latent_dist.mean - mean) / std
        x0p, changed = proj.project(x0)
    assert changed.all() and not proj.refused

    @torch.no_grad()
    def decode(x):
        v = vae.decode(x * std + mean, return_dict=False)[0].clamp(-1, 1)
        return [to_u8(c.permute(1, 2, 3, 0).numpy()) for c in v]

    jerk = [np.mean([M.scale_free_jerk(M.guarded_track(c).positions) for c in decode(x)]) for x in (x0, x0p)]
    assert jerk[1] < 0.75 * jerk[0], jerk
    detach_trajectory_projection(pipe)


def test_bad_settings_fail_clearly():
    from diffusers import DDIMScheduler

    pipe = load_tiny_wan("2.1")
    with pytest.raises(ValueError, match="steps"):
        attach_trajectory_projection(pipe, steps=-1)
    with pytest.raises(ValueError, match="law"):
        attach_trajectory_projection(pipe, law="orbits")
    with pytest.raises(ValueError, match="strength"):
        attach_trajectory_projection(pipe, strength=1.5)
    with pytest.raises(ValueError, match="space"):
        attach_trajectory_projection(pipe, space="voxels")
    with pytest.raises(ValueError, match="steps must be 0 or 1"):
        attach_trajectory_projection(pipe, steps=2, space="pixels")
    with pytest.raises(ValueError, match="VAE"):
        attach_trajectory_projection(object())
    assert "step" not in vars(pipe.scheduler) and "decode" not in vars(pipe.vae)  # a refused attachment changes nothing
    pipe.scheduler = DDIMScheduler()
    with pytest.raises(ValueError, match="flow-prediction"):
        attach_trajectory_projection(pipe)


def test_bench_script_times_both_arms_and_rejects_bad_arguments(load_script, capsys):
    bench = load_script("bench_trajectory_projection")
    bench.main(["--num", "2", "--repeats", "1"])
    out = capsys.readouterr().out
    for row in ("| base |", "| trajectory projection (gravity) |", "| trajectory projection (gravity, pixels) |"):
        assert row in out
    assert "x base" in out
    with pytest.raises(SystemExit):
        bench.main(["--repeats", "0"])
