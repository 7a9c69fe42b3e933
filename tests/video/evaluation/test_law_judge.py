"""The independent law judge: trained on simulator clips of its own seeds, it tells held-out
lawful clips from unlawful ones in every category, judges a frozen, shuffled or missing object unlawful,
is deterministic for a seed, and survives a save/load round trip."""

import numpy as np
import pytest
import torch

from visionmoe.video.data.law_variants import LAW_SCENARIOS, generate_law_clip
from visionmoe.video.evaluation.controls import freeze_motion, shuffle_frames
from visionmoe.video.evaluation.law_judge import (JUDGE_SEED_BASE, LawJudge, judge_clips, load_judge, save_judge,
                                                  simulator_tracks, track_features, train_law_judge)

HELD_OUT = JUDGE_SEED_BASE + 10_000_000


@pytest.fixture(scope="module")
def judge():
    torch.set_num_threads(1)
    return train_law_judge(num_per_scenario=30, steps=500, seed=0)


def _clips(scenario, lawful, n=8):
    return [generate_law_clip(scenario, HELD_OUT + i, lawful) for i in range(n)]


@pytest.mark.parametrize("scenario", sorted(LAW_SCENARIOS))
def test_held_out_simulator_clips_are_told_apart(judge, scenario):
    for lawful in (True, False):
        clips = _clips(scenario, lawful)
        p = judge_clips(judge, [c.frames for c in clips], [scenario] * len(clips), [c.caption for c in clips])
        right = (p > 0.5) == lawful
        assert right.mean() >= 0.85, (scenario, lawful, p)


def test_a_frozen_shuffled_or_missing_object_is_judged_unlawful(judge):
    clips = _clips("projectile", True)
    frames = [c.frames for c in clips]
    caps = [c.caption for c in clips]
    lawful = judge_clips(judge, frames, ["projectile"] * 8, caps)
    frozen = judge_clips(judge, [freeze_motion(f, 4) for f in frames], ["projectile"] * 8, caps)
    shuffled = judge_clips(judge, [shuffle_frames(f, i) for i, f in enumerate(frames)], ["projectile"] * 8, caps)
    assert lawful.mean() > 0.8 and frozen.mean() < 0.3 and shuffled.mean() < 0.3
    blank = [np.full_like(f, 30) for f in frames]  # no object anywhere: scored at the worst value
    assert np.all(judge_clips(judge, blank, ["projectile"] * 8, caps) == 0.0)


def test_training_is_deterministic_and_the_judge_round_trips(tmp_path):
    data = simulator_tracks(2, seed_start=JUDGE_SEED_BASE)
    a = train_law_judge(data=data, steps=5, seed=3)
    b = train_law_judge(data=data, steps=5, seed=3)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k
    pos, found, scen, _, size = data
    x = track_features(pos, found, scen, size)
    save_judge(a, str(tmp_path / "j"), note="test")
    c = load_judge(str(tmp_path / "j"))
    assert torch.equal(a(x), c(x))
    with pytest.raises(FileNotFoundError, match="no law judge"):
        load_judge(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="features"):
        LawJudge()(x[:, :, :5])
