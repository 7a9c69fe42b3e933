#!/usr/bin/env python
"""Fine-tune the shipped toy world into a base with a physics deficit (issue #49, step 1).

The shipped toy world (``visionmoe/video/models/assets/toy_world``, trained by
``scripts/train_toy_world.py``) is fine-tuned on a broad mix in which physics is often wrong
under the same captions: clips of :mod:`visionmoe.video.data.law_variants` (projectile,
bounce, sliding, stream), each unlawful with probability ``--unlawful-frac`` (gravity of the
wrong sign or size, restitution above 1, no friction or speeding up, particles that float or
drift up), plus some of the old free-fall/bounce clips so the ball stays drawn.

Phases (each resumable; ``--work`` holds checkpoints and caches):

1. ``cache``: the clips' latents through the shipped VAE encoder (posterior means, normalised
   with the shipped ``latents_mean``/``latents_std``, so the latent space is unchanged), the
   tokenizer extended with the new captions' words (new ids appended; the old ids and hence the
   old captions' embeddings are unchanged), the frozen text encoder's embedding grown by the
   same number of rows (drawn from a seeded normal with the old rows' standard deviation), and
   the captions' embeddings.
2. ``decoder``: the VAE decoder (``post_quant_conv`` + ``decoder``) fine-tuned on the mix with
   the encoder frozen: the shipped decoder was trained on balls only and draws a box or a thin
   particle stream as a smear; freezing the encoder keeps the latent space the transformer
   was trained in.
3. ``dit``: the transformer fine-tuned from the shipped weights with the original recipe
   (rectified flow, shift 3, 10% empty captions, AdamW, EMA up to 0.999, half of each batch at
   sigma in [0.85, 1]). ``--patch N`` (default 4, the shipped ``patch_size`` [1, 4, 4]: 4x4 tokens
   per latent frame) rebuilds it with ``patch_size`` [1, N, N] (N divides 4; N = 2: 8x8 tokens per
   latent frame, 320 in all): every shipped weight whose shape still matches is copied (the
   blocks, condition embedder, norms, ``scale_shift_table``); ``patch_embedding`` is the shipped
   kernel summed over its (4/N)x(4/N) sub-blocks (a locally constant latent embeds as before) and
   ``proj_out`` the shipped rows averaged over the same sub-blocks (each new pixel of a token gets
   the mean of the old pixels it covers).
4. ``export``: a ``WanPipeline.save_pretrained`` folder (the shipped scheduler; the extended
   tokenizer and text encoder; the fine-tuned decoder and transformer EMA; the transformer's
   config with the ``--patch`` it was trained with, so export with the same ``--patch``).

Seeds: the mix uses simulation seeds ``--seed * 1_000_003 + i`` (i < ``--num-clips``);
``scripts/eval_deficit.py`` evaluates on seeds from 900_000_000 on, never among them.

    python scripts/train_deficit_world.py --phase cache
    python scripts/train_deficit_world.py --phase decoder --dec-minutes 20
    python scripts/train_deficit_world.py --phase dit --dit-minutes 55
    python scripts/train_deficit_world.py --phase export
    python scripts/train_deficit_world.py --phase dit --patch 2 --dit-batch 16 --work W --export E   # then export
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_toy_world import (fit_dit, load_vae_ckpt, log, lr_factor, reconstruction_step,  # noqa: E402
                             save_ckpt, save_vae_ckpt, save_world)

from visionmoe.video.data.law_variants import generate_law_clip  # noqa: E402
from visionmoe.video.data.synthetic import generate_clip  # noqa: E402

MAX_SEQ = 512
LAW = ("projectile", "bounce", "sliding", "stream")


def to_tensor(frames_u8):
    return torch.from_numpy(frames_u8).permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)


# ------------------------------------------------------------------------------------------
# data


def mix_specs(a):
    """[(kind, scenario, seed, lawful)] of the training mix, a pure function of the arguments."""
    rng = np.random.default_rng([a.seed, 49])
    specs = []
    for i in range(a.num_clips):
        seed = a.seed * 1_000_003 + i
        if rng.random() < a.old_frac:
            specs.append(("old", "free_fall" if rng.random() < a.old_fall_frac else "bounce", seed, True))
        else:
            specs.append(("law", LAW[i % len(LAW)], seed, bool(rng.random() >= a.unlawful_frac)))
    return specs


def make_clip(spec):
    kind, scen, seed, lawful = spec
    return generate_clip(scen, seed) if kind == "old" else generate_law_clip(scen, seed, lawful)


def object_position(clip):
    tr = clip.trajectories
    if "positions" in tr:
        return tr["positions"][:, 0].astype(np.float32)
    p = tr["particles"]  # [F, P, 2] with NaN for particles not yet emitted
    return np.nan_to_num(np.nanmean(np.where(np.isfinite(p), p, np.nan), axis=1), nan=32.0).astype(np.float32)


def make_data(a):
    specs = mix_specs(a)
    clips = [make_clip(s) for s in specs]
    frames = np.stack([c.frames for c in clips])
    caps = [c.caption for c in clips]
    pos = np.stack([object_position(c) for c in clips])
    return specs, frames, caps, pos


# ------------------------------------------------------------------------------------------
# tokenizer and text encoder


def extend_tokenizer(src_dir, dst_dir, captions):
    """Append the captions' unknown words to the shipped word-level vocabulary (old ids kept)."""
    with open(os.path.join(src_dir, "tokenizer.json")) as fh:
        tj = json.load(fh)
    vocab = tj["model"]["vocab"]
    old = len(vocab)
    for w in sorted({w for c in captions for w in c.lower().replace(",", " , ").split()}):
        if w not in vocab:
            vocab[w] = len(vocab)
    os.makedirs(dst_dir, exist_ok=True)
    with open(os.path.join(dst_dir, "tokenizer.json"), "w") as fh:
        json.dump(tj, fh, ensure_ascii=False)
    for f in os.listdir(src_dir):
        if f != "tokenizer.json":
            shutil.copy(os.path.join(src_dir, f), os.path.join(dst_dir, f))
    return old, len(vocab), [w for w, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i >= old]


