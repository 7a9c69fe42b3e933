"""Staged PILA training on the tiny offline Wan: every stage runs, the backbone stays frozen
bit for bit, a resumed run continues exactly, bad inputs give clear errors, and the same
script runs under ``accelerate launch --num_processes 2 --cpu``."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from visionmoe.video.data.synthetic import write_dataset
from visionmoe.video.pila.adapter import PILAAdapter
from visionmoe.video.training.config import TrainConfig
from visionmoe.video.training.loop import train
from visionmoe.video.training.losses import motion_loss
from visionmoe.video.training.sampling import batch_indices

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SMALL = dict(num_frames=9, height=48, width=48, max_sequence_length=32, batch_size=2, log_every=1,
             adapter={"hidden_dim": 32, "slot_dim": 8, "expert_hidden": 32})


@pytest.fixture(scope="module")
def pipe():
    from visionmoe.video.models.tiny import load_tiny_wan

    return load_tiny_wan()


@pytest.fixture(scope="module")
def cache(tmp_path_factory, pipe):
    """A latent cache of 4 synthetic clips (one unreadable video listed too)."""
    root = tmp_path_factory.mktemp("train")
    manifest = write_dataset(str(root / "ds"), 4, seed=3, scenarios=["bounce", "pouring", "smoke", "melting"],
                             num_frames=9, height=48, width=48)
    (root / "ds" / "videos" / "broken.mp4").write_bytes(b"broken")
    with open(manifest, "a") as fh:
        fh.write(json.dumps({"video": "videos/broken.mp4", "caption": "a broken clip", "labels": ["rigid"]}) + "\n")
    cfg = TrainConfig(stage=1, output_dir=str(root / "prep"), data=manifest, cache_dir=str(root / "cache"),
                      max_steps=1, **SMALL)
    res = train(cfg, pipe=pipe)
    assert res.skipped_videos == 1
    return str(root / "cache"), manifest


def _digest(module):
    h = hashlib.sha256()
    for k, v in sorted(module.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _adapter_state(path):
    from safetensors.torch import load_file

    return load_file(os.path.join(path, "diffusion_pytorch_model.safetensors"))


def test_config_validation(tmp_path):
    with pytest.raises(ValueError, match="stage must be 1, 2 or 3"):
        TrainConfig(stage=4, data="x")
    with pytest.raises(ValueError, match="4k\\+1"):
        TrainConfig(num_frames=16, data="x")
    with pytest.raises(ValueError, match="give data"):
        TrainConfig()
    with pytest.raises(ValueError, match="unknown adapter option"):
        TrainConfig(data="x", adapter={"hiden_dim": 3})
    with pytest.raises(ValueError, match="unknown config key"):
        TrainConfig.from_dict({"data": "x", "learning_rat": 1})
    cfg = TrainConfig(data="m.jsonl", stage=2, max_steps=7, output_dir=str(tmp_path))
    cfg.to_yaml(str(tmp_path / "c.yaml"))
    again = TrainConfig.from_yaml(str(tmp_path / "c.yaml"), max_steps=9)
    assert again.stage == 2 and again.max_steps == 9 and again.cache_dir == cfg.cache_dir
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="fp16.*CUDA"):
            train(TrainConfig(data="x", mixed_precision="fp16", output_dir=str(tmp_path)))


def test_batches_cover_the_data_and_shard_across_processes():
    one = [i for m in range(3) for i in batch_indices(m, 4, 6, seed=1, rank=0, world=1)]
    assert sorted(one[:6]) == list(range(6)) and sorted(one[6:12]) == list(range(6))  # epochs are permutations
    two = [batch_indices(m, 2, 6, 1, r, 2) for m in range(3) for r in range(2)]
    assert [i for b in two for i in b] == one  # 2 processes x 2 = the same global batches


def test_motion_loss_sees_only_errors_that_change_over_time():
    g = torch.Generator().manual_seed(0)
    target = torch.randn(2, 4, 5, 6, 6, generator=g)
    static = torch.randn(2, 4, 1, 6, 6, generator=g).expand(-1, -1, 5, -1, -1)
    assert motion_loss(target + static, target) < 1e-10  # a wrong appearance, constant in time (rounding only)
    ramp = torch.arange(5.0).view(1, 1, 5, 1, 1).expand(2, 4, 5, 6, 6)
    assert torch.isclose(motion_loss(target + ramp, target), torch.tensor(1.0))  # 1st diff 1, 2nd diff 0
    err = torch.randn(2, 4, 5, 6, 6, generator=g)
    manual = (err[:, :, 1:] - err[:, :, :-1]).pow(2).mean() + \
        (err[:, :, 2:] - 2 * err[:, :, 1:-1] + err[:, :, :-2]).pow(2).mean()
    assert torch.isclose(motion_loss(target + err, target), manual)
    assert motion_loss(err[:, :, :1], torch.zeros_like(err[:, :, :1])) == 0  # one frame: no motion


def test_all_stages_two_steps_backbone_frozen(tmp_path, cache, pipe):
    cache_dir, _ = cache
    frozen = {n: _digest(getattr(pipe, n)) for n in ("transformer", "vae", "text_encoder")}
    prev = None
    for stage in (1, 2, 3):
        out = str(tmp_path / f"s{stage}")
        cfg = TrainConfig(stage=stage, output_dir=out, cache_dir=cache_dir, init_adapter=prev, max_steps=2,
                          checkpoint_every=2, w_motion=0.5 if stage == 3 else 0.0, **SMALL)
        res = train(cfg, pipe=pipe)
        assert res.steps == 2 and len(res.history) == 2
        assert all(torch.isfinite(torch.tensor(v)) for h in res.history for v in h.values())
        keys = {1: {"anchor"}, 2: {"category", "classifier", "balance", "z", "residual"},
                3: {"flow", "flow_base", "motion", "residual", "balance", "physics", "physics_base", "physics_data"}}[stage]
        assert keys <= set(res.history[-1])
        after = _adapter_state(res.adapter_dir)
        if prev is not None:
            before = _adapter_state(prev)
            changed = {k.split(".")[0] for k in after if not torch.equal(after[k], before[k])}
            expect = {2: {"experts", "text_classifier", "text_prior_weight", "log_kappa"},
                      3: {"fields", "experts", "fuse", "decoder", "text_classifier", "text_prior_weight", "log_kappa"}}[stage]
            assert changed <= expect and {"experts"} <= changed, changed
            if stage == 3:
                assert "decoder" in changed  # the zero-initialised velocity decoder learns
        prev = res.adapter_dir
    assert {n: _digest(getattr(pipe, n)) for n in frozen} == frozen  # the backbone is bit-identical
    from visionmoe.video.pila.adapter import PILAAdapter

    final = PILAAdapter.from_pretrained(prev)
    assert bool(final.text_classifier.trained)


def test_resume_continues_where_it_stopped(tmp_path, cache, pipe):
    cache_dir, _ = cache
    kw = dict(stage=3, cache_dir=cache_dir, checkpoint_every=2, gradient_accumulation_steps=2, **SMALL)
    straight = train(TrainConfig(output_dir=str(tmp_path / "a"), max_steps=4, **kw), pipe=pipe)
    first = train(TrainConfig(output_dir=str(tmp_path / "b"), max_steps=2, **kw), pipe=pipe)
    assert first.steps == 2
    resumed = train(TrainConfig(output_dir=str(tmp_path / "b"), max_steps=4, **kw), pipe=pipe)
    assert resumed.resumed_from.endswith("checkpoint-2") and resumed.steps == 4
    assert [h["step"] for h in resumed.history] == [3, 4]
    assert [h["total"] for h in resumed.history] == [h["total"] for h in straight.history[2:]]
    a, b = _adapter_state(straight.adapter_dir), _adapter_state(resumed.adapter_dir)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    with pytest.raises(ValueError, match="from stage 3"):
        train(TrainConfig(output_dir=str(tmp_path / "b"), max_steps=5, **{**kw, "stage": 2}), pipe=pipe)


def test_save_dtype_float16_halves_the_file_and_loads_as_float32(tmp_path, cache, pipe):
    from visionmoe.video.pila.adapter import PILAAdapter

    cache_dir, _ = cache
    kw = dict(stage=1, cache_dir=cache_dir, max_steps=1, seed=5, **SMALL)
    full = train(TrainConfig(output_dir=str(tmp_path / "f32"), **kw), pipe=pipe)
    half = train(TrainConfig(output_dir=str(tmp_path / "f16"), save_dtype="float16", **kw), pipe=pipe)
    a, b = _adapter_state(full.adapter_dir), _adapter_state(half.adapter_dir)
    assert a.keys() == b.keys()
    for k in a:
        if a[k].is_floating_point():
            assert b[k].dtype == torch.float16, k
            torch.testing.assert_close(b[k], a[k].half(), rtol=0, atol=0, msg=k)
        else:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)
    weights = "diffusion_pytorch_model.safetensors"
    assert os.path.getsize(os.path.join(half.adapter_dir, weights)) < 0.6 * os.path.getsize(
        os.path.join(full.adapter_dir, weights))
    loaded = PILAAdapter.from_pretrained(half.adapter_dir)
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    with pytest.raises(ValueError, match="save_dtype must be one of"):
        TrainConfig(data="x", save_dtype="half")


def test_bf16_backbone_and_wan22(tmp_path, cache):
    """Mixed precision runs the frozen backbone in bf16 (the adapter stays float32); the Wan 2.2
    layout (two transformers split at the boundary) trains too."""
    cache_dir, _ = cache
    res = train(TrainConfig(stage=3, output_dir=str(tmp_path / "bf"), cache_dir=cache_dir, max_steps=1,
                            mixed_precision="bf16", model="tiny", **SMALL))
    assert torch.isfinite(torch.tensor(res.history[-1]["flow"]))
    res = train(TrainConfig(stage=3, output_dir=str(tmp_path / "w22"), cache_dir=cache_dir, max_steps=1,
                            model="tiny-2.2", **SMALL))
    assert torch.isfinite(torch.tensor(res.history[-1]["flow"]))


def test_backbone_velocity_switches_transformers_at_the_boundary():
    from visionmoe.video.models.tiny import load_tiny_wan
    from visionmoe.video.training.backbone import backbone_velocity

    pipe = load_tiny_wan("2.2")
    x = torch.randn(2, 16, 3, 6, 6)
    text = torch.randn(2, 5, 32)
    sigma = torch.tensor([0.95, 0.3])  # boundary_ratio 0.875: high-noise model, then low-noise model
    v = backbone_velocity(pipe, x, sigma, text)
    with torch.no_grad():
        hi = pipe.transformer(hidden_states=x[:1], timestep=sigma[:1] * 1000, encoder_hidden_states=text[:1],
                              return_dict=False)[0]
        lo = pipe.transformer_2(hidden_states=x[1:], timestep=sigma[1:] * 1000, encoder_hidden_states=text[1:],
                                return_dict=False)[0]
    torch.testing.assert_close(v, torch.cat([hi, lo]))


class _ConstantVelocity(torch.nn.Module):
    """A stand-in backbone whose velocity is a fixed tensor, whatever the input."""

    def __init__(self, v):
        super().__init__()
        self.v = v
        self.w = torch.nn.Parameter(torch.zeros(()))  # backbone_velocity reads the dtype from a parameter

    def forward(self, hidden_states, timestep, encoder_hidden_states, return_dict=False):
        return (self.v[: len(hidden_states)].to(hidden_states.dtype),)


def test_rollout_stays_on_the_noising_path_for_an_exact_model_and_drifts_by_its_bias():
    from types import SimpleNamespace

    from visionmoe.video.training.losses import rollout

    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(3, 4, 3, 4, 4, generator=g), torch.randn(3, 4, 3, 4, 4, generator=g)
    sigma = torch.tensor([0.2, 0.6, 0.97])
    text, uncond = torch.randn(3, 5, 8, generator=g), torch.randn(1, 5, 8, generator=g)
    mask = torch.ones(3, 4, dtype=torch.bool)
    adapter = SimpleNamespace(text_classifier=None)
    no_dv = lambda x, v, s, **kw: SimpleNamespace(dv=torch.zeros_like(x))  # noqa: E731
    cfg = TrainConfig(stage=3, cache_dir="unused", rollout_steps=3, rollout_du=0.05, rollout_shift=3.0,
                      rollout_guidance=3.0)
    s = sigma.view(-1, 1, 1, 1, 1)
    exact = SimpleNamespace(transformer=_ConstantVelocity(eps - x0))
    torch.testing.assert_close(rollout(no_dv, adapter, exact, x0, eps, sigma, text, uncond, mask, cfg),
                               (1 - s) * x0 + s * eps)
    # a biased model drifts by bias * (sigma - sigma_start); sigma_start is 3 steps higher before the shift
    bias = torch.randn(3, 4, 3, 4, 4, generator=g)
    biased = SimpleNamespace(transformer=_ConstantVelocity(eps - x0 + bias))
    u = sigma / (3 - 2 * sigma)
    u_hi = (u + 0.15).clamp(max=1)
    s_hi = (3 * u_hi / (1 + 2 * u_hi)).view(-1, 1, 1, 1, 1)
    torch.testing.assert_close(rollout(no_dv, adapter, biased, x0, eps, sigma, text, uncond, mask, cfg),
                               (1 - s) * x0 + s * eps + (s - s_hi) * bias)
    assert float(s_hi[2]) == 1.0  # clamped at pure noise


def test_stage3_with_rollouts_trains_on_the_samplers_states(tmp_path, cache, pipe):
    cache_dir, _ = cache
    kw = dict(stage=3, cache_dir=cache_dir, max_steps=2, checkpoint_every=2, **SMALL)
    plain = train(TrainConfig(output_dir=str(tmp_path / "a"), **kw), pipe=pipe)
    rolled = train(TrainConfig(output_dir=str(tmp_path / "b"), rollout_steps=2, rollout_prob=1.0, **kw), pipe=pipe)
    assert all(torch.isfinite(torch.tensor(v)) for h in rolled.history for v in h.values())
    # same batches, noise and sigmas: only the states (and targets) differ
    assert rolled.history[0]["flow_base"] != plain.history[0]["flow_base"]
    with pytest.raises(ValueError, match="rollout_prob"):
        TrainConfig(output_dir=str(tmp_path / "c"), rollout_prob=2.0, **{**kw, "max_steps": 1})


def _script_main():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_pila_script", os.path.join(ROOT, "scripts", "train_pila.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def test_script_reports_bad_manifest_and_missing_files(tmp_path, capsys):
    main = _script_main()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"video": "a.mp4"}\n')
    assert main(["--data", str(bad), "--output-dir", str(tmp_path / "o"), "--quiet"]) == 2
    assert "missing 'caption'" in capsys.readouterr().err
    missing = tmp_path / "m.jsonl"
    missing.write_text('{"video": "gone.mp4", "caption": "a ball falls"}\n')
    assert main(["--data", str(missing), "--output-dir", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "gone.mp4" in err and "not found" in err
    assert main(["--data", str(missing), "--stage", "5"]) == 2  # the alias of `visionmoe-video train`: one line
    assert "stage must be 1, 2 or 3" in capsys.readouterr().err
    assert main(["--cache-dir", str(tmp_path / "no_cache"), "--output-dir", str(tmp_path / "o"), "--quiet"]) == 2
    assert "no latent cache" in capsys.readouterr().err


def test_distributed_two_cpu_processes(tmp_path, cache):
    cache_dir, _ = cache
    out = tmp_path / "ddp"
    # accelerate's --cpu flag starts one process unless MPI is set up; --multi_gpu starts them
    # with torchrun, and ACCELERATE_USE_CPU keeps them on CPU with gloo (also on GPU machines)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", os.path.join(ROOT, "scripts", "train_pila.py"),
           "--cache-dir", cache_dir, "--output-dir", str(out), "--stage", "3", "--max-steps", "2", "--batch-size", "1",
           "--num-frames", "9", "--height", "48", "--width", "48", "--log-every", "1", "--quiet",
           "--set", "adapter={hidden_dim: 32, slot_dim: 8, expert_hidden: 32}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    ckpt = out / "checkpoints" / "checkpoint-2"  # two steps ran (--quiet prints nothing but errors)
    assert (ckpt / "random_states_0.pkl").is_file() and (ckpt / "random_states_1.pkl").is_file()  # two processes
    assert (out / "adapter" / "diffusion_pytorch_model.safetensors").is_file()


def test_physics_loss_acts_through_dv_and_is_zero_on_the_data():
    """The stage-3 physics term is measured on the corrected clean-latent estimate: its gradient
    reaches the correction, and a prediction that lands exactly on the data costs nothing."""
    from visionmoe.video.training.losses import physics_loss, trajectory_residual

    g = torch.Generator().manual_seed(0)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    def blob(ys):  # [1, 1, F, H, W]
        return torch.stack([torch.exp(-((yy - y) ** 2 + (xx - 8) ** 2) / 6.0) for y in ys])[None, None]

    amp = torch.randn(2, 16, 1, 1, 1, generator=g)
    x0 = blob([3.0 + 0.5 * t * t for t in range(5)]) * amp  # a blob under constant acceleration
    jerky = blob([3.0, 5.0, 5.0, 8.5, 11.0]) * amp  # the same blob on a jerky path
    eps = torch.randn(x0.shape, generator=g)
    sigma = torch.tensor([0.5, 0.8])
    s = sigma.view(-1, 1, 1, 1, 1)
    x_t = (1 - s) * x0 + s * eps
    exact = eps - x0  # x_t - sigma * exact == x0
    loss, _, r_data = physics_loss(x_t, exact, exact, x0, sigma)
    assert float(loss) == pytest.approx(0.0, abs=1e-6) and float(r_data) > 0
    dv = torch.zeros_like(x0, requires_grad=True)
    noisy = (x_t - jerky) / s  # lands on the jerky path
    loss, base, _ = physics_loss(x_t, noisy + dv, noisy, x0, sigma)
    assert float(loss.detach()) > 0 and float(base) > 0
    loss.backward()
    assert dv.grad is not None and dv.grad.abs().sum() > 0
    assert trajectory_residual(x0).shape == (2,)


def _two_clips_small_adapter_and_empty_prompt(cache_dir, pipe):
    """A batch of two cached clips, a small untrained adapter for it, and the empty prompt's embedding."""
    from visionmoe.video.data.cache import LatentCache, collate
    from visionmoe.video.training.backbone import empty_prompt_embedding

    ds = LatentCache(cache_dir)
    batch = collate([ds[0], ds[1]], 32)
    adapter = PILAAdapter(latent_channels=16, text_dim=int(batch["text"].shape[-1]), hidden_dim=16, slot_dim=4,
                          expert_hidden=16)
    return batch, adapter, empty_prompt_embedding(pipe, 32)


