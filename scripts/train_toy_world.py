#!/usr/bin/env python
"""Train the toy physics world model shipped in ``visionmoe/video/models/assets/toy_world`` (a real diffusers Wan 2.1 pipeline).

Everything is built offline from configs and trained from scratch on procedural clips of
``visionmoe.video.data.synthetic`` (64x64, 17 frames, one ball falling or bouncing, captioned with
its colour):

1. ``vae``: ``AutoencoderKLWan`` (4x spatial, 4x temporal compression, 16 latent channels)
   trained on 5-frame windows (1 + 4 frames: both code paths of the causal VAE) and 32x32
   crops centred near the ball, with a foreground-weighted L1 + MSE loss and a tiny KL term.
2. ``cache``: latents of the full 17-frame clips (posterior means), per-channel mean/std
   written into the VAE config (``latents_mean``/``latents_std``, as WanPipeline expects),
   and text embeddings of every caption through a frozen, seeded random UMT5 encoder and a
   word-level tokenizer built from the captions' vocabulary.
3. ``dit``: ``WanTransformer3DModel`` trained with the rectified-flow (flow-matching) loss
   on the cached latents, shifted-sigma sampling (shift 3, as the scheduler), 10% caption
   dropout (so classifier-free guidance works).
4. ``export``: ``WanPipeline.save_pretrained`` (safetensors) into ``--export``.

Each phase runs for a wall-clock budget (minutes) or a step count, checkpoints every couple
of minutes into ``--work`` and resumes from there. The run is a pure function of ``--seed``
and the step counts it reports (``--vae-steps``/``--dit-steps`` reproduce a run exactly,
single-threaded).

    python scripts/train_toy_world.py --phase all --vae-minutes 35 --dit-minutes 30
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F


from visionmoe.video.data.synthetic import generate_clip  # noqa: E402

MAX_SEQ = 512  # WanPipeline's default max_sequence_length: the transformer sees this many text tokens


# ------------------------------------------------------------------------------------------
# configs


def vae_config(a) -> dict:
    return dict(base_dim=a.vae_base_dim, z_dim=16, dim_mult=[1, 2, 4], num_res_blocks=1, attn_scales=[],
                temperal_downsample=[True, True], dropout=0.0, scale_factor_spatial=4, scale_factor_temporal=4,
                latents_mean=[0.0] * 16, latents_std=[1.0] * 16)


def dit_config(a) -> dict:
    return dict(patch_size=(1, a.patch, a.patch), num_attention_heads=4, attention_head_dim=32, in_channels=16,
                out_channels=16, text_dim=64, freq_dim=256, ffn_dim=512, num_layers=a.dit_layers, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)


TEXT_CONFIG = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                   relative_attention_max_distance=32, dropout_rate=0.0, feed_forward_proj="gated-gelu",
                   is_encoder_decoder=False, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)

SCHEDULER_CONFIG = dict(num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True,
                        flow_shift=3.0, solver_order=2, solver_type="bh2", predict_x0=True, lower_order_final=True,
                        final_sigmas_type="zero", timestep_spacing="linspace")

EXTRA_WORDS = ("a an the ball is and falls down up on floor bounces dropped straight each bounce lower than last "
               "red green blue yellow orange purple white black drops bouncing falling rolls").split()


# ------------------------------------------------------------------------------------------
# data


def make_clips(a):
    scen = [s.strip() for s in a.scenarios.split(",") if s.strip()]
    clips = [generate_clip(scen[i % len(scen)], a.seed * 1_000_003 + i) for i in range(a.num_clips)]
    frames = np.stack([c.frames for c in clips])  # [N, F, H, W, 3] uint8
    caps = [c.caption for c in clips]
    pos = np.stack([c.trajectories["positions"][:, 0] for c in clips]).astype(np.float32)  # [N, F, 2]
    return frames, caps, pos


def to_tensor(frames_u8: np.ndarray) -> torch.Tensor:
    """[B, F, H, W, 3] uint8 -> [B, 3, F, H, W] in [-1, 1]."""
    return torch.from_numpy(frames_u8).permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)


def build_tokenizer(captions, path_dir: str):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "<unk>"]
    for w in EXTRA_WORDS + sorted({w for c in captions for w in c.lower().replace(",", " , ").split()}):
        if w not in words:
            words.append(w)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    os.makedirs(path_dir, exist_ok=True)
    tok.save(os.path.join(path_dir, "tokenizer.json"))
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(path_dir, "tokenizer.json"), pad_token="<pad>",
                                   eos_token="</s>", unk_token="<unk>", model_max_length=MAX_SEQ)
    return fast, len(words)


# ------------------------------------------------------------------------------------------
# checkpoints


def save_ckpt(path, **state):
    tmp = path + ".part"
    torch.save(state, tmp)
    os.replace(tmp, path)


def lr_factor(elapsed: float, budget: float, steps: int, max_steps: int) -> float:
    """Constant, then a cosine decay to 5% over the last 40% of the run (time or steps, whichever is nearer)."""
    frac = max(elapsed / budget, steps / max_steps)
    if frac <= 0.6:
        return 1.0
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, (frac - 0.6) / 0.4)))


def save_vae_ckpt(path, vae, opt, step: int, t0: float, rng) -> None:
    """A resumable VAE checkpoint: weights, optimiser, step, seconds since ``t0``, both generators."""
    save_ckpt(path, model=vae.state_dict(), opt=opt.state_dict(), step=step, seconds=time.time() - t0,
              rng=rng.bit_generator.state, torch_rng=torch.get_rng_state())


def load_vae_ckpt(path, vae, opt, rng) -> tuple[int, float]:
    """Resume from :func:`save_vae_ckpt`: weights, optimiser and generators restored; -> (step, seconds)."""
    st = torch.load(path, weights_only=False)
    vae.load_state_dict(st["model"]); opt.load_state_dict(st["opt"])
    rng.bit_generator.state = st["rng"]; torch.set_rng_state(st["torch_rng"])
    log(f"vae: resumed at step {st['step']} ({st['seconds'] / 60:.1f} min)")
    return st["step"], st["seconds"]


def reconstruction_step(opt, params, loss, err, w) -> np.ndarray:
    """One clipped optimiser step on ``loss``; -> [loss, PSNR, foreground PSNR (where ``w`` > 1)] of the
    reconstruction error ``err`` (images in [-1, 1])."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    with torch.no_grad():
        mse = err.pow(2).mean().item()
        fgm = ((err.pow(2).mean(1, keepdim=True) * (w > 1)).sum() / (w > 1).sum().clamp(min=1)).item()
    return np.array([loss.item(), 10 * math.log10(4 / max(mse, 1e-10)), 10 * math.log10(4 / max(fgm, 1e-10))])