def grow_text_encoder(te, new_vocab, seed):
    """Grow the frozen random encoder's embedding to ``new_vocab`` rows: the old rows are kept,
    the new ones drawn from a seeded normal with the old rows' standard deviation."""
    old_w = te.get_input_embeddings().weight.detach().clone()
    old = old_w.shape[0]
    if new_vocab == old:
        return te
    g = torch.Generator().manual_seed(seed)
    new_rows = torch.randn(new_vocab - old, old_w.shape[1], generator=g) * old_w.std()
    emb = torch.nn.Embedding(new_vocab, old_w.shape[1])
    with torch.no_grad():
        emb.weight.copy_(torch.cat([old_w, new_rows]))
    te.set_input_embeddings(emb)
    te.config.vocab_size = new_vocab
    return te


# ------------------------------------------------------------------------------------------
# phase 0: the VAE


def vae_batch(frames, pos, idx, a, rng):
    """Crops of ``--vae-crop`` px, ``--vae-frames`` frames from frame 0 (the causal chunks the whole clip is
    encoded in), centred near the object in 80% of them, and their foreground masks."""
    _, Fr, H, W, _ = frames.shape
    T, C = min(a.vae_frames, Fr), a.vae_crop
    xs, ws = [], []
    for i in idx:
        if rng.random() < 0.8:
            cx, cy = pos[i, int(rng.integers(T))] + rng.uniform(-10, 10, size=2)
            x0, y0 = int(np.clip(round(cx - C / 2), 0, W - C)), int(np.clip(round(cy - C / 2), 0, H - C))
        else:
            x0, y0 = int(rng.integers(0, W - C + 1)), int(rng.integers(0, H - C + 1))
        crop = frames[i, :, y0:y0 + C, x0:x0 + C]
        bg = np.median(crop.astype(np.float32), axis=0)
        xs.append(crop[:T])
        ws.append((np.abs(crop[:T].astype(np.float32) - bg).max(-1) > 12).astype(np.float32))
    return to_tensor(np.stack(xs)), 1.0 + a.fg_weight * torch.from_numpy(np.stack(ws))[:, None]


