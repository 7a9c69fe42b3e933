"""Guarded evaluation: failures are never dropped, guards sit next to headlines, and the
negative controls (fade, shrink, hide, drop, freeze) never improve a headline."""

import numpy as np
import pytest

from visionmoe.video import evaluation as E
from visionmoe.video.evaluation.statistics import _EnergyBootstrap
from visionmoe.video.evaluation import controls as C
from visionmoe.video.evaluation import metrics as M
from visionmoe.video.data.scenes import _Canvas, _render_balls
from visionmoe.video.data.synthetic import generate_clip


def jittered_clip(seed, jitter=0.8, F=17):
    """A ball falling under gravity with per-frame position noise (an imperfect generator)."""
    rng = np.random.default_rng(seed)
    canvas = _Canvas(64, 64, rng)
    g, r = rng.uniform(0.12, 0.2), rng.uniform(4.0, 5.5)
    t = np.arange(F, dtype=np.float64)
    y = 8 + rng.uniform(0, 0.4) * t + 0.5 * g * t * t
    x = 32 + rng.uniform(-0.3, 0.3) * t
    pos = np.stack([x, y], 1) + rng.normal(0, jitter, size=(F, 2))
    return _render_balls(canvas, pos[:, None], [r], ["red"], 60.0)


@pytest.fixture(scope="module")
def imperfect():
    return [jittered_clip(s) for s in range(10)]


CONTROLS = {
    "fade": lambda f: C.fade_object(f, 0.6),
    "shrink": lambda f: C.shrink_object(f, 1),
    "hide": lambda f: C.hide_object(f, (6, 7, 8, 9)),
    "drop": lambda f: C.drop_frames(f, 2, seed=0),
    "skip": lambda f: C.skip_frames(f, 2, seed=0),
    "freeze": lambda f: C.freeze_motion(f, 9),
    "freeze_early": lambda f: C.freeze_motion(f, 3),
}


@pytest.fixture(scope="module")
def control_rows(imperfect):
    rows = {"orig": [E.score_clip(f, "red") for f in imperfect]}
    for k, fn in CONTROLS.items():
        rows[k] = [E.score_clip(fn(f), "red") for f in imperfect]
    return rows


@pytest.fixture(scope="module")
def lawful_reference():
    """The reference the distance measures against: lawful clips of the same generator (no jitter,
    other seeds), as the simulator's clips are to a generator's."""
    return [E.score_clip(jittered_clip(100 + s, jitter=0.0), "red") for s in range(20)]


MOTION_KEPT = ("fade", "shrink")  # the object is harder to see, its motion the same
MOTION_BROKEN = ("hide", "drop", "skip", "freeze", "freeze_early")  # the motion itself is broken


def with_reference(control_rows, control, reference):
    return E.summarize({"orig": control_rows["orig"], control: control_rows[control], "reference": reference},
                       "orig", "reference")


@pytest.mark.parametrize("control", MOTION_KEPT)
def test_controls_that_keep_the_motion_improve_no_headline(control_rows, lawful_reference, control):
    """No clip fails (so no failure is scored at the worst value), and no headline nor the
    distance to the lawful reference improves beyond its paired bootstrap interval: a metric
    that read contrast or size as physics would."""
    s = with_reference(control_rows, control, lawful_reference)
    assert s.arms[control].failure_rate.mean == 0.0
    for key, _, _ in E.HEADLINES:
        assert s.changes[control][key].hi >= 0.0, (control, key, s.changes[control][key])
    assert s.distance_changes[control].hi >= 0.0, s.distance_changes[control]


@pytest.mark.parametrize("control", MOTION_BROKEN)
def test_controls_that_break_the_motion_are_worse_without_the_failure_score(control_rows, lawful_reference, control):
    """Worse measured on what survives, not through the failure score: the distance to the
    lawful reference (a lost frame counts a frame height) at least doubles, and the clips that
    do not fail have a larger gravity residual; a control whose every clip fails fails for its
    own reason."""
    s = with_reference(control_rows, control, lawful_reference)
    assert s.arms[control].distance.mean > 2 * s.arms["orig"].distance.mean
    if s.arms[control].failure_rate.mean < 1.0:
        ok = s.arms[control].headlines_ok["gravity_residual"].mean
        assert ok > 1.1 * s.arms["orig"].headlines_ok["gravity_residual"].mean, (control, ok)
    else:
        reason = {"drop": "frames missing", "freeze": "stalled", "freeze_early": "lost"}[control]
        assert s.arms[control].failures.get(reason) == len(control_rows[control]), s.arms[control].failures