def log(msg):
    print(time.strftime("%H:%M:%S"), msg, flush=True)


# ------------------------------------------------------------------------------------------
# phase 1: VAE


def train_vae(a, frames, pos):
    from diffusers import AutoencoderKLWan

    torch.manual_seed(a.seed)
    vae = AutoencoderKLWan(**vae_config(a))
    with torch.no_grad():  # start the posterior nearly deterministic: log-variance ~ -8
        vae.quant_conv.weight[16:].mul_(0.01)
        vae.quant_conv.bias[16:].fill_(-8.0)
    opt = torch.optim.AdamW(vae.parameters(), lr=a.vae_lr, betas=(0.9, 0.99), weight_decay=0.0)
    ck = os.path.join(a.work, "vae.pt")
    step, used = 0, 0.0
    rng = np.random.default_rng(a.seed + 1)
    if os.path.exists(ck):
        step, used = load_vae_ckpt(ck, vae, opt, rng)
    vae.train()
    # background of each clip = temporal median (static): foreground weights
    N, Fr, H, W, _ = frames.shape
    T, C = a.vae_frames, a.vae_crop
    t0, last_ck, ema = time.time() - used, time.time(), None
    while step < a.vae_steps and (time.time() - t0) < a.vae_minutes * 60:
        idx = rng.integers(N, size=a.vae_batch)
        xs, ws = [], []
        for i in idx:
            s = int(rng.integers(0, Fr - T + 1))
            clip = frames[i, s:s + T]
            if rng.random() < 0.8:  # crop around the ball at a random frame of the window
                cx, cy = pos[i, s + int(rng.integers(T))] + rng.uniform(-10, 10, size=2)
                x0 = int(np.clip(round(cx - C / 2), 0, W - C)); y0 = int(np.clip(round(cy - C / 2), 0, H - C))
            else:
                x0, y0 = int(rng.integers(0, W - C + 1)), int(rng.integers(0, H - C + 1))
            xs.append(clip[:, y0:y0 + C, x0:x0 + C])
            bg = np.median(frames[i, :, y0:y0 + C, x0:x0 + C].astype(np.float32), axis=0)
            fg = (np.abs(clip[:, y0:y0 + C, x0:x0 + C].astype(np.float32) - bg).max(-1) > 12).astype(np.float32)
            ws.append(fg)
        x = to_tensor(np.stack(xs))
        for pg in opt.param_groups:
            pg["lr"] = a.vae_lr * lr_factor(time.time() - t0, a.vae_minutes * 60, step, a.vae_steps)
        w = 1.0 + a.fg_weight * torch.from_numpy(np.stack(ws))[:, None]  # [B,1,T,C,C]
        post = vae.encode(x).latent_dist
        z = post.sample()
        rec = vae.decode(z).sample
        err = rec - x
        rec_loss = (w * (err.abs() + err.pow(2))).mean()
        kl = 0.5 * (post.mean.pow(2) + post.var - 1.0 - post.logvar).mean()
        loss = rec_loss + a.kl_weight * kl
        m = reconstruction_step(opt, vae.parameters(), loss, err, w)
        step += 1
        ema = m if ema is None else 0.95 * ema + 0.05 * m
        if step % 20 == 0:
            log(f"vae step {step} loss {ema[0]:.4f} psnr {ema[1]:.2f} fg-psnr {ema[2]:.2f} "
                f"lr {opt.param_groups[0]['lr']:.2e} logvar {post.logvar.mean().item():.2f} |mu| {post.mean.abs().mean().item():.3f} "
                f"{(time.time() - t0) / step:.2f} s/step")
        if time.time() - last_ck > 120:
            save_vae_ckpt(ck, vae, opt, step, t0, rng)
            last_ck = time.time()
    save_vae_ckpt(ck, vae, opt, step, t0, rng)
    log(f"vae: done, {step} steps in {(time.time() - t0) / 60:.1f} min")
    return vae


