"""Procedural physics clips: determinism, shapes, Wan frame rule, ground truth obeys its physics."""

import json
import os

import numpy as np
import pytest

from visionmoe.video.data import synthetic
from visionmoe.video.data.synthetic import SCENARIOS, generate_clip


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_clip_shapes_and_determinism(scenario):
    a = generate_clip(scenario, 7)
    b = generate_clip(scenario, 7)
    c = generate_clip(scenario, 8)
    assert a.frames.shape == (17, 64, 64, 3) and a.frames.dtype == np.uint8
    assert np.array_equal(a.frames, b.frames)
    assert not np.array_equal(a.frames, c.frames)
    assert a.caption and a.labels and a.scenario == scenario
    for v in a.trajectories.values():
        assert v.shape[0] == 17 or v.ndim == 1  # per-frame state (or event list such as contacts)
    # something moves / changes
    assert np.abs(np.diff(a.frames.astype(np.int16), axis=0)).mean() > 0.05


def test_frame_rule_and_size_errors():
    with pytest.raises(ValueError, match="4k\\+1"):
        generate_clip("bounce", 0, num_frames=16)
    with pytest.raises(ValueError, match="unknown scenario"):
        generate_clip("levitation", 0)
    clip = generate_clip("bounce", 0, height=48, width=80, num_frames=9)
    assert clip.frames.shape == (9, 48, 80, 3)


def test_free_fall_is_quadratic_with_gravity():
    clip = generate_clip("free_fall", 3)
    y = clip.trajectories["positions"][:, 0, 1]
    t = np.arange(len(y))
    coef = np.polyfit(t, y, 2)
    assert coef[0] * 2 == pytest.approx(clip.params["g"], rel=1e-6)


def test_bounce_loses_energy_and_collision_conserves_momentum():
    clip = generate_clip("bounce", 1)
    assert len(clip.trajectories["contacts"]) >= 1
    assert 0 < clip.params["restitution"] < 1
    col = generate_clip("collision", 2)
    mom = col.trajectories["momentum"]
    contacts = col.trajectories["contacts"]
    assert len(contacts) >= 1
    # momentum is conserved through the ball-ball collision (until a ball reaches a wall)
    i = int(np.ceil(contacts[0]))
    assert np.allclose(mom[: i + 1], mom[0], rtol=1e-9)
    assert not np.allclose(col.trajectories["velocities"][i, 0], col.trajectories["velocities"][0, 0])


def test_sliding_decelerates_and_melting_is_monotone():
    s = generate_clip("sliding", 4)
    vx = s.trajectories["velocities"][:, 0, 0]
    assert np.all(np.diff(vx) <= 1e-12) and vx[-1] < vx[0]
    m = generate_clip("melting", 4)
    sf = m.trajectories["solid_fraction"]
    assert np.all(np.diff(sf) <= 0) and sf[-1] < 0.8 * sf[0]


def test_smoke_rises():
    s = generate_clip("smoke", 5)
    cy = s.trajectories["centroid"][2:, 1]
    assert cy[-1] < cy[0]  # the plume's centroid moves up (y decreases)


def test_write_dataset_cli(tmp_path):
    out = tmp_path / "ds"
    assert synthetic.main(["--out", str(out), "--num", "3", "--scenarios", "bounce,smoke"]) == 0
    lines = [json.loads(l) for l in open(out / "manifest.jsonl")]
    assert [l["scenario"] for l in lines] == ["bounce", "smoke", "bounce"]
    import imageio.v3 as iio

    frames = iio.imread(os.path.join(out, lines[0]["video"]))
    clip = generate_clip("bounce", lines[0]["seed"])
    assert frames.shape == clip.frames.shape
    assert np.abs(frames.astype(np.float32) - clip.frames).mean() < 2.0  # near-lossless mp4
    gt = np.load(os.path.join(out, lines[0]["ground_truth"]))
    assert np.allclose(gt["positions"], clip.trajectories["positions"])


def test_labels_are_taxonomy_categories():
    taxonomy = pytest.importorskip("visionmoe.video.pila.taxonomy")
    for s in SCENARIOS:
        assert set(synthetic.scenario_labels(s)) <= set(taxonomy.CATEGORY_NAMES)
