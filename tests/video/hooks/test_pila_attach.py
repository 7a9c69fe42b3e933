"""PILA on tiny randomly initialised Wan 2.1 / 2.2 pipelines built offline."""

import pytest
import torch
from diffusers.hooks import HookRegistry, ModelHook

from visionmoe.video.pila.adapter import PILAAdapter
from visionmoe.video.hooks.pila import attach_pila, detach_pila, is_attached
from visionmoe.video.pipelines.wan_pila import WanPILAPipeline
from visionmoe.video.models.tiny import load_tiny_wan

SMALL = dict(hidden_dim=32, slot_dim=8, expert_hidden=32, text_dim=32)
PROMPT = "a rubber ball falls and bounces on the floor"


def run(pipe, guidance=5.0, steps=2, height=32, width=32, **kw):
    return pipe(
        prompt=PROMPT,
        negative_prompt="blurry",
        height=height,
        width=width,
        num_frames=9,
        num_inference_steps=steps,
        guidance_scale=guidance,
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
        max_sequence_length=16,
        **kw,
    ).frames


def adapter(seed=1, **kw):
    a = PILAAdapter(**{**SMALL, **kw}).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # stands in for a trained decoder: dv != 0
        a.decoder.weight.copy_(torch.randn(a.decoder.weight.shape, generator=g) * 0.1)
    return a


@pytest.mark.parametrize("version", ["2.1", "2.2"])
@pytest.mark.parametrize("guidance", [5.0, 1.0], ids=["cfg", "nocfg"])
def test_scale0_and_detach_bit_identical(version, guidance):
    pipe = load_tiny_wan(version)
    base = run(pipe, guidance)
    controller = attach_pila(pipe, adapter(), scale=0.0)
    assert torch.equal(run(pipe, guidance), base)
    assert controller.calls == 0  # scale 0: the adapter never runs
    controller.settings.scale = 1.0
    corrected = run(pipe, guidance)
    assert not torch.allclose(corrected, base, atol=1e-3)
    assert controller.calls == 2  # one adapter call per step, shared by the CFG branches
    detach_pila(pipe)
    assert not is_attached(pipe) and "encode_prompt" not in vars(pipe)
    for m in (pipe.transformer, pipe.transformer_2):
        if m is not None:
            assert m._diffusers_hook.get_hook("pila") is None
    assert torch.equal(run(pipe, guidance), base)


def test_untrained_adapter_changes_nothing():
    pipe = load_tiny_wan("2.2")
    base = run(pipe)
    attach_pila(pipe, PILAAdapter(**SMALL), scale=3.0)
    assert torch.equal(run(pipe), base)  # v + s * 0 == v


