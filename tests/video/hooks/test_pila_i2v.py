"""PILA on every Wan pipeline of diffusers: text-to-video and image-to-video, Wan 2.1 and 2.2.

Image-to-video feeds the transformer ``cat([latents, condition])`` (36 channels); the hook
must hand the adapter the 16 latent channels only. Tiny random pipelines, built offline.
"""

import numpy as np
import pytest
import torch
from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
from PIL import Image

from visionmoe.video.pila.adapter import PILAAdapter
from visionmoe.video.hooks.pila import attach_pila, detach_pila
from visionmoe.video.models.tiny import DEFAULT_ASSETS, _read, tiny_wan_components

@pytest.fixture(autouse=True)
def _ftfy(monkeypatch):
    """diffusers' I2V pipeline calls ``ftfy.fix_text`` without checking that ftfy is installed
    (its T2V pipeline checks); without ftfy, clean prompts pass through unchanged."""
    import types

    import diffusers.pipelines.wan.pipeline_wan_i2v as m

    if not hasattr(m, "ftfy"):
        monkeypatch.setattr(m, "ftfy", types.SimpleNamespace(fix_text=lambda t: t), raising=False)


SMALL = dict(hidden_dim=32, slot_dim=8, expert_hidden=32, text_dim=32)


def adapter(channels=16, seed=1):
    a = PILAAdapter(**{**SMALL, "latent_channels": channels}).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # stands in for a trained decoder: dv != 0
        a.decoder.weight.copy_(torch.randn(a.decoder.weight.shape, generator=g) * 0.1)
    return a


def _transformer(seed, **over):
    cfg = _read(DEFAULT_ASSETS / "transformer" / "config.json")
    cfg["patch_size"] = tuple(cfg["patch_size"])
    cfg.update(over)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return WanTransformer3DModel(**cfg).eval()


