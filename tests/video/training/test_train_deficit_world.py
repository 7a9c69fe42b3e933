"""scripts/train_deficit_world.py ``--patch``: the shipped transformer unchanged at 4; at 2 every
patch-agnostic weight copied, a locally constant latent embedded as before, the right output shape."""

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
