import pytest
import torch

from visionmoe.video.pila.adapter import PILAAdapter
from visionmoe.video.pila.fields import latent_flow, patchify, unpatchify
from visionmoe.video.pila.taxonomy import CATEGORY_NAMES, SLOTS

SMALL = dict(hidden_dim=32, slot_dim=8, expert_hidden=32)


def inputs(B=2, F=5, H=8, W=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, 16, F, H, W, generator=g)
    v = torch.randn(B, 16, F, H, W, generator=g)
    return x, v, torch.tensor([0.8, 0.3])[:B]


def trained_like(adapter, std=0.05, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        adapter.decoder.weight.copy_(torch.randn(adapter.decoder.weight.shape, generator=g) * std)
    return adapter


def test_untrained_is_exact_noop_and_structured_output():
    a = PILAAdapter(**SMALL).eval()
    x, v, s = inputs()
    out = a(x, v, s)
    assert out.dv.shape == x.shape and bool((out.dv == 0).all())
    assert out.bank.slots.shape == (2 * 5 * 4 * 6, len(SLOTS), 8)
    assert set(out.refined_proxies) == set(SLOTS)
    assert out.refined_proxies["velocity"].shape == (2, 2, 5, 4, 6)
    assert set(out.residuals) == {"kinematic", "trajectory", "advection", "continuity", "incompressibility", "rigidity", "gravity", "heat"}
    assert out.aux_loss.ndim == 0 and out.z_loss.ndim == 0
    assert out.experts.category_mass.shape == (2, len(CATEGORY_NAMES))
    assert torch.isfinite(out.residual_loss())


def test_prior_mask_routes_only_allowed_categories():
    a = PILAAdapter(**SMALL, experts_per_category=2, top_k=2).eval()
    x, v, s = inputs()
    mask = torch.zeros(2, len(CATEGORY_NAMES), dtype=torch.bool)
    mask[0, CATEGORY_NAMES.index("liquid")] = True
    mask[1, CATEGORY_NAMES.index("rigid")] = True
    mask[1, CATEGORY_NAMES.index("thermal")] = True
    out = a(x, v, s, category_mask=mask)
    mass = out.experts.category_mass
    assert torch.allclose(mass.sum(1), torch.ones(2), atol=1e-5)
    assert bool((mass[~mask] == 0).all()) and bool((mass[mask] > 0).any())
    idx = out.experts.router.indices.view(2, -1, 2)
    assert set((idx[0] // 2).unique().tolist()) == {CATEGORY_NAMES.index("liquid")}


def test_category_scale_zero_equals_masking_that_category_out():
    a = trained_like(PILAAdapter(**SMALL, top_k=1)).eval()
    x, v, s = inputs()
    only = torch.zeros(len(CATEGORY_NAMES), dtype=torch.bool)
    only[0] = True
    scale = torch.zeros(len(CATEGORY_NAMES))
    base = a(x, v, s, category_mask=only, category_scale=scale).dv
    # with the only allowed category scaled to 0 the experts contribute nothing: the decoder
    # sees the unrefined bank
    bank = a.fields(x, v, s)
    fused = a.fuse(torch.cat([bank.slots.flatten(1), bank.hidden], -1))
    ref = unpatchify(a.decoder(fused), bank.grid, 16, 2)
    torch.testing.assert_close(base, ref)


def test_gradients_reach_every_stage():
    a = trained_like(PILAAdapter(**SMALL)).train()
    x, v, s = inputs()
    out = a(x, v, s)
    loss = out.dv.pow(2).mean() + out.residual_loss() + 0.01 * out.aux_loss + 0.001 * out.z_loss
    loss.backward()
    for name in ("fields.embed.weight", "experts.router.weight", "experts.experts.0.fc1.weight", "decoder.weight", "log_kappa"):
        grad = dict(a.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_odd_sizes_are_padded_and_cropped():
    a = trained_like(PILAAdapter(**SMALL)).eval()
    x, v, s = inputs(B=1, F=3, H=7, W=9)
    assert a(x, v, s).dv.shape == x.shape


def test_wrong_channels_clear_error():
    a = PILAAdapter(**SMALL)
    x = torch.randn(1, 48, 3, 8, 8)
    with pytest.raises(ValueError, match=r"expects latents \[B, 16, F, H, W\]"):
        a(x, x, 0.5)
    with pytest.raises(ValueError, match="16-channel latents but the pipeline uses 48-channel"):
        a.check_compatible(latent_channels=48)


def test_patchify_roundtrip_and_flow_anchor():
    x = torch.randn(2, 16, 3, 6, 8)
    t = patchify(x, 2)
    assert t.shape == (2 * 3 * 3 * 4, 64)
    assert torch.equal(unpatchify(t, (2, 3, 3, 4), 16, 2), x)
    # a pattern shifted by one cell per frame: the flow anchor recovers the displacement
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    frames = [torch.stack([torch.sin(0.5 * (xx - f)) + torch.cos(0.35 * yy + 0.2 * c) for c in range(4)]) for f in range(3)]
    x0 = torch.stack(frames, dim=1)[None]  # [1, 4, 3, 16, 16], moves +x
    flow = latent_flow(x0)[:, :, :, 4:-4, 4:-4]
    assert abs(float(flow[0, 0].mean()) - 1.0) < 0.2 and abs(float(flow[0, 1].mean())) < 0.1


def test_save_load_roundtrip(tmp_path):
    a = trained_like(PILAAdapter(**SMALL, text_dim=32)).eval()
    a.save_pretrained(tmp_path)
    assert (tmp_path / "diffusion_pytorch_model.safetensors").is_file()
    b = PILAAdapter.from_pretrained(tmp_path).eval()
    assert b.config.text_dim == 32 and b.config.hidden_dim == 32
    x, v, s = inputs()
    text = torch.randn(2, 5, 32)
    assert torch.equal(a(x, v, s, text).dv, b(x, v, s, text).dv)


@pytest.mark.parametrize("trained", [False, True])
def test_residual_guidance_lowers_residual_energy(trained):
    a = PILAAdapter(**SMALL).eval()
    if trained:
        trained_like(a)
    # smooth moving latents: a pattern drifting in x with some noise
    yy, xx = torch.meshgrid(torch.arange(8.0), torch.arange(12.0), indexing="ij")
    g = torch.Generator().manual_seed(0)
    x0 = torch.stack([torch.stack([torch.sin(0.6 * (xx - 0.7 * f * (1 + 0.3 * f)) + c) * torch.cos(0.4 * yy) for f in range(5)]) for c in range(16)])[None]
    noise = torch.randn(x0.shape, generator=g)
    sigma = torch.tensor([0.4])
    x_t = 0.6 * x0 + 0.4 * noise
    v = noise - x0 + 0.3 * torch.randn(x0.shape, generator=g)
    mask = torch.tensor([True, False, False, False, False, False])  # rigid: kinematic, rigidity, gravity
    dv, e0 = a.residual_guidance(x_t, v, sigma, 0.005, category_mask=mask)
    assert dv.shape == v.shape and float(dv.pow(2).mean().sqrt()) == pytest.approx(0.005 * float(v.pow(2).mean().sqrt()), rel=1e-4)
    with torch.no_grad():
        e1 = a(x_t, v + dv, sigma, category_mask=mask).residual_loss()
    assert e1 < e0 * 0.999
    assert not any(p.grad is not None for p in a.parameters())  # guidance does not touch weights
    small = a.residual_guidance(x_t[:, :, :2], v[:, :, :2], sigma, 0.005)[0]  # 2 latent frames: no residual
    assert bool((small == 0).all())


def test_runs_under_bf16_autocast():
    a = trained_like(PILAAdapter(**SMALL)).eval()
    x, v, s = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = a(x, v, s)
    reference = a(x, v, s).dv
    assert torch.isfinite(out.dv.float()).all()
    torch.testing.assert_close(out.dv.float(), reference, atol=0.05, rtol=0.1)


def test_more_context_keeps_the_no_op_and_the_shipped_layout():
    """context_blocks / clip_context widen what a token sees; the defaults are the shipped
    architecture (same parameter names), and an untrained adapter stays an exact no-op."""
    base = PILAAdapter(latent_channels=16, hidden_dim=16, slot_dim=4, expert_hidden=16)
    wide = PILAAdapter(latent_channels=16, hidden_dim=16, slot_dim=4, expert_hidden=16, context_blocks=3,
                       clip_context=True)
    assert set(base.state_dict()) < set(wide.state_dict())
    assert not any("more_context" in k or "clip_context" in k for k in base.state_dict())
    x = torch.randn(2, 16, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    out = wide(x, torch.randn_like(x), torch.tensor([0.3, 0.9]))
    assert torch.equal(out.dv, torch.zeros_like(x))
    with pytest.raises(ValueError, match="context_blocks"):
        PILAAdapter(latent_channels=16, hidden_dim=16, slot_dim=4, expert_hidden=16, context_blocks=0)