def test_the_distance_tells_lawful_clips_from_jittered_ones(control_rows, lawful_reference):
    """The distance to the reference ranks a held-out lawful set above the jittered one; a metric
    that compared a set with itself (always 0) or ignored the tracks could not."""
    lawful = [E.score_clip(jittered_clip(200 + s, jitter=0.0), "red") for s in range(10)]
    d_lawful = E.trajectory_distance(lawful, lawful_reference).mean
    d_jittered = E.trajectory_distance(control_rows["orig"], lawful_reference).mean
    assert 0.0 < d_lawful < 0.95 * d_jittered, (d_lawful, d_jittered)


def test_fading_is_seen_by_the_contrast_guard_not_the_headlines(control_rows):
    o, f = control_rows["orig"], control_rows["fade"]
    for a, b in zip(o, f):
        assert b["gravity_residual"] == pytest.approx(a["gravity_residual"], rel=0.05, abs=0.02)
        assert b["frames_tracked"] == a["frames_tracked"]
        assert b["contrast"] < 0.7 * a["contrast"]
        assert b["fg_area"] == pytest.approx(a["fg_area"], rel=0.1)


def test_shrinking_is_seen_by_the_area_guard(control_rows):
    area = lambda k: np.mean([r["fg_area"] for r in control_rows[k]])  # noqa: E731
    assert area("shrink") < 0.85 * area("orig")


def test_lost_objects_fail_and_score_the_worst_value(control_rows):
    hidden = control_rows["freeze_early"]
    assert all(r["failed"] for r in hidden)
    s = E.summarize({"orig": control_rows["orig"], "x": hidden}, "orig", None)
    assert s.arms["x"].failure_rate.mean == 1.0 and s.arms["orig"].failure_rate.mean == 0.0
    worst = s.worst["gravity_residual"]
    assert s.arms["x"].headlines["gravity_residual"].mean == pytest.approx(worst)
    assert s.arms["x"].headlines["gravity_residual"].n == len(hidden)  # never dropped
    assert s.changes["x"]["failed"].rel == pytest.approx(1.0)  # +100 points


def test_failure_reasons():
    clip = generate_clip("free_fall", 0)
    assert E.score_clip(clip.frames)["failed"] == 0.0
    still = np.repeat(clip.frames[:1], 17, 0)
    r = E.score_clip(still)
    assert r["failed"] == 1.0 and "lost" in r["failure"]
    gone = C.hide_object(clip.frames, tuple(range(4, 17)))
    assert "lost" in E.score_clip(gone)["failure"]


def test_guarded_track_is_contrast_independent():
    fr = generate_clip("bounce", 3).frames
    a, b = M.guarded_track(fr), M.guarded_track(C.fade_object(fr, 0.35))
    assert a.frames_tracked == b.frames_tracked == 17
    np.testing.assert_allclose(a.positions, b.positions, atol=0.3)
    assert b.guards()["contrast"] < 0.4 * a.guards()["contrast"]


def test_scale_free_jerk_is_scale_free():
    t = np.arange(17.0)
    tr = np.stack([0.1 * t, 0.3 * t * t], 1) + np.random.default_rng(0).normal(0, 0.3, (17, 2))
    assert M.scale_free_jerk(2 * tr) == pytest.approx(M.scale_free_jerk(tr))
    assert np.isnan(M.scale_free_jerk(np.zeros((17, 2))))  # no motion: undefined, i.e. a failure
    assert np.isnan(M.scale_free_jerk(np.full((17, 2), np.nan)))


def test_energy_distance_reference_values():
    x = np.array([[0.0], [1.0]])
    assert E.energy_distance(x, x) == pytest.approx(0.0)
    # E|X-Y| = 1.5 for X in {0,1}, Y in {1,2}... 2*1 - 0.5 - 0.5 = 1
    assert E.energy_distance(x, x + 1) == pytest.approx(1.0)


def test_energy_bootstrap_matches_recomputing_each_draw():
    """The bootstrap indexes pairwise distances computed once; each draw must equal the energy
    distance recomputed from the resampled rows."""
    rng = np.random.default_rng(3)
    x, ref = rng.normal(size=(40, 17)), rng.normal(0.5, 1.2, size=(30, 17))
    boot = _EnergyBootstrap(x, ref)
    for _ in range(5):
        i = rng.integers(0, len(x), len(x))
        assert boot(i) == pytest.approx(E.energy_distance(x[i], ref), rel=1e-12, abs=1e-12)
    assert boot(np.arange(len(x))) == pytest.approx(E.energy_distance(x, ref), rel=1e-12)