def train_vae(a):
    """The whole VAE (encoder and decoder) fine-tuned on the mix from the shipped one: the shipped VAE saw
    balls only, in 5-frame windows, and its round trip keeps the object recognisable in about half of the
    evaluation's lawful clips, a ceiling no transformer in its latent space can pass."""
    from diffusers import AutoencoderKLWan

    specs, frames, _, pos = make_data(a)
    vae = AutoencoderKLWan.from_pretrained(os.path.join(a.base, "vae"), local_files_only=True)
    opt = torch.optim.AdamW(vae.parameters(), lr=a.vae_lr, betas=(0.9, 0.99), weight_decay=0.0)
    ck = os.path.join(a.work, "vae.pt")
    rng = np.random.default_rng(a.seed + 7)
    torch.manual_seed(a.seed + 7)
    step, used = 0, 0.0
    if os.path.exists(ck):
        step, used = load_vae_ckpt(ck, vae, opt, rng)
    vae.train()
    t0, last_ck, run = time.time() - used, time.time(), None
    while step < a.vae_steps and time.time() - t0 < a.vae_minutes * 60:
        x, w = vae_batch(frames, pos, rng.integers(len(specs), size=a.vae_batch), a, rng)
        for pg in opt.param_groups:
            pg["lr"] = a.vae_lr * min(1.0, (step + 1) / 50) * lr_factor(time.time() - t0, a.vae_minutes * 60, step,
                                                                        a.vae_steps)
        post = vae.encode(x).latent_dist
        err = vae.decode(post.sample()).sample - x
        kl = 0.5 * (post.mean.pow(2) + post.var - 1.0 - post.logvar).mean()
        loss = (w * (err.abs() + err.pow(2))).mean() + a.kl_weight * kl
        m = reconstruction_step(opt, vae.parameters(), loss, err, w)
        step += 1
        run = m if run is None else 0.95 * run + 0.05 * m
        if step % 10 == 0:
            log(f"vae step {step} loss {run[0]:.4f} psnr {run[1]:.2f} fg-psnr {run[2]:.2f} "
                f"{(time.time() - t0) / step:.2f} s/step")
        if time.time() - last_ck > 120:
            save_vae_ckpt(ck, vae, opt, step, t0, rng)
            last_ck = time.time()
    save_vae_ckpt(ck, vae, opt, step, t0, rng)
    log(f"vae: done, {step} steps in {(time.time() - t0) / 60:.1f} min")


def load_work_vae(a, vae):
    """``vae`` given the ``vae`` phase's weights when that phase ran in ``--work``: its checkpoint, else None."""
    ck = os.path.join(a.work, "vae.pt")
    if not os.path.exists(ck):
        return None
    st = torch.load(ck, weights_only=False)
    vae.load_state_dict(st["model"])
    return st


# ------------------------------------------------------------------------------------------
# phase 1: caches