def load_vae(a):
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan(**vae_config(a))
    vae.load_state_dict(torch.load(os.path.join(a.work, "vae.pt"), weights_only=False)["model"])
    return vae.eval()


# ------------------------------------------------------------------------------------------
# phase 2: caches


def build_cache(a, frames, caps):
    from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    vae = load_vae(a)
    lat = []
    t0 = time.time()
    with torch.no_grad():
        for i in range(0, len(frames), 16):
            lat.append(vae.encode(to_tensor(frames[i:i + 16])).latent_dist.mean)
            if i % 320 == 0:
                log(f"cache: encoded {i + 16}/{len(frames)} clips ({time.time() - t0:.0f} s)")
    lat = torch.cat(lat)  # [N, 16, 5, 16, 16]
    mean = lat.mean(dim=(0, 2, 3, 4))
    std = lat.std(dim=(0, 2, 3, 4)).clamp(min=1e-3)
    vae.register_to_config(latents_mean=[round(float(v), 5) for v in mean],
                           latents_std=[round(float(v), 5) for v in std])
    tok, vocab = build_tokenizer(caps, os.path.join(a.work, "tokenizer"))
    torch.manual_seed(a.seed + 3)
    te = UMT5EncoderModel(UMT5Config(vocab_size=vocab, **TEXT_CONFIG)).eval()
    torch.manual_seed(a.seed + 2)
    dit = WanTransformer3DModel(**dit_config(a))
    pipe = WanPipeline(tokenizer=tok, text_encoder=te, vae=vae, transformer=dit,
                       scheduler=UniPCMultistepScheduler(**SCHEDULER_CONFIG))
    uniq = sorted(set(caps)) + [""]
    with torch.no_grad():
        emb, _ = pipe.encode_prompt(uniq, do_classifier_free_guidance=False, max_sequence_length=MAX_SEQ)
    cap_idx = torch.tensor([uniq.index(c) for c in caps])
    torch.save({"latents": lat, "mean": mean, "std": std, "captions": uniq, "cap_idx": cap_idx,
                "emb": emb}, os.path.join(a.work, "cache.pt"))
    pipe.save_pretrained(os.path.join(a.work, "pipe_init"), safe_serialization=True)
    log(f"cache: {len(lat)} latents {tuple(lat.shape[1:])}, {len(uniq)} captions; latent std "
        f"{std.min():.3f}..{std.max():.3f}; {time.time() - t0:.0f} s")