def test_flow_guidance_trains_on_the_guided_velocity(cache, pipe):
    """With flow_guidance = g the flow loss is that of v_u + g (v_c - v_u) + s dv, the velocity the
    hook changes in a guided pipeline; the adapter still reads the conditional velocity."""
    from visionmoe.video.training.losses import stage_losses

    cache_dir, _ = cache
    batch, adapter, uncond = _two_clips_small_adapter_and_empty_prompt(cache_dir, pipe)
    seen = []

    def fn(x_t, v, sigma, **kw):
        seen.append(v.clone())
        return adapter(x_t, v, sigma, **kw)

    losses = {}
    for g_ in (1.0, 3.0):
        cfg = TrainConfig(stage=3, output_dir="unused", cache_dir=cache_dir, flow_guidance=g_, w_physics=0.0, **SMALL)
        losses[g_] = stage_losses(fn, adapter, pipe, batch, cfg, torch.Generator().manual_seed(3), torch.device("cpu"),
                                  uncond)
    assert torch.equal(seen[0], seen[1])  # the adapter reads the conditional velocity either way
    assert not torch.isclose(losses[1.0]["flow_base"], losses[3.0]["flow_base"])
    # the guided base loss is the one of v_u + 3 (v_c - v_u) (dv = 0: untrained)
    assert torch.isclose(losses[3.0]["flow"], losses[3.0]["flow_base"])
    with pytest.raises(ValueError, match="flow_guidance"):
        TrainConfig(stage=3, output_dir="unused", cache_dir=cache_dir, flow_guidance=-1.0)


