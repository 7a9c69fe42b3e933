"""scripts/train_deficit_world.py: ``--patch`` (the shipped transformer unchanged at 4; at 2 every
patch-agnostic weight copied, a locally constant latent embedded as before, the right output shape)
and the ``vae`` phase (the whole VAE fine-tuned; the cache encodes with it and its own statistics);
``--max-seq`` (the text padding cut, recorded for eval_deficit.py's pipeline call)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from visionmoe.video.models.toy_world import TOY_WORLD_PATH


def test_patch_2_keeps_the_shipped_weights_it_can(load_script):
    mod = load_script("train_deficit_world")
    torch.set_num_threads(1)
    d4, d2 = mod.build_dit(str(TOY_WORLD_PATH), 4), mod.build_dit(str(TOY_WORLD_PATH), 2)
    assert list(d4.config.patch_size) == [1, 4, 4] and list(d2.config.patch_size) == [1, 2, 2]
    s4, s2 = d4.state_dict(), d2.state_dict()
    fresh = {n for n in s2 if s2[n].shape != s4[n].shape}
    assert fresh == {"patch_embedding.weight", "proj_out.weight", "proj_out.bias"}
    assert all(torch.equal(s2[n], s4[n]) for n in s2 if n not in fresh)  # blocks, norms, condition embedder
    x = torch.randn(1, 16, 5, 4, 4).repeat_interleave(4, 3).repeat_interleave(4, 4)  # constant on 4x4 blocks
    with torch.no_grad():
        assert torch.allclose(d2.patch_embedding(x)[..., ::2, ::2], d4.patch_embedding(x), atol=1e-4)
        out = d2(torch.randn(1, 16, 5, 16, 16), torch.tensor([500.0]), torch.randn(1, 8, 64), return_dict=False)[0]
    assert out.shape == (1, 16, 5, 16, 16) and torch.isfinite(out).all()
    with pytest.raises(ValueError):
        mod.build_dit(str(TOY_WORLD_PATH), 3)


def test_the_vae_phase_fine_tunes_the_whole_vae_and_the_cache_uses_it_with_its_own_statistics(load_script, tmp_path):
    from diffusers import AutoencoderKLWan

    mod = load_script("train_deficit_world")
    with pytest.raises(SystemExit):  # the vae phase without a budget is refused, not a no-op checkpoint
        mod.main(["--phase", "vae", "--work", str(tmp_path)])
    assert not (tmp_path / "vae.pt").exists()
    common = ["--work", str(tmp_path), "--num-clips", "4", "--vae-minutes", "5"]
    assert mod.main(["--phase", "vae", *common, "--vae-steps", "2", "--vae-batch", "2", "--vae-frames", "5",
                     "--vae-crop", "32"]) == 0
    shipped = AutoencoderKLWan.from_pretrained(str(TOY_WORLD_PATH / "vae"), local_files_only=True).eval()
    tuned = AutoencoderKLWan.from_pretrained(str(TOY_WORLD_PATH / "vae"), local_files_only=True).eval()
    assert mod.load_work_vae(SimpleNamespace(work=str(tmp_path)), tuned)["step"] == 2
    assert not torch.equal(tuned.encoder.conv_in.weight, shipped.encoder.conv_in.weight)  # the encoder trained too
    assert mod.main(["--phase", "cache", *common]) == 0
    c = torch.load(tmp_path / "cache.pt", weights_only=False)
    clip = mod.make_clip(c["specs"][0])
    with torch.no_grad():
        z = tuned.encode(mod.to_tensor(clip.frames[None])).latent_dist.mean
    assert torch.allclose(c["latents"][:1], z, atol=1e-5)  # the fine-tuned encoder, not the shipped one
    mean, std = torch.tensor(c["latents_mean"]), torch.tensor(c["latents_std"])
    assert torch.allclose(mean, c["latents"].mean((0, 2, 3, 4)), atol=1e-5)
    assert torch.allclose(c["x0"], (c["latents"] - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1), atol=1e-5)
    assert c["fg"].shape == (4, 1, *c["latents"].shape[2:]) and 0 < c["fg"].float().mean() < 0.5
    # --max-seq cuts the zero padding only, and the export records it for the pipeline call
    dit = [*common, "--dit-steps", "1", "--dit-batch", "2", "--export", str(tmp_path / "world")]
    with pytest.raises(SystemExit, match="would cut caption tokens"):
        mod.main(["--phase", "dit", *dit, "--max-seq", "2"])
    assert mod.main(["--phase", "dit", *dit, "--max-seq", "32"]) == 0
    assert mod.main(["--phase", "export", *dit, "--max-seq", "32"]) == 0
    evaluate = load_script("eval_deficit")
    assert evaluate.trained_sequence_length({"world": str(tmp_path / "world")}) == 32
    assert evaluate.trained_sequence_length({}) == 512  # the shipped toy world


def test_latent_foreground_marks_the_latent_that_folds_the_changed_pixels(load_script):
    mod = load_script("train_deficit_world")
    frames = np.full((1, 17, 64, 64, 3), 30, np.uint8)
    frames[0, 6, 10, 20] = (200, 40, 40)  # frame 6 is folded into latent frame 2 (frames 5-8)
    frames[0, 0, 40, 4] = (40, 200, 40)  # frame 0 is latent frame 0 alone
    fg = mod.latent_foreground(frames, 5)
    assert fg.shape == (1, 1, 5, 16, 16) and fg.dtype == torch.bool
    assert {tuple(i) for i in fg[0, 0].nonzero().tolist()} == {(2, 2, 5), (0, 10, 1)}