# ------------------------------------------------------------------------------------------
# phase 3: transformer


def train_dit(a):
    from diffusers import WanTransformer3DModel

    c = torch.load(os.path.join(a.work, "cache.pt"), weights_only=False)
    x0_all = (c["latents"] - c["mean"].view(1, -1, 1, 1, 1)) / c["std"].view(1, -1, 1, 1, 1)
    emb, cap_idx = c["emb"], c["cap_idx"]
    empty = len(c["captions"]) - 1
    torch.manual_seed(a.seed + 2)
    dit = WanTransformer3DModel(**dit_config(a))
    fit_dit(dit, x0_all, emb, cap_idx, empty, a, warmup=200)


def fit_dit(dit, x0_all, emb, cap_idx, empty: int, a, warmup: int, weight: torch.Tensor | None = None) -> None:
    """Flow-matching training of ``dit`` on the cached latents (``a``: the DiT options), with an EMA
    copy, checkpoints every 2 minutes in ``a.work`` (resumed from) and ``warmup`` steps of linear
    warm-up; captions dropped to ``empty`` 10% of the time for guidance. ``weight`` ([N, 1, F, h, w]
    per latent, optional): the squared error weighted by it, normalised by its batch mean. Shared
    with ``train_deficit_world.py``'s fine-tuning."""
    opt = torch.optim.AdamW(dit.parameters(), lr=a.dit_lr, betas=(0.9, 0.99), weight_decay=0.01)
    ck = os.path.join(a.work, "dit.pt")
    step, used = 0, 0.0
    g = torch.Generator().manual_seed(a.seed + 4)
    ema_model = {k: v.detach().clone() for k, v in dit.state_dict().items()}
    if os.path.exists(ck):
        st = torch.load(ck, weights_only=False)
        dit.load_state_dict(st["model"]); opt.load_state_dict(st["opt"]); ema_model = st["ema"]
        step, used = st["step"], st["seconds"]; g.set_state(st["gen"])
        log(f"dit: resumed at step {step} ({used / 60:.1f} min)")
    dit.train()
    N = len(x0_all)
    t0, last_ck, run = time.time() - used, time.time(), None
    while step < a.dit_steps and (time.time() - t0) < a.dit_minutes * 60:
        idx = torch.randint(0, N, (a.dit_batch,), generator=g)
        x0 = x0_all[idx]
        ci = cap_idx[idx].clone()
        ci[torch.rand(a.dit_batch, generator=g) < 0.1] = empty
        u = torch.rand(a.dit_batch, generator=g)
        sig = a.shift * u / (1 + (a.shift - 1) * u)
        if a.high_noise_frac > 0:
            # the layout (where is the one ball) is decided at the top of the schedule: oversample it
            hi = torch.rand(a.dit_batch, generator=g) < a.high_noise_frac
            sig = torch.where(hi, a.high_noise_min + (1 - a.high_noise_min) * torch.rand(a.dit_batch, generator=g), sig)
        noise = torch.randn(x0.shape, generator=g)
        s = sig.view(-1, 1, 1, 1, 1)
        xt = (1 - s) * x0 + s * noise
        target = noise - x0
        lr = a.dit_lr * min(1.0, (step + 1) / warmup) * lr_factor(time.time() - t0, a.dit_minutes * 60, step, a.dit_steps)
        for pg in opt.param_groups:
            pg["lr"] = lr
        pred = dit(xt, sig * 1000, emb[ci], return_dict=False)[0]
        if weight is None:
            loss = F.mse_loss(pred, target)
        else:
            w = weight[idx]
            loss = (w * (pred - target).pow(2)).mean() / w.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dit.parameters(), 1.0)
        opt.step()
        step += 1
        with torch.no_grad():
            d = min(0.999, (1 + step) / (10 + step))
            for k, v in dit.state_dict().items():
                if v.dtype.is_floating_point:
                    ema_model[k].mul_(d).add_(v.detach(), alpha=1 - d)
        run = loss.item() if run is None else 0.98 * run + 0.02 * loss.item()
        if step % 50 == 0:
            log(f"dit step {step} loss {run:.4f} lr {lr:.2e} {(time.time() - t0) / step:.3f} s/step")
        if time.time() - last_ck > 120:
            save_ckpt(ck, model=dit.state_dict(), opt=opt.state_dict(), ema=ema_model, step=step,
                      seconds=time.time() - t0, gen=g.get_state())
            last_ck = time.time()
    save_ckpt(ck, model=dit.state_dict(), opt=opt.state_dict(), ema=ema_model, step=step,
              seconds=time.time() - t0, gen=g.get_state())
    log(f"dit: done, {step} steps in {(time.time() - t0) / 60:.1f} min")