def test_plain_adapter_trains_in_stage_3(tmp_path, cache, pipe):
    """Ablation (a): the plain adapter (no fields) trains with the flow-matching loss alone."""
    cache_dir, _ = cache
    cfg = TrainConfig(stage=3, output_dir=str(tmp_path / "plain"), cache_dir=cache_dir, max_steps=2, checkpoint_every=2,
                      **{**SMALL, "adapter": {"structure": "plain", "hidden_dim": 16, "plain_blocks": 1}})
    res = train(cfg, pipe=pipe)
    assert res.steps == 2 and all(torch.isfinite(torch.tensor(h["flow"])) for h in res.history)


def test_each_branch_trains_on_each_branch_and_records_it(tmp_path, cache, pipe):
    """apply_to='each_branch': the conditional velocity (never the guided one), the empty prompt
    and no category prior for the dropped samples, and the adapter's config says so."""
    from visionmoe.video.training.losses import stage_losses

    cache_dir, _ = cache
    batch, adapter, uncond = _two_clips_small_adapter_and_empty_prompt(cache_dir, pipe)
    seen = []

    def fn(x_t, v, sigma, **kw):
        seen.append((kw["encoder_hidden_states"].clone(), kw["category_mask"].clone()))
        return adapter(x_t, v, sigma, **kw)

    kw = dict(stage=3, output_dir="unused", cache_dir=cache_dir, w_physics=0.0, apply_to="each_branch", **SMALL)
    out = stage_losses(fn, adapter, pipe, batch, TrainConfig(uncond_prob=1.0, **kw), torch.Generator().manual_seed(3),
                       torch.device("cpu"), uncond)
    text, mask = seen[-1]
    assert torch.equal(text, uncond.expand(2, -1, -1)) and bool(mask.all())
    kept = stage_losses(fn, adapter, pipe, batch, TrainConfig(uncond_prob=0.0, **kw), torch.Generator().manual_seed(3),
                        torch.device("cpu"), uncond)
    assert torch.equal(seen[-1][0], batch["text"])
    assert not torch.isclose(out["flow_base"], kept["flow_base"])  # the empty prompt's velocity, not the guided one
    with pytest.raises(ValueError, match="flow_guidance must be 1"):
        TrainConfig(**{**kw, "flow_guidance": 3.0})
    with pytest.raises(ValueError, match="apply_to"):
        TrainConfig(**{**kw, "apply_to": "somewhere"})
    with pytest.raises(ValueError, match="uncond_prob"):
        TrainConfig(**{**kw, "uncond_prob": 1.5})
    res = train(TrainConfig(**{**kw, "output_dir": str(tmp_path / "eb"), "max_steps": 2, "checkpoint_every": 2,
                               "rollout_steps": 1}), pipe=pipe)
    assert PILAAdapter.from_pretrained(res.adapter_dir).config.apply_to == "each_branch"
    assert all(torch.isfinite(torch.tensor(h["flow"])) for h in res.history)