class Recorder(ModelHook):
    """Records the transformer's raw outputs (registered before PILA, so it sits inside it)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def pre_forward(self, module, *args, **kwargs):
        self._x = kwargs["hidden_states"]
        return args, kwargs

    def post_forward(self, module, output):
        self.calls.append((self._x.clone(), output[0].clone()))
        return output


def test_guidance_algebra_cfg_combined_velocity_gets_s_dv():
    pipe = load_tiny_wan("2.1")
    rec = Recorder()
    HookRegistry.check_if_exists_or_initialize(pipe.transformer).register_hook(rec, "recorder")
    a, s, g = adapter(), 0.7, 4.0
    attach_pila(pipe, a, scale=s, categories=["liquid"])
    seen = []
    step = pipe.scheduler.step
    pipe.scheduler.step = lambda v, t, x, **kw: (seen.append((v.clone(), x.clone())), step(v, t, x, **kw))[1]
    run(pipe, guidance=g)
    assert len(rec.calls) == 4 and len(seen) == 2
    sigmas = pipe.scheduler.sigmas
    mask = torch.zeros(1, 6, dtype=torch.bool)
    mask[0, 2] = True  # liquid
    for i, (v_pred, x) in enumerate(seen):
        (xc, vc), (xu, vu) = rec.calls[2 * i], rec.calls[2 * i + 1]
        assert torch.equal(xc, x) and torch.equal(xu, x)
        with torch.no_grad():
            dv = a(x, vc, torch.tensor([float(sigmas[i])]), category_mask=mask, compute_residuals=False).dv
        torch.testing.assert_close(v_pred, vu + g * (vc - vu) + s * dv, rtol=1e-5, atol=1e-5)


def test_wan22_both_transformers_and_window():
    pipe = load_tiny_wan("2.2")
    base = run(pipe)
    # 2 steps: step 0 runs `transformer` (high noise), step 1 `transformer_2` (low noise)
    a = adapter()
    attach_pila(pipe, a, start=0.0, end=0.5)
    first_only = run(pipe)
    attach_pila(pipe, a, start=0.5, end=1.0)
    second_only = run(pipe)
    for out in (first_only, second_only):
        assert not torch.allclose(out, base, atol=1e-3)
    assert not torch.allclose(first_only, second_only, atol=1e-3)
    assert pipe.transformer_2._diffusers_hook.get_hook("pila") is not None
    detach_pila(pipe)
    assert torch.equal(run(pipe), base)


def test_categories_auto_user_and_per_category_scale():
    pipe = load_tiny_wan("2.1")
    a = adapter()
    c = attach_pila(pipe, a)
    auto = run(pipe)
    assert [p.categories for p in c.priors] == [("rigid", "elastic")]
    c = attach_pila(pipe, a, categories="liquid")
    user = run(pipe)
    assert [p.source for p in c.priors] == ["user"] and c.priors[0].categories == ("liquid",)
    assert not torch.allclose(auto, user, atol=1e-4)
    attach_pila(pipe, a, categories=["liquid"], per_category_scale={"liquid": 0.0})
    muted = run(pipe)
    assert not torch.allclose(muted, user, atol=1e-4)
    with pytest.raises(ValueError, match="unknown physics category"):
        attach_pila(pipe, a, per_category_scale={"plasma": 1.0})
    with pytest.raises(ValueError, match="start <= end"):
        attach_pila(pipe, a, start=0.8, end=0.2)
    # a trained text classifier takes over "auto"
    with torch.no_grad():
        a.text_classifier.trained.fill_(True)
    c = attach_pila(pipe, a)
    run(pipe)
    assert c.priors[0].source == "learned"


def test_model_cpu_offload_and_group_offload():
    a = adapter()
    ref_pipe = load_tiny_wan("2.2")
    base = run(ref_pipe)
    attach_pila(ref_pipe, a)
    ref = run(ref_pipe)
    # diffusers refuses model offload without an accelerator unless the device is given:
    # device="cpu" runs the same accelerate hook chain (CpuOffload + user hooks) on CPU.
    for order in ("attach_first", "offload_first"):
        pipe = load_tiny_wan("2.2")
        if order == "attach_first":
            attach_pila(pipe, a)
        pipe.enable_model_cpu_offload(device="cpu")
        if order == "offload_first":
            attach_pila(pipe, a)
        assert hasattr(pipe.transformer, "_hf_hook")
        assert torch.equal(run(pipe), ref), order
        detach_pila(pipe)
        assert hasattr(pipe.transformer, "_hf_hook"), "detach must keep accelerate's offload hook"
        assert torch.equal(run(pipe), base), order
    pipe = load_tiny_wan("2.2")
    for m in (pipe.transformer, pipe.transformer_2):
        m.enable_group_offload(torch.device("cpu"), offload_device=torch.device("cpu"), offload_type="block_level", num_blocks_per_group=1)
    attach_pila(pipe, a)
    assert torch.equal(run(pipe), ref)
    detach_pila(pipe)
    assert torch.equal(run(pipe), base)


def test_loaded_lora(tmp_path):
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    donor = load_tiny_wan("2.1")
    with torch.random.fork_rng():
        torch.manual_seed(3)
        donor.transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights=False, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    type(donor).save_lora_weights(tmp_path, transformer_lora_layers=get_peft_model_state_dict(donor.transformer))

    pipe = load_tiny_wan("2.1")
    plain = run(pipe)
    pipe.load_lora_weights(tmp_path, adapter_name="style")
    with_lora = run(pipe)
    assert not torch.allclose(with_lora, plain, atol=1e-4)  # the LoRA is active
    a = adapter()
    c = attach_pila(pipe, a, scale=0.0)
    assert torch.equal(run(pipe), with_lora)
    c.settings.scale = 1.0
    corrected = run(pipe)
    assert not torch.allclose(corrected, with_lora, atol=1e-3)
    detach_pila(pipe)
    assert torch.equal(run(pipe), with_lora)


def assert_reproduces(got, want):
    """Same weights, same outputs up to float32 rounding: weights loaded from safetensors sit at
    other memory alignments than freshly built ones, and on some CPUs the GEMM kernels then take
    other code paths (measured on an AMD EPYC: 2.6e-6 apart with bit-identical state dicts)."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_adapter_roundtrip_reproduces_outputs(tmp_path):
    pipe = load_tiny_wan("2.2")
    a = adapter()
    attach_pila(pipe, a)
    ref = run(pipe)
    a.save_pretrained(tmp_path / "pila")
    assert (tmp_path / "pila" / "diffusion_pytorch_model.safetensors").is_file()
    attach_pila(pipe, PILAAdapter.from_pretrained(tmp_path / "pila"))
    assert_reproduces(run(pipe), ref)