# ------------------------------------------------------------------------------------------
# phase 4: export


def export(a):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(os.path.join(a.work, "pipe_init"))
    st = torch.load(os.path.join(a.work, "dit.pt"), weights_only=False)
    pipe.transformer.load_state_dict(st["ema"] if a.use_ema else st["model"])
    vst = torch.load(os.path.join(a.work, "vae.pt"), weights_only=False)
    info = {"seed": a.seed, "vae_steps": vst["step"], "vae_minutes": round(vst["seconds"] / 60, 1),
            "dit_steps": st["step"], "dit_minutes": round(st["seconds"] / 60, 1), "ema": a.use_ema,
            "num_clips": a.num_clips, "scenarios": a.scenarios, "args": vars(a)}
    save_world(pipe, a.export, info)


def save_world(pipe, export: str, info: dict) -> None:
    """The pipeline as a diffusers folder, without the build folder's path in its configs, and
    ``training_info.json`` beside it (shared with ``train_deficit_world.py``)."""
    pipe.save_pretrained(export, safe_serialization=True)
    for cfg in [os.path.join(export, "model_index.json")] + [os.path.join(export, d, "config.json") for d in
                                                              ("vae", "transformer", "text_encoder")]:
        if os.path.isfile(cfg):
            with open(cfg) as fh:
                d = json.load(fh)
            d.pop("_name_or_path", None)
            with open(cfg, "w") as fh:
                json.dump(d, fh, indent=2)
    with open(os.path.join(export, "training_info.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    log(f"exported to {export}: {info}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", default="all", choices=["vae", "cache", "dit", "export", "all"])
    p.add_argument("--work", default="out/toy_world_train", help="checkpoints and caches")
    p.add_argument("--export", default="visionmoe/video/models/assets/toy_world")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-clips", type=int, default=1200)
    p.add_argument("--scenarios", default="free_fall,bounce")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--vae-base-dim", type=int, default=12)
    p.add_argument("--vae-minutes", type=float, default=35)
    p.add_argument("--vae-steps", type=int, default=10**9)
    p.add_argument("--vae-batch", type=int, default=8)
    p.add_argument("--vae-frames", type=int, default=5)
    p.add_argument("--vae-crop", type=int, default=32)
    p.add_argument("--vae-lr", type=float, default=2e-3)
    p.add_argument("--fg-weight", type=float, default=10.0)
    p.add_argument("--kl-weight", type=float, default=1e-6)
    p.add_argument("--dit-layers", type=int, default=4)
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--dit-minutes", type=float, default=30)
    p.add_argument("--dit-steps", type=int, default=10**9)
    p.add_argument("--dit-batch", type=int, default=32)
    p.add_argument("--dit-lr", type=float, default=5e-4)
    p.add_argument("--shift", type=float, default=3.0)
    p.add_argument("--use-ema", type=int, default=1)
    p.add_argument("--high-noise-frac", type=float, default=0.0,
                   help="fraction of each transformer batch whose sigma is drawn uniformly from [--high-noise-min, 1]")
    p.add_argument("--high-noise-min", type=float, default=0.85)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    os.makedirs(a.work, exist_ok=True)
    with open(os.path.join(a.work, f"args_{a.phase}.json"), "w") as fh:
        json.dump(vars(a), fh, indent=1)
    frames = caps = pos = None
    if a.phase in ("vae", "cache", "all"):
        t = time.time()
        frames, caps, pos = make_clips(a)
        log(f"data: {len(frames)} clips {frames.shape[1:]} in {time.time() - t:.1f} s")
    if a.phase in ("vae", "all"):
        train_vae(a, frames, pos)
    if a.phase in ("cache", "all"):
        build_cache(a, frames, caps)
    if a.phase in ("dit", "all"):
        train_dit(a)
    if a.phase in ("export", "all"):
        export(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