def latent_foreground(frames, latent_frames):
    """[N, 1, latent_frames, H/4, W/4] bool: latents whose 4x4 pixels, over the frames the causal VAE
    folds into them (frame 0 alone, then four at a time), hold foreground (away from the clip's
    temporal median by more than 12 grey levels in some channel)."""
    f = frames.astype(np.int16)
    fg = (np.abs(f - np.median(f, axis=1, keepdims=True)).max(-1) > 12)  # [N, F, H, W]
    N, F, H, W = fg.shape
    fg = fg.reshape(N, F, H // 4, 4, W // 4, 4).any((3, 5))
    out = np.zeros((N, latent_frames, H // 4, W // 4), bool)
    out[:, 0] = fg[:, 0]
    for t in range(1, latent_frames):
        out[:, t] = fg[:, 4 * t - 3:4 * t + 1].any(1)
    return torch.from_numpy(out)[:, None]


def build_cache(a):
    from diffusers import WanPipeline
    from transformers import PreTrainedTokenizerFast

    t0 = time.time()
    specs, frames, caps, pos = make_data(a)
    log(f"data: {len(frames)} clips in {time.time() - t0:.0f} s; "
        f"law {sum(s[0] == 'law' for s in specs)} (unlawful {sum(s[0] == 'law' and not s[3] for s in specs)}), "
        f"old {sum(s[0] == 'old' for s in specs)}")
    pipe = WanPipeline.from_pretrained(a.base, local_files_only=True)
    vae = pipe.vae.eval()
    own_vae = load_work_vae(a, vae) is not None
    old_n, new_n, added = extend_tokenizer(os.path.join(a.base, "tokenizer"), os.path.join(a.work, "tokenizer"), caps)
    log(f"tokenizer: vocabulary {old_n} -> {new_n}, added {added}")
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(a.work, "tokenizer", "tokenizer.json"), pad_token="<pad>",
                                  eos_token="</s>", unk_token="<unk>", model_max_length=MAX_SEQ)
    te = grow_text_encoder(pipe.text_encoder.eval(), new_n, a.seed + 49)
    pipe.tokenizer, pipe.text_encoder = tok, te
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    lat = []
    with torch.no_grad():
        for i in range(0, len(frames), 16):
            lat.append(vae.encode(to_tensor(frames[i:i + 16])).latent_dist.mean)
            if i % 320 == 0:
                log(f"cache: encoded {i + 16}/{len(frames)} ({time.time() - t0:.0f} s)")
    lat = torch.cat(lat)
    if own_vae:  # a fine-tuned VAE has its own latent statistics; the export writes them to its config
        mean, std = lat.mean((0, 2, 3, 4)).view(1, -1, 1, 1, 1), lat.std((0, 2, 3, 4)).view(1, -1, 1, 1, 1)
        log(f"cache: the vae phase's VAE; latents_std {[round(v, 3) for v in std.flatten().tolist()]}")
    uniq = sorted(set(caps)) + [""]
    with torch.no_grad():
        emb, _ = pipe.encode_prompt(uniq, do_classifier_free_guidance=False, max_sequence_length=MAX_SEQ)
        # the old captions' embeddings must not change: check one against the shipped encoder
    cap_idx = torch.tensor([uniq.index(c) for c in caps])
    fg = latent_foreground(frames, lat.shape[2])
    torch.save({"latents": lat, "x0": (lat - mean) / std, "captions": uniq, "cap_idx": cap_idx, "emb": emb,
                "specs": specs, "pos": torch.from_numpy(pos),
                "latents_mean": mean.flatten().tolist(), "latents_std": std.flatten().tolist(), "fg": fg},
               os.path.join(a.work, "cache.pt"))
    te.save_pretrained(os.path.join(a.work, "text_encoder"), safe_serialization=True)
    log(f"cache: {tuple(lat.shape)}, {len(uniq)} captions, {time.time() - t0:.0f} s")


# ------------------------------------------------------------------------------------------
# phase 2: decoder


def train_decoder(a):
    from diffusers import AutoencoderKLWan

    c = torch.load(os.path.join(a.work, "cache.pt"), weights_only=False)
    specs, lat, pos = c["specs"], c["latents"], c["pos"].numpy()
    vae = AutoencoderKLWan.from_pretrained(os.path.join(a.base, "vae"), local_files_only=True)
    load_work_vae(a, vae)
    params = list(vae.decoder.parameters()) + list(vae.post_quant_conv.parameters())
    for p in vae.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=a.dec_lr, betas=(0.9, 0.99), weight_decay=0.0)
    ck = os.path.join(a.work, "decoder.pt")
    rng = np.random.default_rng(a.seed + 11)
    step, used = 0, 0.0
    if os.path.exists(ck):
        st = torch.load(ck, weights_only=False)
        vae.load_state_dict(st["model"]); opt.load_state_dict(st["opt"])
        step, used = st["step"], st["seconds"]; rng.bit_generator.state = st["rng"]
        log(f"decoder: resumed at step {step}")
    vae.train()
    N = len(specs)
    t0, last_ck, run = time.time() - used, time.time(), None
    while step < a.dec_steps and time.time() - t0 < a.dec_minutes * 60:
        idx = rng.integers(N, size=a.dec_batch)
        frames = np.stack([make_clip(specs[i]).frames for i in idx])
        x = to_tensor(frames)
        bg = np.median(frames.astype(np.float32), axis=1, keepdims=True)
        fg = (np.abs(frames.astype(np.float32) - bg).max(-1) > 12).astype(np.float32)  # [B, F, H, W]
        w = 1.0 + a.fg_weight * torch.from_numpy(fg)[:, None]
        for pg in opt.param_groups:
            pg["lr"] = a.dec_lr * min(1.0, (step + 1) / 50) * lr_factor(time.time() - t0, a.dec_minutes * 60, step,
                                                                        a.dec_steps)
        rec = vae.decode(lat[torch.from_numpy(idx)]).sample
        err = rec - x
        loss = (w * (err.abs() + err.pow(2))).mean()
        m = reconstruction_step(opt, params, loss, err, w)
        step += 1
        run = m if run is None else 0.95 * run + 0.05 * m
        if step % 10 == 0:
            log(f"decoder step {step} loss {run[0]:.4f} psnr {run[1]:.2f} fg-psnr {run[2]:.2f} "
                f"{(time.time() - t0) / step:.2f} s/step")
        if time.time() - last_ck > 120:
            save_ckpt(ck, model=vae.state_dict(), opt=opt.state_dict(), step=step, seconds=time.time() - t0,
                      rng=rng.bit_generator.state)
            last_ck = time.time()
    save_ckpt(ck, model=vae.state_dict(), opt=opt.state_dict(), step=step, seconds=time.time() - t0,
              rng=rng.bit_generator.state)
    log(f"decoder: done, {step} steps in {(time.time() - t0) / 60:.1f} min")


# ------------------------------------------------------------------------------------------
# phase 3: transformer


def build_dit(base, patch):
    """The shipped transformer, or for ``patch`` != its own one rebuilt with ``patch_size`` [1, patch, patch]
    (see the module docstring: matching weights copied, patch embedding and output projection pooled)."""
    from diffusers import WanTransformer3DModel

    src = WanTransformer3DModel.from_pretrained(os.path.join(base, "transformer"), local_files_only=True)
    pt, P, _ = src.config.patch_size
    if patch == P:
        return src
    if pt != 1 or P % patch:
        raise ValueError(f"--patch {patch} must divide the shipped patch {P}")
    k, N, C = P // patch, patch, src.config.out_channels
    dit = WanTransformer3DModel.from_config({**src.config, "patch_size": [1, N, N]})
    sd = src.state_dict()
    new = {n: v for n, v in sd.items() if n in dit.state_dict() and dit.state_dict()[n].shape == v.shape}
    w = sd["patch_embedding.weight"]  # [D, C, 1, P, P] -> sum over k x k sub-blocks
    new["patch_embedding.weight"] = w.reshape(*w.shape[:3], N, k, N, k).sum((4, 6))
    new["proj_out.weight"] = sd["proj_out.weight"].reshape(N, k, N, k, C, -1).mean((1, 3)).reshape(N * N * C, -1)
    new["proj_out.bias"] = sd["proj_out.bias"].reshape(N, k, N, k, C).mean((1, 3)).reshape(-1)
    dit.load_state_dict(new)  # strict: every parameter accounted for
    log(f"dit: patch [1, {N}, {N}] from the shipped [1, {P}, {P}] ({len(new)} tensors)")
    return dit


def train_dit(a):
    c = torch.load(os.path.join(a.work, "cache.pt"), weights_only=False)
    x0_all, emb, cap_idx = c["x0"], c["emb"], c["cap_idx"]
    empty = len(c["captions"]) - 1
    if a.max_seq < emb.shape[1]:  # the pipeline pads with zeros: cut only padding
        if emb[:, a.max_seq:].abs().amax() > 0:
            raise SystemExit(f"--max-seq {a.max_seq} would cut caption tokens: a caption is longer")
        emb = emb[:, :a.max_seq].contiguous()
        log(f"dit: text sequences of {a.max_seq} tokens (generate with max_sequence_length={a.max_seq})")
    dit = build_dit(a.base, a.patch)
    weight = None
    if a.dit_fg_weight > 0:
        if "fg" not in c:
            raise SystemExit("--dit-fg-weight needs a cache with foreground masks: run the cache phase again")
        weight = 1.0 + a.dit_fg_weight * c["fg"].float()
        log(f"dit: foreground latents weighted {1 + a.dit_fg_weight:g}x ({c['fg'].float().mean().item():.1%} of them)")
    fit_dit(dit, x0_all, emb, cap_idx, empty, a, warmup=200, weight=weight)


# ------------------------------------------------------------------------------------------
# phase 4: export


def export(a):
    from diffusers import WanPipeline
    from transformers import PreTrainedTokenizerFast, UMT5EncoderModel

    pipe = WanPipeline.from_pretrained(a.base, local_files_only=True)
    pipe.tokenizer = PreTrainedTokenizerFast.from_pretrained(os.path.join(a.work, "tokenizer"))
    pipe.text_encoder = UMT5EncoderModel.from_pretrained(os.path.join(a.work, "text_encoder")).eval()
    info = {"base": "toy_world (shipped)", "seed": a.seed, "num_clips": a.num_clips, "unlawful_frac": a.unlawful_frac,
            "old_frac": a.old_frac, "old_fall_frac": a.old_fall_frac}
    st = load_work_vae(a, pipe.vae)
    if st is not None:
        c = torch.load(os.path.join(a.work, "cache.pt"), weights_only=False)
        pipe.vae.register_to_config(latents_mean=c["latents_mean"], latents_std=c["latents_std"])
        info.update(vae_steps=st["step"], vae_minutes=round(st["seconds"] / 60, 1))
    dk = os.path.join(a.work, "decoder.pt")
    if os.path.exists(dk):
        st = torch.load(dk, weights_only=False)
        pipe.vae.load_state_dict(st["model"])
        info.update(decoder_steps=st["step"], decoder_minutes=round(st["seconds"] / 60, 1))
    st = torch.load(os.path.join(a.work, "dit.pt"), weights_only=False)
    if a.patch != pipe.transformer.config.patch_size[1]:
        pipe.transformer = build_dit(a.base, a.patch)
    pipe.transformer.load_state_dict(st["ema"])
    info.update(dit_steps=st["step"], dit_minutes=round(st["seconds"] / 60, 1), ema=1, args=vars(a),
                max_sequence_length=a.max_seq)
    save_world(pipe, a.export, info)


def main(argv=None):
    from visionmoe.video.models.toy_world import TOY_WORLD_PATH

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", default="all", choices=["vae", "cache", "decoder", "dit", "export", "all"])
    p.add_argument("--base", default=str(TOY_WORLD_PATH), help="the toy world to fine-tune (a WanPipeline folder)")
    p.add_argument("--work", default="out/pila_deficit/train")
    p.add_argument("--export", default="out/pila_deficit/world")
    p.add_argument("--seed", type=int, default=49)
    p.add_argument("--num-clips", type=int, default=1600)
    p.add_argument("--unlawful-frac", type=float, default=0.65, help="share of unlawful clips among law_variants clips")
    p.add_argument("--old-frac", type=float, default=0.2, help="share of the old free-fall/bounce clips")
    p.add_argument("--old-fall-frac", type=float, default=0.75, help="share of free fall among the old clips")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--vae-minutes", type=float, default=0, help="the vae phase's budget (0: keep the shipped VAE)")
    p.add_argument("--vae-steps", type=int, default=10**9)
    p.add_argument("--vae-batch", type=int, default=4)
    p.add_argument("--vae-frames", type=int, default=17, help="frames per sample, from frame 0")
    p.add_argument("--vae-crop", type=int, default=32)
    p.add_argument("--vae-lr", type=float, default=1e-3)
    p.add_argument("--kl-weight", type=float, default=1e-6)
    p.add_argument("--dec-minutes", type=float, default=20)
    p.add_argument("--dec-steps", type=int, default=10**9)
    p.add_argument("--dec-batch", type=int, default=2)
    p.add_argument("--dec-lr", type=float, default=5e-4)
    p.add_argument("--fg-weight", type=float, default=10.0)
    p.add_argument("--dit-minutes", type=float, default=55)
    p.add_argument("--dit-steps", type=int, default=10**9)
    p.add_argument("--dit-batch", type=int, default=32)
    p.add_argument("--patch", type=int, default=4, choices=(1, 2, 4),
                   help="the transformer's spatial patch (dit, export); 4 = the shipped one")
    p.add_argument("--dit-fg-weight", type=float, default=0.0,
                   help="extra weight of foreground latents in the flow loss (0: plain MSE)")
    p.add_argument("--dit-lr", type=float, default=4e-4)
    p.add_argument("--max-seq", type=int, default=MAX_SEQ,
                   help="text tokens the transformer sees (the cache's zero padding cut to this many); the "
                        "pipeline must then be called with the same max_sequence_length (eval_deficit.py reads "
                        "it from training_info.json)")
    p.add_argument("--shift", type=float, default=3.0)
    p.add_argument("--high-noise-frac", type=float, default=0.5)
    p.add_argument("--high-noise-min", type=float, default=0.85)
    a = p.parse_args(argv)
    if a.phase == "vae" and a.vae_minutes <= 0:
        p.error("--phase vae needs a budget: --vae-minutes M (M > 0)")
    torch.set_num_threads(a.threads)
    os.makedirs(a.work, exist_ok=True)
    with open(os.path.join(a.work, f"args_{a.phase}.json"), "w") as fh:
        json.dump(vars(a), fh, indent=1)
    if a.phase == "vae" or (a.phase == "all" and a.vae_minutes > 0):
        train_vae(a)
    if a.phase in ("cache", "all"):
        build_cache(a)
    if a.phase in ("decoder", "all"):
        train_decoder(a)
    if a.phase in ("dit", "all"):
        train_dit(a)
    if a.phase in ("export", "all"):
        export(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