def test_incompatible_adapter_fails_clearly(tmp_path):
    pipe = load_tiny_wan("2.1")
    with pytest.raises(ValueError, match="WanPipeline works in 16-channel latents .* this PILA adapter reads 48-channel"):
        attach_pila(pipe, PILAAdapter(latent_channels=48, hidden_dim=16, slot_dim=4, expert_hidden=16))
    PILAAdapter(**{**SMALL, "text_dim": 4096}).save_pretrained(tmp_path / "big_text")
    with pytest.raises(ValueError, match="4096-dim text embeddings but the WanPILAPipeline produces 32"):
        WanPILAPipeline.from_pipe(pipe, adapter=tmp_path / "big_text")
    assert not is_attached(pipe)


def test_wan_pila_pipeline_from_pretrained(tmp_path):
    base_pipe = load_tiny_wan("2.2")
    a = adapter()
    attach_pila(base_pipe, a, scale=0.5)
    ref = run(base_pipe)
    detach_pila(base_pipe)
    base_pipe.save_pretrained(tmp_path / "wan")
    a.save_pretrained(tmp_path / "pila")
    pipe = WanPILAPipeline.from_pretrained(tmp_path / "wan", adapter=tmp_path / "pila", pila_kwargs={"scale": 0.5})
    pipe.set_progress_bar_config(disable=True)
    assert isinstance(pipe, WanPILAPipeline) and pipe.adapter is not None
    assert pipe.transformer_2 is not None and pipe.config.boundary_ratio == 0.875
    assert_reproduces(run(pipe), ref)
    assert_reproduces(run(pipe, pila_scale=0.0), run(base_pipe))
    with pytest.raises(FileNotFoundError, match="Wan model not found"):
        WanPILAPipeline.from_pretrained(tmp_path / "missing")


def test_vae_tiling_decodes_corrected_latents():
    pipe = load_tiny_wan("2.1")
    pipe.vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=16, tile_sample_stride_width=16)
    kw = dict(prompt=PROMPT, height=48, width=32, num_frames=5, num_inference_steps=2, guidance_scale=1.0, max_sequence_length=16)
    attach_pila(pipe, adapter())
    latents = pipe(**kw, generator=torch.Generator().manual_seed(0), output_type="latent").frames
    video = pipe(**kw, generator=torch.Generator().manual_seed(0), output_type="np").frames
    # the video is the tiled decode of the corrected latents
    mean = torch.tensor(pipe.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = 1.0 / torch.tensor(pipe.vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        decoded = pipe.vae.decode(latents / std + mean, return_dict=False)[0]
    ref = pipe.video_processor.postprocess_video(decoded, output_type="np")
    assert video.shape == (1, 5, 48, 32, 3) and abs(ref - video).max() < 1e-5


def test_direct_call_without_cache_context_uses_timestep_sigma():
    pipe = load_tiny_wan("2.1")
    a = adapter()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 3, 4, 4, generator=g)
    text = torch.randn(1, 16, 32, generator=g)
    t = torch.tensor([600.0])
    with torch.no_grad():
        raw = pipe.transformer(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
        attach_pila(pipe, a, scale=0.5, categories=["gas"])
        out = pipe.transformer(hidden_states=x, timestep=t, encoder_hidden_states=text).sample  # return_dict=True
        mask = torch.zeros(1, 6, dtype=torch.bool)
        mask[0, 3] = True
        dv = a(x, raw, torch.tensor([0.6]), text, category_mask=mask, compute_residuals=False).dv
    torch.testing.assert_close(out, raw + 0.5 * dv)


def test_residual_guidance_in_pipeline():
    pipe = load_tiny_wan("2.1")
    a = PILAAdapter(**SMALL)  # untrained: dv == 0, only the residual step acts
    size = dict(height=48, width=48)  # 3x3 tokens per latent frame: the smallest grid with residuals
    base = run(pipe, **size)
    c = attach_pila(pipe, a, residual_guidance=0.01)
    guided = run(pipe, **size)
    assert c.last_energy is not None and c.calls == 2
    assert not torch.allclose(guided, base, atol=1e-4)
    with pytest.raises(ValueError, match="residual_guidance must be >= 0"):
        attach_pila(pipe, a, residual_guidance=-1.0)
    detach_pila(pipe)
    assert torch.equal(run(pipe, **size), base)


def test_batched_prompts_get_their_own_priors():
    pipe = load_tiny_wan("2.1")
    c = attach_pila(pipe, adapter())
    out = pipe(
        prompt=["water pours into a glass", "smoke rises slowly"],
        negative_prompt="",
        height=32,
        width=32,
        num_frames=5,
        num_inference_steps=1,
        num_videos_per_prompt=2,
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
        max_sequence_length=16,
    ).frames
    assert out.shape[0] == 4 and torch.isfinite(out).all()
    assert [p.categories for p in c.priors] == [("liquid",), ("gas",)]
    mask = c.category_mask(4, None, "cpu")  # prompt-major, like Wan's prompt embeddings
    assert mask.tolist() == [[False, False, True, False, False, False]] * 2 + [[False, False, False, True, False, False]] * 2


class TextRecorder(Recorder):
    """Also records each call's text embeddings."""

    def pre_forward(self, module, *args, **kwargs):
        self._text = kwargs["encoder_hidden_states"]
        return super().pre_forward(module, *args, **kwargs)

    def post_forward(self, module, output):
        self.calls.append((self._x.clone(), output[0].clone(), self._text.clone()))
        return output


def test_each_branch_corrects_every_call_before_guidance():
    """apply_to='each_branch': the conditional call gets dv_c (prompt prior), the unconditional
    one dv_u (every category allowed), each from its own velocity and text, and guidance
    combines the corrected branches: v' = v_cfg + s (dv_u + g (dv_c - dv_u))."""
    pipe = load_tiny_wan("2.1")
    rec = TextRecorder()
    HookRegistry.check_if_exists_or_initialize(pipe.transformer).register_hook(rec, "recorder")
    a, s, g = adapter(apply_to="each_branch"), 0.7, 4.0
    with torch.no_grad():  # a text classifier that acts, so a wrong text would show
        a.text_prior_weight.fill_(1.0)
        for p in a.text_classifier.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)) * 0.5)
    c = attach_pila(pipe, a, scale=s, categories=["liquid"])
    assert c.settings.apply_to == "each_branch"  # read from the adapter's config
    seen = []
    step = pipe.scheduler.step
    pipe.scheduler.step = lambda v, t, x, **kw: (seen.append((v.clone(), x.clone())), step(v, t, x, **kw))[1]
    run(pipe, guidance=g)
    assert len(rec.calls) == 4 and len(seen) == 2 and c.calls == 4  # one adapter call per transformer call
    sigmas = pipe.scheduler.sigmas
    liquid = torch.zeros(1, 6, dtype=torch.bool)
    liquid[0, 2] = True
    for i, (v_pred, x) in enumerate(seen):
        (xc, vc, tc), (xu, vu, tu) = rec.calls[2 * i], rec.calls[2 * i + 1]
        assert torch.equal(xc, x) and torch.equal(xu, x) and not torch.equal(tc, tu)
        sig = torch.tensor([float(sigmas[i])])
        with torch.no_grad():
            dv_c = a(x, vc, sig, encoder_hidden_states=tc, category_mask=liquid, compute_residuals=False).dv
            dv_u = a(x, vu, sig, encoder_hidden_states=tu, category_mask=torch.ones(1, 6, dtype=torch.bool),
                     compute_residuals=False).dv
        assert not torch.allclose(dv_c, dv_u, atol=1e-4)
        want = (vu + s * dv_u) + g * ((vc + s * dv_c) - (vu + s * dv_u))
        torch.testing.assert_close(v_pred, want, rtol=1e-5, atol=1e-5)