def tiny_i2v(version):
    """Wan 2.1 I2V (36 input channels + CLIP image embeddings) or Wan 2.2 I2V-A14B (36 channels, two experts)."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    comp = tiny_wan_components("2.1")
    inner = 2 * 12  # heads x head dim of the tiny transformer
    if version == "2.1":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(5)
            enc = CLIPVisionModel(CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                   num_attention_heads=2, image_size=32, patch_size=8)).eval()
        comp.update(transformer=_transformer(11, in_channels=36, image_dim=16, added_kv_proj_dim=inner),
                    image_encoder=enc, image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                                          crop_size={"height": 32, "width": 32}))
    else:
        comp.update(transformer=_transformer(11, in_channels=36), transformer_2=_transformer(12, in_channels=36),
                    boundary_ratio=0.875)
    pipe = WanImageToVideoPipeline(**comp)
    pipe.set_progress_bar_config(disable=True)
    return pipe


IMAGE = Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8))


def run_i2v(pipe, guidance=5.0, output_type="latent"):
    return pipe(image=IMAGE, prompt="a ball falls", negative_prompt="blurry", height=32, width=32, num_frames=9,
                num_inference_steps=2, guidance_scale=guidance, generator=torch.Generator().manual_seed(0),
                output_type=output_type, max_sequence_length=16).frames


@pytest.mark.parametrize("version", ["2.1", "2.2"])
@pytest.mark.parametrize("guidance", [5.0, 1.0], ids=["cfg", "nocfg"])
def test_i2v_scale0_bit_identical_and_nonzero_scale_runs(version, guidance):
    pipe = tiny_i2v(version)
    base = run_i2v(pipe, guidance)
    assert base.shape[1] == 16
    ctl = attach_pila(pipe, adapter(), scale=0.0)
    assert torch.equal(run_i2v(pipe, guidance), base)
    assert ctl.calls == 0
    ctl.settings.scale = 1.0
    seen = []
    orig = ctl.adapter.forward

    def spy(latents, *a, **k):
        seen.append(latents.shape[1])
        return orig(latents, *a, **k)

    ctl.adapter.forward = spy
    corrected = run_i2v(pipe, guidance)
    del ctl.adapter.forward
    assert torch.isfinite(corrected).all()
    assert not torch.allclose(corrected, base, atol=1e-4)
    assert seen and set(seen) == {16}  # the adapter read the latents, never the 36-channel input
    assert ctl.calls == 2  # one per step, shared by the guidance branches
    detach_pila(pipe)
    assert torch.equal(run_i2v(pipe, guidance), base)


def test_i2v_adapter_sees_the_latents_not_the_condition():
    """The clean-latent estimate must come from the 16 noisy latent channels of the input."""
    pipe = tiny_i2v("2.2")
    got = {}
    ctl = attach_pila(pipe, adapter(), scale=1.0)
    orig = ctl.adapter.forward

    def spy(latents, velocity, *a, **k):
        got.setdefault("x", latents.clone())
        return orig(latents, velocity, *a, **k)

    ctl.adapter.forward = spy
    captured = {}
    hook_pre = pipe.transformer.forward

    def record(*a, **k):
        captured.setdefault("x", k["hidden_states"].clone())
        return hook_pre(*a, **k)

    pipe.transformer.forward = record
    run_i2v(pipe)
    assert torch.equal(got["x"], captured["x"][:, :16])


@pytest.mark.parametrize("version", ["2.1", "2.2"])
def test_t2v_scale0_bit_identical_and_nonzero_runs(version):
    from visionmoe.video.models.tiny import load_tiny_wan

    pipe = load_tiny_wan(version)
    kw = dict(prompt="a ball falls", negative_prompt="", height=32, width=32, num_frames=9, num_inference_steps=2,
              guidance_scale=5.0, output_type="latent", max_sequence_length=16)
    base = pipe(generator=torch.Generator().manual_seed(0), **kw).frames
    ctl = attach_pila(pipe, adapter(), scale=0.0)
    assert torch.equal(pipe(generator=torch.Generator().manual_seed(0), **kw).frames, base)
    ctl.settings.scale = 1.0
    out = pipe(generator=torch.Generator().manual_seed(0), **kw).frames
    assert torch.isfinite(out).all() and not torch.allclose(out, base, atol=1e-4)


def test_ti2v_5b_48_channel_vae_is_one_clear_line():
    from diffusers import AutoencoderKLWan, WanPipeline

    comp = tiny_wan_components("2.1")
    comp["transformer"] = _transformer(11, in_channels=48, out_channels=48)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        comp["vae"] = AutoencoderKLWan(base_dim=3, z_dim=48, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                       temperal_downsample=[False, True, True]).eval()
    pipe = WanPipeline(**comp)
    with pytest.raises(ValueError) as e:
        attach_pila(pipe, adapter(), scale=1.0)
    msg = str(e.value)
    assert "\n" not in msg and "48-channel" in msg and "TI2V-5B" in msg and "AutoencoderKLWan" in msg
    assert "latent_channels=48" in msg


@pytest.mark.parametrize("version", ["2.1", "2.2"])
def test_i2v_trajectory_projection_runs_and_steps_zero_is_the_base(version):
    """The projection wraps the scheduler, which steps the 16 latent channels in image-to-video too."""
    from visionmoe.video.hooks.trajectory_projection import attach_trajectory_projection, detach_trajectory_projection

    pipe = tiny_i2v(version)
    base = run_i2v(pipe)
    p = attach_trajectory_projection(pipe, steps=0)
    assert torch.equal(run_i2v(pipe), base) and p.calls == 0
    p = attach_trajectory_projection(pipe, steps=1, check_domain=False)  # a tiny random Wan draws noise
    out = run_i2v(pipe)
    assert p.calls == 1 and out.shape == base.shape and torch.isfinite(out).all()
    assert not torch.equal(out, base)  # the last step's clean estimate was re-drawn
    detach_trajectory_projection(pipe)
    assert torch.equal(run_i2v(pipe), base)
    video = run_i2v(pipe, output_type="pt")
    p = attach_trajectory_projection(pipe, space="pixels", check_domain=False)  # the latents stay the base's
    assert torch.equal(run_i2v(pipe), base)
    out = run_i2v(pipe, output_type="pt")
    assert p.calls == 1 and out.shape == video.shape and not torch.equal(out, video)
    detach_trajectory_projection(pipe)
    assert torch.equal(run_i2v(pipe, output_type="pt"), video)
