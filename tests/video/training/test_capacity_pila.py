"""scripts/capacity_pila.py: the pairs share their prompt and start and differ by the law, the
target is the correction between them, and the report holds every arm beside the baselines."""

import numpy as np
import pytest
import torch


def test_pairs_share_the_start_and_differ_by_the_law(load_script):
    mod = load_script("capacity_pila")
    good, bad = mod.pair_clips(3)
    assert good.shape == bad.shape == (17, 64, 64, 3) and good.dtype == np.uint8
    assert np.array_equal(good[0], bad[0]) and not np.array_equal(good[-1], bad[-1])
    again = mod.pair_clips(3)
    assert np.array_equal(again[0], good) and np.array_equal(again[1], bad)  # a pure function of the seed


def test_the_target_makes_the_estimate_lawful(load_script):
    mod = load_script("capacity_pila")
    g = torch.Generator().manual_seed(0)
    good, bad = torch.randn(3, 16, 5, 8, 8, generator=g), torch.randn(3, 16, 5, 8, 8, generator=g)
    x_t, v, sigma, target = mod.sample(good, bad, torch.arange(3), g, 0.3)
    s = sigma.view(-1, 1, 1, 1, 1)
    assert torch.allclose(x_t - s * v, bad, atol=1e-5)  # the base's estimate: the unlawful clip
    assert torch.allclose(x_t - s * (v + target), good, atol=1e-5)  # corrected: the lawful one
    assert mod.explained_variance(target, target) == 1.0 and abs(mod.explained_variance(target.mean().expand_as(target), target)) < 1e-6


def test_a_tiny_run_reports_every_arm_and_rejects_bad_arguments(load_script, capsys, tmp_path):
    mod = load_script("capacity_pila")
    tiny = ["--pairs", "4", "--heldout", "2", "--steps", "2", "--batch", "2", "--cache", str(tmp_path / "pairs.pt")]
    assert mod.main(tiny) == 0
    out = capsys.readouterr().out
    for row in ("| zero (untrained adapter) | 0 |", "| mean training target |", "| pila |", "| plain |", "| pila_context |"):
        assert row in out
    assert mod.main(tiny + ["--arms", "pila"]) == 0 and "6 pairs ready" in capsys.readouterr().out  # from the cache
    with pytest.raises(SystemExit):
        mod.main(["--pairs", "5", "--heldout", "2", "--cache", str(tmp_path / "pairs.pt")])  # other pairs
    with pytest.raises(SystemExit):
        mod.main(["--sigma-min", "1.5"])
    with pytest.raises(SystemExit):
        mod.main(["--steps", "0"])