def test_apply_to_follows_the_adapter_unless_overridden(tmp_path):
    pipe = load_tiny_wan("2.1")
    base = run(pipe)
    a = adapter(apply_to="each_branch")
    a.save_pretrained(tmp_path / "eb")
    loaded = PILAAdapter.from_pretrained(tmp_path / "eb").eval()
    assert loaded.config.apply_to == "each_branch"
    assert attach_pila(pipe, loaded).settings.apply_to == "each_branch"
    each = run(pipe)
    c = attach_pila(pipe, loaded, apply_to="guided")
    guided = run(pipe)
    assert c.calls == 2 and not torch.allclose(each, guided, atol=1e-4)
    detach_pila(pipe)  # the pipelines share their transformer
    pipe2 = WanPILAPipeline.from_pipe(pipe, adapter=loaded, pila_kwargs={"scale": 0.5})
    pipe2.set_progress_bar_config(disable=True)
    half = run(pipe2)
    torch.testing.assert_close(run(pipe2, pila_scale=0.5), half)  # a per-call override keeps the mode
    assert pipe2.pila.settings.apply_to == "each_branch"
    detach_pila(pipe2)
    assert attach_pila(pipe, adapter()).settings.apply_to == "guided"  # the default (and older adapters)
    attach_pila(pipe, loaded, scale=0.0)
    assert torch.equal(run(pipe), base)  # scale 0 stays bit-identical in either mode
    with pytest.raises(ValueError, match="apply_to"):
        attach_pila(pipe, loaded, apply_to="sideways")
    with pytest.raises(ValueError, match="residual_guidance works with apply_to='guided'"):
        attach_pila(pipe, loaded, residual_guidance=0.01)
    with pytest.raises(ValueError, match="apply_to"):
        PILAAdapter(**SMALL, apply_to="both")
    detach_pila(pipe)
    assert torch.equal(run(pipe), base)