def test_law_term_acts_on_the_corrected_estimate_and_reaches_the_decoder(cache, pipe):
    """w_law > 0: each labelled category's laws on x_t - sigma (v + s dv), non-zero on the
    base's estimate, with a gradient that reaches the adapter's (zero-initialised) decoder."""
    from visionmoe.video.training.losses import stage_losses

    cache_dir, _ = cache
    batch, adapter, uncond = _two_clips_small_adapter_and_empty_prompt(cache_dir, pipe)
    kw = dict(stage=3, output_dir="unused", cache_dir=cache_dir, w_physics=0.0, **SMALL)
    off = stage_losses(adapter, adapter, pipe, batch, TrainConfig(**kw), torch.Generator().manual_seed(3),
                       torch.device("cpu"), uncond)
    assert "law" not in off
    on = stage_losses(adapter, adapter, pipe, batch, TrainConfig(w_law=1.0, **kw), torch.Generator().manual_seed(3),
                      torch.device("cpu"), uncond)
    assert float(on["law"].detach()) > 0
    assert torch.isclose(on["total"], off["total"] + on["law"])
    on["law"].backward()
    assert adapter.decoder.weight.grad is not None and float(adapter.decoder.weight.grad.abs().sum()) > 0
    with pytest.raises(ValueError, match="law_tolerance"):
        TrainConfig(stage=3, output_dir="unused", cache_dir=cache_dir, law_tolerance=-1.0)