def test_summarize_rejects_bad_input(control_rows):
    with pytest.raises(ValueError, match="base arm"):
        E.summarize({"a": control_rows["orig"]}, "base", None)
    with pytest.raises(ValueError, match="share prompts and seeds"):
        E.summarize({"base": control_rows["orig"], "b": control_rows["orig"][:3]}, "base", None)
    with pytest.raises(ValueError, match="min_tracked"):
        E.EvalSettings(min_tracked=0.0)


def test_markdown_has_guards_next_to_headlines(control_rows):
    s = E.summarize({"orig": control_rows["orig"], "fade": control_rows["fade"]}, "orig", None)
    md = s.markdown()
    for _, lbl, _ in E.HEADLINES:
        assert lbl in md
    for _, lbl in E.GUARDS:
        assert lbl in md
    assert "failure rate" in md and "change of fade vs orig" in md


def test_a_ball_frozen_in_the_air_fails():
    fr = generate_clip("free_fall", 2).frames
    r = E.score_clip(C.freeze_motion(fr, 10))
    assert r["failed"] and "stalled" in r["failure"]
    for s in range(6):  # the simulator's own clips never stall
        for sc in ("free_fall", "bounce"):
            assert not E.score_clip(generate_clip(sc, s).frames)["failed"], (sc, s)


def test_a_clip_with_missing_frames_fails(control_rows):
    """A shorter clip than the base's (the generator was asked for the same frames) fails."""
    s = E.summarize({"orig": control_rows["orig"], "drop": control_rows["drop"]}, "orig", None)
    assert s.arms["drop"].failure_rate.mean == 1.0 and s.arms["drop"].failures.get("frames missing") == len(control_rows["drop"])
    assert all(r["num_frames"] == 17 for r in control_rows["skip"])  # skipping keeps the length


def test_trajectory_distance_compares_whole_tracks(control_rows):
    """Identical tracks are at distance 0 from themselves; a lost frame counts a frame height."""
    rows = control_rows["orig"]
    assert E.trajectory_distance(rows, rows).mean == pytest.approx(0.0, abs=1e-12)
    assert E.trajectory_distance(control_rows["hide"], rows).mean > 0.01
    with pytest.raises(ValueError, match="older evaluation"):
        E.trajectory_distance([{k: v for k, v in rows[0].items() if k != "track"}], rows)


def test_save_writes_the_table_and_the_results_merge_reads(control_rows, tmp_path):
    import json

    rows = {"base": control_rows["orig"], "fade": control_rows["fade"]}
    ev = E.ToyWorldEvaluation(dict(num=10, seed_sets=[0], steps=20, guidance=3.0, min_tracked=0.8),
                              [("p", "red", "fall", i) for i in range(10)], rows, E.summarize(rows, "base", None))
    ev.save(str(tmp_path / "out"))
    assert (tmp_path / "out" / "table.md").read_text() == ev.markdown() + "\n"
    back = json.loads((tmp_path / "out" / "results.json").read_text())
    assert sorted(back["per_clip"]) == ["base", "fade"] and len(back["per_clip"]["fade"]) == 10


def test_the_toy_world_evaluation_measures_against_the_simulator():
    """The simulator-reference path end to end, on the shipped toy world (2 clips, 2 steps): the
    reference rows are the simulator's held-out clips for the same prompts, they are lawful and
    tracked, and every other arm's distance is measured against them."""
    from visionmoe.video.evaluation.toy_world import simulator_clips

    ev = E.evaluate_toy_world([], num=2, steps=2, batch=2, control=False)
    assert list(ev.per_clip) == ["base", "simulator (reference)"]
    ref = ev.per_clip["simulator (reference)"]
    sim = simulator_clips(ev.items)
    assert [c.scenario for c in sim] == ["bounce" if it[2] == "bounce" else "free_fall" for it in ev.items]
    assert [r["track"] for r in ref] == [E.score_clip(c.frames)["track"] for c in sim]
    # lawful, tracked, and in the colour of its own caption (the simulator picks its own colour)
    assert not any(r["failed"] for r in ref) and all(r["color_ok"] == 1.0 for r in ref), ref
    base = ev.summary.arms["base"].distance
    assert ev.summary.arms["simulator (reference)"].distance is None
    assert base.mean == pytest.approx(E.trajectory_distance(ev.per_clip["base"], ref).mean) and base.mean > 0
