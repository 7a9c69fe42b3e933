"""scripts/distill_trajectory_guidance.py: the recorder samples exactly as trajectory guidance
does and keeps its corrections; an adapter trains on them and loads into the pipeline."""

import argparse

import numpy as np
import pytest
import torch


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()  # the script sets its own thread count
    yield
    torch.set_num_threads(n)


def test_recorder_samples_as_guidance_and_keeps_its_corrections(tmp_path, keep_threads, load_script):
    from visionmoe.video.evaluation.toy_world import generate_clips, toy_world_items
    from visionmoe.video.models.toy_world import load_toy_world
    from visionmoe.video.hooks.trajectory_guidance import attach_trajectory_guidance

    mod = load_script("distill_trajectory_guidance")
    torch.manual_seed(0)
    args = argparse.Namespace(work=str(tmp_path / "rec"), num=2, seed_base=123, strength=0.05, min_sigma=0.4,
                              sample_steps=8, threads=1)
    clips = mod.record(args)
    pipe = load_toy_world()
    attach_trajectory_guidance(pipe, 0.05, 0.4)
    ref = generate_clips(pipe, toy_world_items(2, 123), steps=8, guidance=3.0, batch=8)
    assert len(clips) == len(ref) == 2
    assert all(np.array_equal(a, b) for a, b in zip(clips, ref))  # the recorder is the guidance
    d = torch.load(tmp_path / "rec" / "tg_corrections.pt")
    assert d["x_t"].shape[0] == 2 * 8 and d["clip"].tolist() == [0, 1] * 8
    above = d["sigma"] > 0.4
    assert bool(above.any()) and bool((~above).any())
    norms = d["dv"].flatten(1).norm(dim=1)
    assert bool((norms[~above] == 0).all())
    # a guided step corrects every clip, except the noisiest estimates (the first steps), which
    # show no moving object yet and which the guidance's domain check leaves alone
    refused = (norms[above] == 0).view(-1, 2).any(1)
    assert not refused.all() and bool((refused[1:] <= refused[:-1]).all()), norms
    assert d["text"].shape[0] == 2 and d["mask"].shape[0] == 2

    train = argparse.Namespace(work=str(tmp_path / "rec"), arm="plain", steps=3, batch=2, lr=1e-3, threads=1)
    mod.train(train)
    from visionmoe.video.pipelines.wan_pila import load_adapter

    ad = load_adapter(str(tmp_path / "rec" / "plain_tgd" / "adapter"))
    assert ad.config.apply_to == "guided"


def test_bad_arguments_are_one_line_errors(tmp_path, capsys, load_script):
    mod = load_script("distill_trajectory_guidance")
    with pytest.raises(SystemExit) as e:
        mod.main(["record", "--num", "0", "--work", str(tmp_path / "x")])
    assert e.value.code == 2 and "--num must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit) as e:
        mod.main(["train", "--work", str(tmp_path / "empty")])
    assert "no tg_corrections.pt" in str(e.value)