def test_law_shift_holds_each_label_to_another_categorys_laws(cache):
    """law_shift (the wrong-law control) weights each labelled category's column of the law
    residuals law_shift places on: rigid -> gas, liquid -> optics at 3; 0 is the category's own."""
    from visionmoe.video.pila.law_residuals import category_law_residuals
    from visionmoe.video.pila.taxonomy import CATEGORY_NAMES
    from visionmoe.video.training.losses import law_loss

    g = torch.Generator().manual_seed(0)
    x_t, pred = torch.randn(2, 16, 5, 6, 6, generator=g), torch.randn(2, 16, 5, 6, 6, generator=g)
    sigma = torch.tensor([0.3, 0.7])
    k = {name: i for i, name in enumerate(CATEGORY_NAMES)}
    labels = torch.zeros(2, len(CATEGORY_NAMES))
    labels[0, k["rigid"]] = labels[1, k["liquid"]] = 1.0
    per = category_law_residuals(x_t - sigma.view(-1, 1, 1, 1, 1) * pred).per_category()
    own, wrong = law_loss(x_t, pred, sigma, labels), law_loss(x_t, pred, sigma, labels, shift=3)
    assert torch.isclose(own, (per[0, k["rigid"]] + per[1, k["liquid"]]) / 2)
    assert torch.isclose(wrong, (per[0, k["gas"]] + per[1, k["optics"]]) / 2)
    assert not torch.isclose(own, wrong)
    with pytest.raises(ValueError, match="law_shift"):
        TrainConfig(stage=3, output_dir="unused", cache_dir=cache[0], law_shift=-1)
