"""The shipped toy world model (assets/toy_world): files, offline loading, a short generation."""

import json
import os

import numpy as np
import pytest
import torch

from visionmoe.video.models.toy_world import TOY_WORLD_PATH, load_toy_world, toy_world_adapter_path, toy_world_prompt

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_files_and_sizes():
    root = TOY_WORLD_PATH
    for rel in ("model_index.json", "MODEL_CARD.md", "training_info.json", "transformer/config.json",
                "vae/config.json", "text_encoder/config.json", "tokenizer/tokenizer.json",
                "scheduler/scheduler_config.json"):
        assert (root / rel).is_file(), rel
    weights = list(root.rglob("*.safetensors"))
    assert {w.parent.name for w in weights} >= {"transformer", "vae", "text_encoder"}
    assert sum(w.stat().st_size for w in weights) < 25 * 2**20
    assert not list(root.rglob("*.bin")) and not list(root.rglob("*.pt"))
    vae = json.loads((root / "vae" / "config.json").read_text())
    assert vae["z_dim"] == 16 and vae["scale_factor_spatial"] == 4 and vae["scale_factor_temporal"] == 4
    assert len(vae["latents_mean"]) == 16 and min(vae["latents_std"]) > 0
    info = json.loads((root / "training_info.json").read_text())
    assert info["vae_steps"] > 0 and info["dit_steps"] > 0
    card = (root / "MODEL_CARD.md").read_text()
    assert "scripts/train_toy_world.py" in card and "/tmp" not in card and "/work" not in card


def test_prompt_helper():
    assert toy_world_prompt("orange", "fall") == "an orange ball is dropped and falls straight down"
    with pytest.raises(ValueError, match="motion"):
        toy_world_prompt("red", "swim")


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="model_index.json"):
        load_toy_world(tmp_path)


def test_loads_offline_and_generates_two_steps():
    torch.set_num_threads(1)
    pipe = load_toy_world()
    assert type(pipe).__name__ == "WanPipeline"
    assert pipe.vae.config.z_dim == 16 and pipe.transformer.config.in_channels == 16
    gen = torch.Generator().manual_seed(0)
    out = pipe(prompt=toy_world_prompt("red", "bounce"), height=64, width=64, num_frames=17, num_inference_steps=2,
               guidance_scale=1.0, generator=gen, output_type="np").frames
    frames = np.asarray(out)
    assert frames.shape == (1, 17, 64, 64, 3)
    assert np.isfinite(frames).all() and frames.min() >= 0 and frames.max() <= 1


def test_shipped_adapter_attaches_if_present():
    path = toy_world_adapter_path()
    if path is None:
        pytest.skip("no PILA adapter shipped with the toy world model")
    from visionmoe.video import attach_pila, detach_pila, load_adapter

    pipe = load_toy_world()
    adapter = load_adapter(path)
    assert adapter.config.latent_channels == 16
    kw = dict(prompt=toy_world_prompt("blue", "fall"), height=64, width=64, num_frames=17, num_inference_steps=2,
              guidance_scale=1.0, output_type="latent")
    base = pipe(generator=torch.Generator().manual_seed(1), **kw).frames
    attach_pila(pipe, adapter, scale=0.0)
    zero = pipe(generator=torch.Generator().manual_seed(1), **kw).frames
    attach_pila(pipe, adapter, scale=1.0)
    on = pipe(generator=torch.Generator().manual_seed(1), **kw).frames
    detach_pila(pipe)
    assert torch.equal(base, zero)
    assert torch.isfinite(on).all() and not torch.equal(base, on)
